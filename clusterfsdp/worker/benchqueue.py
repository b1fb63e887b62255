"""Benchmarks queued by the run itself (issue 38): on rank 0, when a checkpoint is complete, one
evaluation per `benchmarks.every_checkpoints` saves, run as `clusterfsdp bench RUN --step N --if-missing`
(control/benchrun.py) in a background process of its own session (local launches): training never
waits for it, and it outlives the attempt. The checkpoint is held from keep_last (ckptfolder.hold) until the
evaluation has exported it. Its output goes to <run>/benchmarks/step-N.log; a failure is
benchmarks/step-N.failed.json (`doctor`), never the training run's.

Under Slurm a process left behind would be killed with the job's allocation: there each
evaluation is a Slurm job of its own (control/benchjob.py) on benchmarks.partition, queued by a
short process of rank 0's (`python -m clusterfsdp.control.benchjob`: the run service stands above
the worker) that training never waits for: its outcome is read at the next checkpoint, and the
ones still queueing when training ends are waited for then (`settle`), before the job step ends
and takes them with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

from ..core import benchresults, ckptfolder
from ..core.runfolder import RunFolder
from ..core.slurmcli import CLUSTER_ENV
from ..core.spec import JobSpec

# The launcher's variables: an evaluation is one process of its own, which lm-eval (accelerate)
# and the export would otherwise take for a rank of this attempt's process group.
_DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
_DIST_PREFIXES = ("SUBMITIT_", "SLURM_", "TORCHELASTIC_")
SETTLE_S = 120.0  # the longest a queueing process is waited for at the end of training (slurmcli retries)


def _plain_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k in CLUSTER_ENV or (k not in _DIST_VARS and not k.startswith(_DIST_PREFIXES))
    }


class BenchQueue:
    """The Checkpointer's `on_complete` on rank 0 of a run with [benchmarks] tasks."""

    def __init__(self, run: RunFolder, spec: JobSpec, launcher: str, log: Callable[[str], None]):
        self.run, self.spec, self.launcher, self.log = run, spec, launcher, log
        self.saves = 0
        self.started: list[subprocess.Popen] = []
        self.queueing: list[tuple[int, subprocess.Popen]] = []  # Slurm: (step, its benchjob process)

    def __call__(self, step: int) -> None:
        """Never raises: an evaluation that cannot start is a log line, not a failed run."""
        self.saves += 1
        self.started = [p for p in self.started if p.poll() is None]  # (reaps the ended ones)
        self._reap(wait=False)
        if self.saves % self.spec.benchmarks.every_checkpoints:
            return
        root = self.run.checkpoints_dir(self.spec)
        ckptfolder.hold(root, step)
        try:
            where = self._queue(step) if self.launcher == "slurm" else self._start(step)
        except Exception as e:  # (OSError, a full disk): the run goes on without it
            self._not_queued(step, str(e))
            return
        self.log(f"[benchmarks]: evaluating step {step}: {where}")

    def _queue(self, step: int) -> str:
        """A Slurm job of its own (control/benchjob.py, which the worker calls across a process
        boundary: the run service stands above it), queued by a process training does not wait
        for (`_reap` reads how it went)."""
        argv = [sys.executable, "-m", "clusterfsdp.control.benchjob", str(self.run.path), str(step)]
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_plain_env()
        )
        self.queueing.append((step, proc))
        return "queueing its Slurm job"

    def settle(self, timeout_s: float = SETTLE_S) -> None:
        """Wait for the Slurm jobs still being queued (the end of training: the job step's end
        would kill their sbatch), each at most `timeout_s`. Never raises."""
        self._reap(wait=True, timeout_s=timeout_s)

    def _reap(self, *, wait: bool, timeout_s: float = SETTLE_S) -> None:
        """Log each queueing process that ended (with `wait`, every one): the job it queued, or
        the checkpoint released and the failure recorded."""
        still = []
        for step, proc in self.queueing:
            if not wait and proc.poll() is None:
                still.append((step, proc))
                continue
            try:
                out, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                err += f"\nno job queued after {timeout_s:.0f} s"
            lines = [line for line in out.splitlines() if line.strip()]
            if proc.returncode == 0 and lines:
                partition = self.spec.benchmarks.partition or self.spec.slurm.partition or "the default partition"
                self.log(f"[benchmarks]: evaluating step {step}: job {lines[-1].strip()} on {partition}")
                continue
            errors = [line for line in err.splitlines() if line.strip()]
            self._not_queued(step, errors[-1].removeprefix("error: ") if errors else f"exit status {proc.returncode}")
        self.queueing = still

    def _not_queued(self, step: int, why: str) -> None:
        ckptfolder.release(self.run.checkpoints_dir(self.spec), step)
        line = " ".join(why.split())[:300]
        benchresults.record_failure(self.run, step, f"not queued: {line}")
        self.log(f"[benchmarks]: the evaluation of step {step} was not queued: {line}")

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
