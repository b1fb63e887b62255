"""Where the benchmark results of a run are and how they are read (`status --json`, `doctor`),
apart from control/bench.py (which runs evaluations and imports the run service) so that readers
stay light:

    <run>/benchmarks/step-N.json         worker/bench.py's document: `metrics` (bench/<task>/<metric>)
                                         and lm-eval's own result document (`lm_eval`)
    <run>/benchmarks/step-N.failed.json  why the last evaluation of step N failed (removed by a success)
    <run>/benchmarks/step-N.log          the output of an evaluation the run queued itself
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from .runfolder import RunFolder

RESULTS = "benchmarks"
_RESULT = re.compile(r"^step-(\d+)\.json$")
_FAILED = re.compile(r"^step-(\d+)\.failed\.json$")


def results_dir(run: RunFolder) -> Path:
    return run.path / RESULTS


def result_path(run: RunFolder, step: int) -> Path:
    return results_dir(run) / f"step-{step}.json"


def failure_path(run: RunFolder, step: int) -> Path:
    return results_dir(run) / f"step-{step}.failed.json"


def _documents(run: RunFolder, pattern: re.Pattern[str]) -> list[dict[str, Any]]:
    """The JSON documents of benchmarks/ whose names match, by step; unreadable ones left out
    (one being renamed into place is whole or absent: worker/bench.write)."""
    try:
        names = os.listdir(results_dir(run))
    except OSError:
        return []
    out = []
    for name in names:
        if pattern.match(name):
            try:
                doc = json.loads((results_dir(run) / name).read_text())
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict) and isinstance(doc.get("step"), int):
                out.append(doc)
    return sorted(out, key=lambda d: d["step"])


def rows(run: RunFolder) -> list[dict[str, Any]]:
    """One row per evaluated step, oldest first: `step`, `time` and the `bench/<task>/<metric>` scores."""
    return [{"step": d["step"], "time": d.get("time"), **(d.get("metrics") or {})} for d in _documents(run, _RESULT)]


def failures(run: RunFolder) -> list[dict[str, Any]]:
    """The evaluations that failed (`step`, `time`, `error`), oldest step first."""
    return _documents(run, _FAILED)


def record_failure(run: RunFolder, step: int, error: str) -> None:
    """benchmarks/step-N.failed.json: what `doctor` shows; a later success removes it."""
    results_dir(run).mkdir(exist_ok=True)
    failure_path(run, step).write_text(json.dumps({"step": step, "time": time.time(), "error": error}) + "\n")
