"""The budget clock of an incarnation (`slurm.max_gpu_hours`): what it may still use, written by the
batch script's `before` step (control/cost.py's `write_budget`, from Slurm's accounting) into
`<run>/budget.json` and read by the ranks, which stop at the next agreement once it is used. Apart
from cost.py so that a rank reads it without the accounting and listing machinery."""

from __future__ import annotations

import json

from .runfolder import RunFolder
from .value import value

BUDGET_FILE = "budget.json"


@value(frozen=True)
class Budget:
    """What an incarnation may still use (`left_s` GPU-seconds) on its `gpus` GPUs, counted from
    `since`; written by the batch script's `before` step, read by the workers at start. `sweep`:
    the id of the sweep whose points share the budget ('' for a run of its own)."""

    left_s: float
    gpus: float
    since: float
    limit_h: float
    sweep: str = ""

    def reached(self, now: float) -> bool:
        return self.gpus > 0 and (now - self.since) * self.gpus >= self.left_s

    def reason(self) -> str:
        if self.sweep:
            return (
                f"slurm.max_gpu_hours = {self.limit_h:g} of sweep {self.sweep} used up (what its points used, and "
                f"hold for their running and waiting attempts; {self.gpus:g} GPU(s) of this attempt)"
            )
        return f"slurm.max_gpu_hours = {self.limit_h:g} used up ({self.gpus:g} GPU(s) of this attempt)"


def read_budget(run: RunFolder) -> Budget | None:
    try:
        data = json.loads((run.path / BUDGET_FILE).read_text())
        return Budget(float(data["left_s"]), float(data["gpus"]), float(data["since"]), float(data["limit_h"]),
                      str(data.get("sweep", "")))  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None
