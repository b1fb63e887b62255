"""train.early_stopping on a benchmark score (issue 38): the results of the run's evaluations
land in `<run>/benchmarks/step-N.json` while training goes on (worker/benchqueue.py queued them),
so the trainer asks at its agreement points (StopFlags.due: about once a second, at most every
100 steps), not at its evaluations. Rank 0 reads the landed results (only files it has not read
yet are parsed) and `benchbest.verdict` counts, in step order, the results since the last that
improved by more than min_delta; rank 0 broadcasts the stop reason over the trainer's gloo group,
so every rank stops at the same step. A result that lands late counts when it lands; results of
earlier attempts count too (the verdict is of the run, not of this attempt).
"""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist

from ..core import benchbest, benchresults
from ..core.runfolder import RunFolder
from ..core.spec import JobSpec
from ..core.spec.benchmetric import parse


class BenchStop:
    """`check` on every rank at the same step boundaries; `run` is given on rank 0 only."""

    def __init__(self, spec: JobSpec, run: RunFolder | None, group: Any):
        self.stop = spec.train.early_stopping
        self.metric = parse("train.early_stopping.metric", self.stop.metric)
        self.run, self.group = run, group
        self.read: dict[str, tuple[int, dict[str, Any]]] = {}  # file name -> (mtime_ns, its row)

    def _rows(self) -> list[dict[str, Any]]:
        """The landed result rows; a file is parsed again only when it changed (a rerun)."""
        assert self.run is not None
        folder = benchresults.results_dir(self.run)
        try:
            entries = {e.name: e.stat().st_mtime_ns for e in os.scandir(folder) if e.name.endswith(".json")}
        except OSError:
            return []
        for name, mtime in entries.items():
            if self.read.get(name, (None,))[0] != mtime:
                row = benchresults.file_row(folder / name)
                if row is not None:
                    self.read[name] = (mtime, row)
        return [row for _, row in self.read.values()]

    def reason(self, step: int) -> str:
        """Rank 0: why training stops at `step`, or ''."""
        found = benchbest.verdict(self._rows(), self.metric, self.stop.min_delta)
        if found is None or found.stale < self.stop.patience:
            return ""
        return (
            f"early stopping at step {step}: {self.metric.name} has not improved by more than "
            f"{self.stop.min_delta:g} on its best ({found.value:.4g} at step {found.step}) for {self.stop.patience} "
            f"benchmark result(s), {found.results} landed"
        )

    def check(self, step: int) -> str:
        """The stop reason, the same on every rank (rank 0's, broadcast)."""
        box = [self.reason(step) if self.run is not None else ""]
        if dist.is_initialized():
            dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]
