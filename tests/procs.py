"""Launch real worker processes on this machine with torchrun-style environment variables."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from clusterfsdp.control import runfolder
from clusterfsdp.control import spec as S
from clusterfsdp.control.records import Executor

CORPUS = Path(__file__).resolve().parents[1] / "jobs" / "data" / "corpus.txt"


def tiny_job_toml(name: str, seed: int, steps: int, fsdp: str = "", tail: str = "") -> str:
    """The job.toml text the multi-process tests share: llama-tiny on the shipped corpus in fp32
    (so runs compare bitwise), loss logged every step. `fsdp` adds lines to [fsdp]; `tail` adds
    tables. (conftest's `tiny_job` fixture is the other starting point: jobs/tiny-cpu.toml.)"""
    return f"""
[job]
name = "{name}"
seed = {seed}
[model]
preset = "llama-tiny"
[data]
source = "files"
paths = ["{CORPUS}"]
seq_len = 64
[train]
steps = {steps}
micro_batch_size = 2
lr = 3e-3
warmup = 2
log_every = 1
[fsdp]
mixed_precision = "fp32"
{fsdp}
{tail}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_run(job_text: str, run_root: Path, overrides: list[str] = ()) -> runfolder.RunFolder:
    spec = S.loads(job_text, [f"job.run_root={str(run_root)!r}", *overrides])
    return runfolder.create_run(spec, Executor.LOCAL)


def launch(argv: list[str], world: int, job_id: str = "t1", extra_env: dict | None = None) -> list[subprocess.Popen]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "CLUSTERFSDP_JOB_ID": job_id,
            "OMP_NUM_THREADS": "1",
            **(extra_env or {}),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    return procs


def wait(procs: list[subprocess.Popen], timeout: float = 600) -> list[tuple[int, str]]:
    return [(p.wait(timeout=timeout), p.stdout.read()) for p in procs]


def run_workers(run: runfolder.RunFolder, world: int, job_id: str = "t1") -> list[tuple[int, str]]:
    """All ranks of the worker on one run folder; asserts every rank exited 0."""
    out = wait(launch(["-m", "clusterfsdp.worker", str(run.path)], world, job_id))
    assert all(code == 0 for code, _ in out), "\n".join(text[-3000:] for _, text in out)
    return out


def losses(run: runfolder.RunFolder, job_id: str | None = None) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in run.metrics()}
