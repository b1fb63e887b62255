"""Experiment trackers on rank 0: TensorBoard, Weights & Biases, MLflow (`[log] trackers`).

One tracker run per clusterfsdp run, whatever happens to it: every attempt (a Slurm requeue, a
local restart, `clusterfsdp resume` on another node count) logs into the same one; how each
tracker does it is said in its module (`tbtracker`, `wandbtracker`, `mlflowtracker`), what they
share in `trackerbase`. `TRACKERS` names them: a tracker is one module and one entry there (and
its name in the schema's `Tracker`, which a test keeps equal to these names). A name without an
entry is refused with one line, never taken for another tracker.

Each package is imported only when its tracker is configured, on rank 0. A tracker that fails
while training is switched off with one line in the log: the training run is worth more than
its plots. One that cannot start fails the attempt before training, with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import spec as specmod
from ..core.evalsamples import EvalSample
from ..core.records import RankOutcome
from ..core.runfolder import RunFolder
from .mlflowtracker import MLflow
from .tbtracker import TensorBoard
from .trackerbase import Tracker, TrackerError, hyperparameters, numeric
from .wandbtracker import WandB

__all__ = ["TRACKERS", "MLflow", "TensorBoard", "Tracker", "TrackerError", "Trackers", "WandB", "hyperparameters"]

# Each tracker by its name in `[log] trackers`: what starts it (run folder, job spec, attempt).
TRACKERS: dict[str, Callable[[RunFolder, specmod.JobSpec, int], Tracker]] = {
    "tensorboard": TensorBoard,
    "wandb": WandB,
    "mlflow": MLflow,
}


class Trackers:
    """The configured trackers as one sink; rank 0 only."""

    def __init__(self, trackers: list[Tracker], log: Callable[[str], None]):
        self.trackers, self.log_line = trackers, log

    @classmethod
    def open(cls, run: RunFolder, spec: specmod.JobSpec, attempt: int, log: Callable[[str], None]) -> Trackers:
        """Start every tracker of `[log] trackers` (TrackerError naming the first that cannot)."""
        opened: list[Tracker] = []
        for name in spec.log.trackers:
            start = TRACKERS.get(name)
            if start is None:  # the schema's Literal refuses it first; a name added there alone lands here
                raise TrackerError(f"log.trackers: no tracker is named {name!r} (known: {', '.join(TRACKERS)})")
            opened.append(start(run, spec, attempt))
        return cls(opened, log)

    def _each(self, what: str, call: Callable[[Tracker], None]) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as e:
                self.trackers.remove(tracker)
                self.log_line(f"tracker {tracker.name}: {what} failed, switched off for this attempt: {e}")

    def begin(self, step: int) -> None:
        self._each("start", lambda t: t.begin(step))

    def log(self, row: dict[str, Any]) -> None:
        values = numeric(row)
        self._each("logging", lambda t: t.log(values, row["step"]))

    def samples(self, samples: list[EvalSample]) -> None:
        self._each("samples", lambda t: t.samples(samples))

    def finish(self, outcome: RankOutcome) -> None:
        self._each("closing", lambda t: t.finish(outcome))
