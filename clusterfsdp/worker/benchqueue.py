"""Benchmarks queued by the run itself (issue 38): on rank 0, when a checkpoint is complete, one
evaluation per `benchmarks.every_checkpoints` saves, run as `clusterfsdp bench RUN --step N`
(control/bench.py) in a background process of its own session: training never waits for it,
and it outlives the attempt. The checkpoint is held from keep_last (ckptfolder.hold) until the
evaluation has exported it. Its output goes to <run>/benchmarks/step-N.log; a failure is
benchmarks/step-N.failed.json (`doctor`), never the training run's.

Local launches only, for now: under Slurm a process left behind is killed with the job's
allocation, so there each save logs that `clusterfsdp bench RUN --all` evaluates them (an
evaluation job per checkpoint on benchmarks.partition is the part still to come).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

from ..control import benchresults, ckptfolder
from ..control.runfolder import RunFolder
from ..control.spec import JobSpec

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
        self.told = False

    def __call__(self, step: int) -> None:
        """Never raises: an evaluation that cannot start is a log line, not a failed run."""
        self.saves += 1
        self.started = [p for p in self.started if p.poll() is None]  # (reaps the ended ones)
        if self.saves % self.spec.benchmarks.every_checkpoints:
            return
        if self.launcher == "slurm":
            if not self.told:
                self.log("[benchmarks]: evaluations after each save run with local launches only so far; "
                         f"`clusterfsdp bench {self.run.path} --all` evaluates this run's checkpoints")  # fmt: skip
                self.told = True
            return
        root = self.run.checkpoints_dir(self.spec)
        try:
            self.started.append(self._start(root, step))
        except Exception as e:  # (OSError, a full disk): the run goes on without this evaluation
            ckptfolder.release(root, step)
            self.log(f"[benchmarks]: the evaluation of step {step} did not start: {e}")
            return
        self.log(f"[benchmarks]: evaluating step {step} in the background (benchmarks/step-{step}.log)")

    def _start(self, root, step: int) -> subprocess.Popen:
        ckptfolder.hold(root, step)
        folder = benchresults.results_dir(self.run)
        folder.mkdir(exist_ok=True)
        with open(folder / f"step-{step}.log", "ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "clusterfsdp.cli", "bench", str(self.run.path), "--step", str(step)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # not in the attempt's process group: a stop or cancel leaves it
                env=_plain_env(),
            )
