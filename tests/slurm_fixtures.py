"""pytest fixtures for tests that run against the local multi-node Slurm (slurm/devcluster.sh).

tests/conftest.py loads it for the whole suite (``pytest_plugins = ["slurm_fixtures"]``, with
tests/ on sys.path), so a test just asks for ``slurm_cluster``; import ``SlurmCluster`` from
here for type hints only (importing the fixture into a module would make a second instance).

``slurm_cluster`` is the cluster of the running test. Two halves of the Slurm tests may run in
parallel, each on its own devcluster: a test marked ``slurm(cluster="b")`` runs on the second
cluster, ``devcluster.sh`` with ``CFDC_PREFIX=$CFDC_TEST_SECOND_PREFIX`` (.ci/test sets it and
brings both clusters up), every other one on the default cluster. Without that variable every
Slurm test runs on the default cluster, as one group (so ``flock -o /tmp/devcluster.lock pytest
...`` stays all a developer needs). Each cluster is checked once per session with
``devcluster.sh status``; when it is not up it is brought up (and taken down again at the end of
the session, unless CFDC_KEEP=1). It never skips: no root, no packages or a daemon that will not
start is a test failure, with the script's output in the message. A Slurm test runs with
SLURM_CONF set to its cluster's, so every client it starts (clusterfsdp, sbatch, the jobs it
queues) talks to that cluster.

Every test that uses the cluster (marked ``slurm`` or asking for ``slurm_cluster``) also gets
``_slurm_test_jobs`` (autouse): whatever happens in the test (a failed assertion, its own
timeout), every job it queued is cancelled afterwards and the nodes are idle again before the
next test starts, so one broken test cannot hold the nodes and fail every later one. The test's
waits are bounded by its pytest timeout: ``time_left()`` is what remains of it, less what that
cleanup needs (``bounded(s)`` caps a wait), so a wait that runs out fails the test with the name
of what it waited for instead of pytest-timeout killing it mid-wait.
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import TypeVar

import pytest

from clusterfsdp.control import devcluster
from clusterfsdp.core.value import value

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "slurm" / "devcluster.sh"


@value(frozen=True)  # (a frozen value's subclass is a value: tests/test_value.py)
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
        """Poll predicate() (sleeping `interval`) until it returns something truthy, for at most
        `timeout` seconds or what the running test has left (`time_left`)."""
        timeout = bounded(timeout)
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
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
        """`devcluster.sh fault WHAT [NODE]` on this cluster: ctld-stop/ctld-start (a controller that
        is down), ctld-freeze/ctld-thaw (one that hangs), node-kill/node-start (a node that dies)."""
        argv = ["bash", str(SCRIPT), "fault", what, *([node] if node else [])]
        proc = subprocess.run(argv, env=self.script_env(), capture_output=True, text=True, timeout=180, check=False)
        if proc.returncode != 0:
            raise AssertionError(f"devcluster.sh fault {what} {node} exited {proc.returncode}: {proc.stderr}")

    def wait_sacct(self, job_id: int | str, prefix: str, timeout: float = 30) -> str:
        """Wait until the latest attempt's state in sacct starts with `prefix`; returns that state."""
        rows = self.wait_sacct_rows(job_id, lambda r: bool(r) and r[-1].startswith(prefix), f"state {prefix}", timeout)
        return rows[-1]


SECOND_PREFIX_VAR = "CFDC_TEST_SECOND_PREFIX"  # set (by .ci/test): the `slurm(cluster="b")` tests use that cluster


def second_prefix() -> str:
    """The CFDC_PREFIX of the second devcluster, or "" when the suite runs on the default one only."""
    return os.environ.get(SECOND_PREFIX_VAR, "")


def cluster_prefix(item: pytest.Item) -> str:
    """The CFDC_PREFIX of the cluster `item` runs on: the second cluster's for a test marked
    `slurm(cluster="b")` when there is one, else the default cluster's ("")."""
    marker = item.get_closest_marker("slurm")
    return second_prefix() if marker is not None and marker.kwargs.get("cluster") == "b" else ""


def _cluster_environ(prefix: str) -> dict[str, str]:
    """The environment devcluster.sh gets for the cluster: the default one honours a CFDC_STATE
    the developer set; the second one always has its own state folder."""
    return {k: v for k, v in os.environ.items() if not (prefix and k == "CFDC_STATE")} | {"CFDC_PREFIX": prefix}


def _script(command: str, prefix: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = _cluster_environ(prefix)
    argv = ["bash", str(SCRIPT), command]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)


class _Clusters:
    """The session's devclusters, by prefix: each one checked (and brought up if down) when a test
    first asks for it, and taken down at the end when this session brought it up."""

    def __init__(self) -> None:
        self.up: dict[str, SlurmCluster] = {}
        self.started: list[str] = []

    def get(self, prefix: str) -> SlurmCluster:
        if prefix not in self.up:
            status = _script("status", prefix, timeout=60)
            if status.returncode != 0:
                up = _script("up", prefix, timeout=300)
                assert up.returncode == 0, (
                    f"devcluster.sh up (CFDC_PREFIX={prefix!r}) failed (exit {up.returncode}); status said:\n"
                    f"{status.stdout}{status.stderr}\nup said:\n{up.stdout}\n{up.stderr}"
                )
                self.started.append(prefix)
            self.up[prefix] = SlurmCluster.from_state(devcluster.state_dir(_cluster_environ(prefix)))
        return self.up[prefix]


@pytest.fixture(scope="session")
def _slurm_clusters() -> Iterator[_Clusters]:
    assert os.geteuid() == 0, "the Slurm devcluster tests need root (namespaces); run as root"
    assert SCRIPT.is_file(), f"missing {SCRIPT}"
    clusters = _Clusters()
    try:
        yield clusters
    finally:
        if os.environ.get("CFDC_KEEP") != "1":
            for prefix in clusters.started:
                _script("down", prefix, timeout=120)


@pytest.fixture
def slurm_cluster(request: pytest.FixtureRequest, _slurm_clusters: _Clusters) -> SlurmCluster:
    """The devcluster the running test uses (cluster_prefix), up."""
    return _slurm_clusters.get(cluster_prefix(request.node))


# ---------------------------------------------------------------- each Slurm test's jobs and time budget
CLEANUP_S = 60.0  # the cleanup below: scancel, KillWait (2 s here), the nodes idle again; room to spare
_STARTED = pytest.StashKey[float]()
_deadline: float | None = None  # when the running Slurm test's waits must have ended (monotonic)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """pytest-timeout counts from here (setup, call and teardown): remember when."""
    item.stash[_STARTED] = time.monotonic()


def time_left() -> float:
    """Seconds the running Slurm test may still wait (inf outside one)."""
    return math.inf if _deadline is None else max(0.0, _deadline - time.monotonic())


def bounded(timeout: float) -> float:
    """A wait of `timeout` seconds cut to what the running test has left."""
    return min(timeout, time_left())


def _test_timeout(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    value = (marker.args[0] if marker.args else marker.kwargs.get("timeout")) if marker else None
    if value is None:  # pytest-timeout's --timeout, else its ini setting
        value = item.config.getoption("timeout", None) or item.config.getini("timeout")
    return float(value) if value else math.inf


def queued_jobs(cluster: SlurmCluster) -> set[str]:
    """Ids of every job in the queue (pending, running, completing). Retried for a while: a test
    that failed during a controller fault may leave slurmctld restarting."""
    deadline = time.monotonic() + 60
    while True:
        proc = cluster.run(["squeue", "-h", "-o", "%i"], check=False)
        if proc.returncode == 0:
            return set(proc.stdout.split())
        if time.monotonic() > deadline:
            raise AssertionError(f"squeue failed for 60 s: {proc.stderr.strip()}")
        time.sleep(1)


def node_states(cluster: SlurmCluster) -> dict[str, str]:
    proc = cluster.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
    return dict(line.split(None, 1) for line in proc.stdout.splitlines() if line.strip())


def cancel_jobs_since(cluster: SlurmCluster, before: set[str], timeout: float = CLEANUP_S - 10) -> None:
    """scancel every queued job that was not in `before` until none has appeared for 3 s (a
    batch script or a rank may submit a next attempt while it is being cancelled), then wait for
    every node to be idle. A test that left nothing queued costs one squeue and one sinfo."""
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    cancelled: set[str] = set()
    while True:
        new = queued_jobs(cluster) - before
        now = time.monotonic()
        if new:
            cluster.run(["scancel", *sorted(new)], check=False)
            cancelled |= new
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        states = node_states(cluster)
        settled = {"idle"} if not before else {"idle", "mixed", "allocated"}  # jobs from before may run
        # Nothing of the test's is queued and nothing was cancelled: no job is left that could
        # submit another (a COMPLETING one is still queued), so no quiet period is needed.
        quiet_for = 0 if not cancelled else 3
        if quiet_since is not None and now - quiet_since >= quiet_for and set(states.values()) <= settled:
            return
        if now > deadline:
            raise AssertionError(
                f"after the test, its jobs {sorted(cancelled)} were cancelled but after {timeout:.0f} s "
                f"jobs {sorted(new)} are still queued and the nodes are {states}"
            )
        time.sleep(0.5)


@pytest.fixture(autouse=True)
def _slurm_test_jobs(request: pytest.FixtureRequest) -> Iterator[None]:
    """For a test that uses the devcluster: point SLURM_CONF at its cluster, bound its waits by
    its timeout, and cancel whatever it queued when it ends, however it ends (the jobs it
    queued: those not in the queue before)."""
    global _deadline
    item = request.node
    if not (item.get_closest_marker("slurm") or "slurm_cluster" in request.fixturenames):
        yield
        return
    request.getfixturevalue("_no_inherited_slurm")  # conftest.py's clearing of SLURM_* first, then ours
    cluster: SlurmCluster = request.getfixturevalue("slurm_cluster")
    request.getfixturevalue("monkeypatch").setenv("SLURM_CONF", str(cluster.slurm_conf))
    before = queued_jobs(cluster)
    _deadline = item.stash.get(_STARTED, time.monotonic()) + _test_timeout(item) - CLEANUP_S
    try:
        yield
    finally:
        _deadline = None
        cancel_jobs_since(cluster, before)
