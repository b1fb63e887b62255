"""Where the benchmark results of a run are and how they are read (`status --json`, `doctor`),
apart from control/benchrun.py (which runs evaluations and imports the run service) so that readers
stay light:

    <run>/benchmarks/step-N.json         worker/bench.py's document: `metrics` (bench/<task>/<metric>)
                                         and lm-eval's own result document (`lm_eval`)
    <run>/benchmarks/step-N.failed.json  why the last evaluation of step N failed (removed by a success)
    <run>/benchmarks/step-N.log          the output of an evaluation the run queued itself
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any, TypeGuard

from .runfolder import RunFolder
from .value import value

# worker/bench.py's exit status when the export before the evaluation failed (its stderr's last
# line says why): control/benchrun.py records the failure as the export's, not lm-eval's.
EXIT_EXPORT_FAILED = 3

RESULTS = "benchmarks"
RESULT_NAME = re.compile(r"^step-(\d+)\.json$")
_FAILED = re.compile(r"^step-(\d+)\.failed\.json$")


def results_dir(run: RunFolder) -> Path:
    return run.path / RESULTS


def result_path(run: RunFolder, step: int) -> Path:
    return results_dir(run) / f"step-{step}.json"


def failure_path(run: RunFolder, step: int) -> Path:
    return results_dir(run) / f"step-{step}.failed.json"


def metric_name(task: str, key: str) -> str | None:
    """lm-eval's 'acc,none' of `task` as 'bench/<task>/acc' ('bench/<task>/exact_match/strict-match'
    for another filter); None for a key that is no metric ('alias'). Characters outside letters,
    digits and `_.-/` become '_' (MLflow refuses commas, among others)."""
    metric, sep, filt = key.partition(",")
    if not sep:
        return None
    name = f"bench/{task}/{metric}" + (f"/{filt}" if filt != "none" else "")
    return re.sub(r"[^A-Za-z0-9_.\-/]", "_", name)  # (spec.benchmetric.flat: status imports no spec)


def read_document(path: Path) -> dict[str, Any] | None:
    """One result (or failure) document; None when unreadable or not one (a file being renamed
    into place is whole or absent: worker/bench.write)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("step"), int) else None


def _documents(run: RunFolder, pattern: re.Pattern[str]) -> list[dict[str, Any]]:
    """The JSON documents of benchmarks/ whose names match, by step; unreadable ones left out."""
    try:
        names = os.listdir(results_dir(run))
    except OSError:
        return []
    found = (read_document(results_dir(run) / name) for name in names if pattern.match(name))
    return sorted((d for d in found if d is not None), key=lambda d: d["step"])


def row(doc: dict[str, Any]) -> dict[str, Any]:
    """A result document as a row: `step`, `time` and the `bench/<task>/<metric>` scores."""
    return {"step": doc["step"], "time": doc.get("time"), **(doc.get("metrics") or {})}


def file_row(path: Path) -> dict[str, Any] | None:
    """The row of one file of benchmarks/ (`rows`); None for one that is no result (a failure
    record, lm-eval's own files) or unreadable."""
    doc = read_document(path) if RESULT_NAME.match(path.name) else None
    return row(doc) if doc is not None else None


def rows(run: RunFolder) -> list[dict[str, Any]]:
    """One row per evaluated step, oldest first: `step`, `time` and the `bench/<task>/<metric>` scores."""
    return [row(d) for d in _documents(run, RESULT_NAME)]


def scores(row: dict[str, Any]) -> dict[str, float]:
    """The `bench/...` scores of a row (its `step` and `time` left out)."""
    return {k: v for k, v in row.items() if k.startswith("bench/")}


def is_score(value: object) -> TypeGuard[float]:
    """A finite number: lm-eval writes NaN for a score it could not compute (a stderr of one example)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_stderr(name: str) -> bool:
    """`bench/<task>/acc_stderr`: a score's standard error, not a score to rank or plot."""
    return "_stderr" in name


@value(frozen=True)
class Latest:
    """A run's newest benchmark result: its step, its scores, and the scores lm-eval says are
    better lower (perplexity, bits per byte; a standard error), for sorting points best first."""

    step: int
    scores: dict[str, float]
    lower_is_better: frozenset[str]

    def rank(self, name: str) -> float | None:
        """`name`'s score as a sort key, best first (lower-is-better scores as they are, the others negated)."""
        value = self.scores.get(name)
        return None if value is None else value if name in self.lower_is_better else -value


def _lower_is_better(doc: dict[str, Any]) -> frozenset[str]:
    """The scores lm-eval's `higher_is_better` table marks false (any filter), and every standard error."""
    table = (doc.get("lm_eval") or {}).get("higher_is_better") or {}
    bases = [
        metric_name(str(task), f"{metric},none")
        for task, metrics in table.items()
        if isinstance(metrics, dict)
        for metric, higher in metrics.items()
        if higher is False
    ]
    names = doc.get("metrics") or {}
    return frozenset(k for k in names if is_stderr(k) or any(k == b or k.startswith(f"{b}/") for b in bases if b))


def latest(run: RunFolder) -> Latest | None:
    """The newest readable result (the highest step), read alone: a sweep lists many points."""
    try:
        names = os.listdir(results_dir(run))
    except OSError:
        return None
    steps = sorted((int(m.group(1)) for n in names if (m := RESULT_NAME.match(n))), reverse=True)
    for step in steps:
        doc = read_document(result_path(run, step))
        if doc is not None:
            found = {k: float(v) for k, v in scores(row(doc)).items() if is_score(v)}
            return Latest(doc["step"], found, _lower_is_better(doc))
    return None


def failures(run: RunFolder) -> list[dict[str, Any]]:
    """The evaluations that failed (`step`, `time`, `error`), oldest step first."""
    return _documents(run, _FAILED)


def record_failure(run: RunFolder, step: int, error: str) -> None:
    """benchmarks/step-N.failed.json: what `doctor` shows; a later success removes it."""
    results_dir(run).mkdir(exist_ok=True)
    failure_path(run, step).write_text(json.dumps({"step": step, "time": time.time(), "error": error}) + "\n")
