"""Benchmarks of a run's checkpoints (issue 38): `clusterfsdp bench RUN [--step N | --all]`, and
the results `status --json` reads.

One evaluation: the checkpoint exported to a temporary HF folder by the export every `export`
uses (`Run.export_command`: a LoRA run's adapters merged into a full model), then lm-eval on it in
a subprocess (worker/bench.py; lm_eval imports torch, the control plane never does), the folder
removed after. Local tasks run offline (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE): a cluster's
compute nodes often have no internet, and a task that tried would hang there.

    <run>/benchmarks/step-N.json         worker/bench.py's document: `metrics` (bench/<task>/<metric>)
                                         and lm-eval's own result document (`lm_eval`)
    <run>/benchmarks/step-N.failed.json  why the last evaluation of step N failed (removed by a success)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import ckptfolder
from .run import Run, RunError
from .runfolder import RunFolder
from .spec.benchsection import is_local

RESULTS = "benchmarks"
_RESULT = re.compile(r"^step-(\d+)\.json$")
_FAILED = re.compile(r"^step-(\d+)\.failed\.json$")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


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


def steps_to_run(run: Run, step: int | None, every: bool) -> list[int]:
    """The checkpoint steps `bench` evaluates: `step`, or with `every` each complete checkpoint
    that has no result yet, else the newest (RunError: none there)."""
    spec = run.folder.spec()
    if not spec.benchmarks.tasks:
        raise RunError(f"run {run.id}: its job has no [benchmarks] tasks; set benchmarks.tasks in its job.toml")
    root = run.folder.checkpoints_dir(spec)
    if every:
        steps = [c.step for c in ckptfolder.list_checkpoints(root)]
        return [s for s in steps if not result_path(run.folder, s).is_file()]
    info = ckptfolder.find(root, step)
    if info is None:
        raise RunError(f"run {run.id}: no complete checkpoint{f' at step {step}' if step is not None else ''}")
    return [info.step]


def _last_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in (proc.stderr or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit status {proc.returncode}"


def _fail(run: RunFolder, step: int, error: str) -> RunError:
    """Record the failure for `doctor` and `status`, and the one-line error to raise."""
    results_dir(run).mkdir(exist_ok=True)
    failure_path(run, step).write_text(json.dumps({"step": step, "time": time.time(), "error": error}) + "\n")
    return RunError(f"run {run.id}: benchmarks of step {step} failed: {error}")


def evaluate(run: Run, step: int) -> dict[str, Any]:
    """Export checkpoint `step` to a temporary folder, run lm-eval on it, return the result
    document (also in benchmarks/step-N.json). RunError with one line on failure, recorded in
    benchmarks/step-N.failed.json."""
    spec = run.folder.spec()
    tmp = Path(tempfile.mkdtemp(prefix=f"clusterfsdp-bench-{run.id}-{step}-"))
    try:
        model = tmp / "model"
        export = run.export_command(model, step, merge=spec.peft.method == "lora")
        done = subprocess.run(export, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise _fail(run.folder, step, f"export: {_last_line(done)}")
        env = {**os.environ, **(OFFLINE if all(is_local(t) for t in spec.benchmarks.tasks) else {})}
        out = result_path(run.folder, step)
        argv = [sys.executable, "-m", "clusterfsdp.worker.bench", str(run.path), "--step", str(step)]
        argv += ["--model", str(model), "--out", str(out)]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise _fail(run.folder, step, f"lm-eval: {_last_line(done)}")
        failure_path(run.folder, step).unlink(missing_ok=True)
        return json.loads(out.read_text())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def describe(document: dict[str, Any]) -> str:
    """'step 4: bench/tiny_mc/acc 0.8333, ...' (stderr columns left out), and the time it took."""
    scores = ", ".join(f"{k} {v:.4g}" for k, v in document["metrics"].items() if "_stderr" not in k)
    return f"step {document['step']}: {scores or 'no scores'} ({document.get('seconds', 0):.1f} s)"
