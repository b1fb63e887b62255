"""checkpoint.keep_best and train.early_stopping on a benchmark score (issue 38): decided from
the results that have landed in `<run>/benchmarks/step-N.json`, which arrive after training
moved on, one evaluation at a time and not always in step order (local evaluations run side by
side).

keep_best: each evaluation, once its result is written, records the best step among the landed
results of the score in `.bench-best.json` in the checkpoint folder (`land`), under the run's
lock (evaluations land side by side), and only then releases the checkpoint's hold
(ckptfolder.hold): a checkpoint is never pruned before its result is known, the best one stays
(ckptfolder.beyond_keep), and the previous best becomes prunable at the next save. `export
--best` exports the recorded step.

Early stopping: the trainer's rank 0 reads the landed results at its agreement points
(worker/benchstop.py) and `verdict` counts, in step order, the results since the last one that
improved by more than min_delta; a result that lands late counts when it lands.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from . import ckptfolder, fileio, lock
from .benchresults import rows
from .runfolder import RunFolder
from .spec import JobSpec
from .spec.benchmetric import BenchMetric, parse
from .value import value

LOCK_TIMEOUT_S = 300.0  # other holders of the run's lock (resume, cancel) hold it for seconds


@value(frozen=True)
class BestScore:
    """The landed results of one score, in step order: the best (step, value) and how many
    results in a row since it did not improve on it by more than min_delta."""

    step: int
    value: float
    stale: int
    results: int


def verdict(results: Iterable[dict[str, Any]], metric: BenchMetric, min_delta: float = 0.0) -> BestScore | None:
    """Fold the result rows (`benchresults.rows`) that carry `metric`, by step; None when none does."""
    found: BestScore | None = None
    for row in sorted((r for r in results if isinstance(r.get(metric.name), (int, float))), key=lambda r: r["step"]):
        score, n = float(row[metric.name]), (found.results if found else 0) + 1
        if found is None or metric.better(score, found.value, min_delta):
            found = BestScore(row["step"], score, 0, n)
        else:
            best = (row["step"], score) if metric.better(score, found.value) else (found.step, found.value)
            found = BestScore(*best, found.stale + 1, n)
    return found


def land(run: RunFolder, spec: JobSpec) -> BestScore | None:
    """After a result of checkpoint.keep_best's score landed: record the best step among the
    landed results whose checkpoint is still there (`.bench-best.json`), under the run's lock."""
    metric = parse("checkpoint.keep_best", spec.checkpoint.keep_best)
    root = run.checkpoints_dir(spec)
    with lock.held(run.lock_file, f"keep_best on {metric.name}", timeout_s=LOCK_TIMEOUT_S):
        present = {c.step for c in ckptfolder.list_checkpoints(root)}
        found = verdict([r for r in rows(run) if r["step"] in present], metric)
        if found is not None:
            record = {"metric": metric.name, "step": found.step, "value": found.value}
            fileio.atomic_write(root / ckptfolder.BENCH_BEST, json.dumps(record) + "\n")
    return found
