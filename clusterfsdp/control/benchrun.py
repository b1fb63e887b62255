"""Benchmarks of a run's checkpoints (issue 38): `clusterfsdp bench RUN [--step N | --all]`, and
the results `status --json` reads.

One evaluation: one subprocess (worker/bench.py; lm_eval imports torch, the control plane never
does) exports the checkpoint to a temporary HF folder with the export every `export` uses (after
`Run.export_step`'s checks here; a LoRA run's adapters merged into a full model), then runs
lm-eval on it; the folder is removed after. With checkpoint.keep_best on a benchmark score the
checkpoint stays held until its result landed and the best was recorded (core/benchbest.py).
Local tasks run offline (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE): a cluster's compute nodes often
have no internet, and a task that tried would hang there.
The results' layout and readers: core/benchresults.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core import benchbest, ckptfolder
from ..core.benchresults import EXIT_EXPORT_FAILED, failure_path, record_failure, result_path, results_dir
from ..core.lock import FileLock, LockHeld
from ..core.runfolder import RunFolder
from ..core.spec import benchmetric
from ..core.spec.benchsection import is_local
from .run import Run, RunError

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


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
    record_failure(run, step, error)
    return RunError(f"run {run.id}: benchmarks of step {step} failed: {error}")


def evaluate_once(run: Run, step: int, say: Callable[[str], None], *, again: bool) -> dict[str, Any] | None:
    """`evaluate` under the step's lock (benchmarks/step-N.lock): an evaluation already under way
    (the run's own, in the background or as a Slurm job; another `bench`) is waited for, never
    run twice at once. Then, unless `again`, a step that has its result now is left alone (None).
    The lock beats every 30 s, so an evaluation job on another host that died stops holding it."""
    held = FileLock(results_dir(run.folder) / f"step-{step}.lock", f"benchmarks of step {step}", heartbeat_s=30.0)
    try:
        held.acquire(0.0)
    except LockHeld as e:
        who = e.owner.describe() if e.owner else "another process"
        say(f"step {step}: waiting for its evaluation under way ({who})")
        held.acquire(None, poll_s=1.0)
    try:
        if not again and result_path(run.folder, step).is_file():
            return None
        return evaluate(run, step)
    finally:
        held.release()


def evaluate(run: Run, step: int) -> dict[str, Any]:
    """Export checkpoint `step` to a temporary folder, run lm-eval on it, return the result
    document (also in benchmarks/step-N.json). RunError with one line on failure, recorded in
    benchmarks/step-N.failed.json."""
    spec = run.folder.spec()
    root, keep_best = run.folder.checkpoints_dir(spec), benchmetric.is_bench(spec.checkpoint.keep_best)
    tmp = Path(tempfile.mkdtemp(prefix=f"clusterfsdp-bench-{run.id}-{step}-"))
    try:
        model = tmp / "model"
        env = {**os.environ, **(OFFLINE if all(is_local(t) for t in spec.benchmarks.tasks) else {})}
        out = result_path(run.folder, step)
        argv = [sys.executable, "-m", "clusterfsdp.worker.bench", str(run.path), "--step", str(step)]
        argv += ["--model", str(model), "--out", str(out), "--export"]
        argv += ["--merge"] if spec.peft.method == "lora" else []
        # read: keep_last may let the checkpoint go (worker/benchqueue.py held it); with keep_best
        # on a score, once its result landed (below)
        argv += [] if keep_best else ["--release"]
        try:
            run.export_step(model, step)  # (the control plane's checks; the worker exports)
            done = subprocess.run(argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
        except RunError as e:  # (no such checkpoint any more, not yours): recorded like any failure
            raise _fail(run.folder, step, f"export: {e}") from None
        finally:  # (given up here, or the worker died before it released it)
            if not keep_best:
                ckptfolder.release(root, step)
        if done.returncode != 0:
            stage = "export" if done.returncode == EXIT_EXPORT_FAILED else "lm-eval"
            raise _fail(run.folder, step, f"{stage}: {_last_line(done)}")
        failure_path(run.folder, step).unlink(missing_ok=True)
        for line in done.stderr.splitlines():  # (a tracker that did not take the scores)
            if line.startswith("warning: "):
                print(line, file=sys.stderr)
        if keep_best:  # the best recorded before the hold goes (ckptfolder.beyond_keep reads them in that order)
            benchbest.land(run.folder, spec)
        return json.loads(out.read_text())
    finally:
        if keep_best:
            ckptfolder.release(root, step)
        shutil.rmtree(tmp, ignore_errors=True)


def describe(step: int, document: dict[str, Any] | None) -> str:
    """'step 4: bench/tiny_mc/acc 0.8333, ...' (stderr columns left out), and the time it took;
    without a document (`evaluate_once` left the step: its result landed meanwhile), that."""
    if document is None:
        return f"step {step}: evaluated meanwhile"
    scores = ", ".join(f"{k} {v:.4g}" for k, v in document["metrics"].items() if "_stderr" not in k)
    return f"step {document['step']}: {scores or 'no scores'} ({document.get('seconds', 0):.1f} s)"
