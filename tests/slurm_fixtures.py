"""pytest fixtures for tests that run against the local multi-node Slurm (slurm/devcluster.sh).

tests/conftest.py loads it for the whole suite (``pytest_plugins = ["slurm_fixtures"]``, with
tests/ on sys.path), so a test just asks for ``slurm_cluster``; import ``SlurmCluster`` from
here for type hints only (importing the fixture into a module would make a second instance).

``slurm_cluster`` (session scope) checks ``devcluster.sh status``; when the cluster is not
up it brings it up (and takes it down again at the end of the session, unless
CFDC_KEEP=1). It never skips: no root, no packages or a daemon that will not start is a
test failure, with the script's output in the message.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TypeVar

import pytest

from clusterfsdp.control import devcluster

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "slurm" / "devcluster.sh"


@dataclass(frozen=True)
class SlurmCluster(devcluster.DevClusterInfo):
    """The running devcluster (the facts its env.sh gives), plus helpers to drive it."""

    @classmethod
    def from_state(cls, state: Path) -> SlurmCluster:
        info = devcluster.read_info(state)
        if info is None:
            raise AssertionError(f"no devcluster env.sh under {state}")
        return cls(**{f.name: getattr(info, f.name) for f in fields(info)})

    def run(self, argv: Sequence[str], *, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command in the login (root) namespace with SLURM_CONF set."""
        proc = subprocess.run(list(argv), env=self.env(), capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{shlex.join(argv)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def sbatch(self, args: Sequence[str], *, timeout: float = 60) -> int:
        """sbatch --parsable ARGS; returns the job id."""
        out = self.run(["sbatch", "--parsable", *args], timeout=timeout).stdout.strip()
        return int(out.split(";")[0])

    def squeue_state(self, job_id: int) -> str:
        """The job's state in squeue (PENDING, RUNNING, ...), or "" once it left the queue."""
        proc = self.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], check=False)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def sacct_attempts(self, job_id: int | str) -> list[str]:
        """The state of each attempt of the job in sacct, oldest first: one row per attempt, so
        a requeued job shows e.g. ["REQUEUED", "COMPLETED"]; [] before slurmdbd knows the job."""
        argv = ["sacct", "-n", "-X", "-P", "--duplicates", "-j", str(job_id), "-o", "State"]
        proc = self.run(argv, check=False)
        return [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]

    def wait_for(self, what: str, predicate: Callable[[], T], timeout: float = 30, interval: float = 0.1) -> T:
        """Poll predicate() (sleeping `interval`) until it returns something truthy."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(interval)

    def wait_sacct_rows(
        self, job_id: int | str, want: Callable[[list[str]], bool], what: str, timeout: float = 30
    ) -> list[str]:
        """Wait until want(sacct_attempts(job_id)) and return those rows. slurmdbd records states
        asynchronously, so sacct lags squeue and the run folder; the error lists the rows seen."""
        seen: list[tuple[str, ...]] = []

        def check() -> list[str]:
            rows = self.sacct_attempts(job_id)
            seen.append(tuple(rows))
            return rows if want(rows) else []

        try:
            return self.wait_for(f"sacct: {what} (job {job_id})", check, timeout=timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; rows seen: {list(dict.fromkeys(seen))}") from None

    def fault(self, what: str, node: str = "") -> None:
        """`devcluster.sh fault WHAT [NODE]`: ctld-stop/ctld-start (a controller that is down),
        ctld-freeze/ctld-thaw (one that hangs), node-kill/node-start (a node that dies)."""
        argv = ["bash", str(SCRIPT), "fault", what, *([node] if node else [])]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
        if proc.returncode != 0:
            raise AssertionError(f"devcluster.sh fault {what} {node} exited {proc.returncode}: {proc.stderr}")

    def wait_sacct(self, job_id: int | str, prefix: str, timeout: float = 30) -> str:
        """Wait until the latest attempt's state in sacct starts with `prefix`; returns that state."""
        rows = self.wait_sacct_rows(job_id, lambda r: bool(r) and r[-1].startswith(prefix), f"state {prefix}", timeout)
        return rows[-1]


def _script(command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), command], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    assert os.geteuid() == 0, "the Slurm devcluster tests need root (namespaces); run as root"
    assert SCRIPT.is_file(), f"missing {SCRIPT}"
    status = _script("status", timeout=60)
    started = False
    if status.returncode != 0:
        up = _script("up", timeout=300)
        assert up.returncode == 0, (
            f"devcluster.sh up failed (exit {up.returncode}); status said:\n{status.stdout}{status.stderr}\n"
            f"up said:\n{up.stdout}\n{up.stderr}"
        )
        started = True
    try:
        yield SlurmCluster.from_state(devcluster.state_dir())
    finally:
        if started and os.environ.get("CFDC_KEEP") != "1":
            _script("down", timeout=120)
