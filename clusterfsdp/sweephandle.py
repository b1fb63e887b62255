"""`clusterfsdp.sweep(...)`: a sweep from Python (a notebook), as a handle over the sweep service
(`control.sweep`): its points' status, a pandas DataFrame of their final and best metrics
(`frame()`, pandas imported only then: the `frames` extra), cancel and resume."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .control.sweep import Sweep
from .control.sweepfolder import PointStatus

if TYPE_CHECKING:
    # pandas (optional) only when a frame is asked for
    import pandas


@dataclass(frozen=True)
class SweepHandle:
    """One sweep: `id`, `path`, `points()` (status rows), `frame()`, `cancel()`, `resume()`."""

    sweep: Sweep

    @property
    def id(self) -> str:
        return self.sweep.id

    @property
    def path(self) -> Path:
        return self.sweep.path

    def __repr__(self) -> str:
        return f"SweepHandle({self.id!r}, {len(self.sweep.record().points)} points, {str(self.path)!r})"

    def points(self) -> list[PointStatus]:
        """Every point with its run's status (one Slurm query for all)."""
        return self.sweep.statuses()[0]

    def frame(self) -> pandas.DataFrame:
        """One row per point, indexed by point: its varied values, run id, state, steps, and the
        final and best `loss` and `eval_loss` (with the step of the best eval loss), from the
        trajectory each run went on with (metrics.jsonl, requeues counted once)."""
        try:
            # pandas (optional) only when a frame is asked for
            import pandas
        except ImportError:
            raise ImportError("SweepHandle.frame needs pandas: pip install 'clusterfsdp[frames]'") from None
        return pandas.DataFrame([_row(p) for p in self.points()]).set_index("point")

    def cancel(self) -> list[str]:
        return self.sweep.cancel()

    def resume(self, executor: str | None = None, force: bool = False) -> list[str]:
        return self.sweep.resume(executor=executor, force=force)  # type: ignore[arg-type]


def _row(p: PointStatus) -> dict[str, Any]:
    rows = p.status.run.metrics(latest=True)
    losses = [(r["step"], r["loss"]) for r in rows if _finite(r.get("loss"))]
    evals = [(r["step"], r["eval_loss"]) for r in rows if _finite(r.get("eval_loss"))]
    best_eval = min(evals, key=lambda e: e[1]) if evals else None
    return {
        "point": p.point.index,
        **p.point.values,
        "run_id": p.point.run_id,
        "state": str(p.status.state),
        "step": p.status.step,
        "steps": p.status.steps,
        "final_loss": losses[-1][1] if losses else None,
        "best_loss": min(v for _, v in losses) if losses else None,
        "final_eval_loss": evals[-1][1] if evals else None,
        "best_eval_loss": best_eval[1] if best_eval else None,
        "best_eval_step": best_eval[0] if best_eval else None,
    }


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
