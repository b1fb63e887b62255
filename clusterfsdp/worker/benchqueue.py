"""Benchmarks queued by the run itself (issue 38): on rank 0, when a checkpoint is complete, one
evaluation per `benchmarks.every_checkpoints` saves, run as `clusterfsdp bench RUN --step N --if-missing`
(control/bench.py) in a background process of its own session (local launches): training never
waits for it, and it outlives the attempt. The checkpoint is held from keep_last (ckptfolder.hold) until the
evaluation has exported it. Its output goes to <run>/benchmarks/step-N.log; a failure is
benchmarks/step-N.failed.json (`doctor`), never the training run's.

Under Slurm a process left behind would be killed with the job's allocation: there each
evaluation is a Slurm job of its own (control/benchjob.py) on benchmarks.partition, queued with
sbatch from rank 0 (held checkpoint, then sbatch: a few tenths of a second of the step).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

from ..core import benchresults, ckptfolder
from ..core.runfolder import RunFolder
from ..core.spec import JobSpec

# The launcher's variables: an evaluation is one process of its own, which lm-eval (accelerate)
# and the export would otherwise take for a rank of this attempt's process group.
_DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
_DIST_PREFIXES = ("SUBMITIT_", "SLURM_", "TORCHELASTIC_")


def _plain_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _DIST_VARS and not k.startswith(_DIST_PREFIXES)}


class BenchQueue:
    """The Checkpointer's `on_complete` on rank 0 of a run with [benchmarks] tasks."""

    def __init__(self, run: RunFolder, spec: JobSpec, launcher: str, log: Callable[[str], None]):
        self.run, self.spec, self.launcher, self.log = run, spec, launcher, log
        self.saves = 0
        self.started: list[subprocess.Popen] = []

    def __call__(self, step: int) -> None:
        """Never raises: an evaluation that cannot start is a log line, not a failed run."""
        self.saves += 1
        self.started = [p for p in self.started if p.poll() is None]  # (reaps the ended ones)
        if self.saves % self.spec.benchmarks.every_checkpoints:
            return
        root = self.run.checkpoints_dir(self.spec)
        ckptfolder.hold(root, step)
        try:
            where = self._queue(step) if self.launcher == "slurm" else self._start(step)
        except Exception as e:  # (sbatch refused, OSError, a full disk): the run goes on without it
            ckptfolder.release(root, step)
            line = " ".join(str(e).split())[:300]
            benchresults.record_failure(self.run, step, f"not queued: {line}")
            self.log(f"[benchmarks]: the evaluation of step {step} was not queued: {line}")
            return
        self.log(f"[benchmarks]: evaluating step {step}: {where}")

    def _queue(self, step: int) -> str:
        """A Slurm job of its own (control/benchjob.py, which the worker calls across a process
        boundary: the run service stands above it): a process left behind here would die with
        this job's allocation."""
        argv = [sys.executable, "-m", "clusterfsdp.control.benchjob", str(self.run.path), str(step)]
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=_plain_env())
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            raise RuntimeError(lines[-1].removeprefix("error: ") if lines else f"exit status {done.returncode}")
        job_id = done.stdout.strip().splitlines()[-1]
        partition = self.spec.benchmarks.partition or self.spec.slurm.partition or "the default partition"
        return f"job {job_id} on {partition}"

    def _start(self, step: int) -> str:
        """A background process of its own session: not in the attempt's process group, so a
        stop or cancel of the attempt leaves it."""
        folder = benchresults.results_dir(self.run)
        folder.mkdir(exist_ok=True)
        with open(folder / f"step-{step}.log", "ab") as out:
            self.started.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "clusterfsdp.cli",
                        "bench",
                        str(self.run.path),
                        "--step",
                        str(step),
                        "--if-missing",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=_plain_env(),
                )
            )
        return f"in the background (benchmarks/step-{step}.log)"
