"""Run lm-evaluation-harness on one exported checkpoint: the worker half of `clusterfsdp bench`
(control/benchrun.py runs this as a subprocess, so the control plane never imports lm_eval, which
imports torch).

`python -m clusterfsdp.worker.bench RUN_DIR --step N --model HF_DIR --out FILE [--export [--merge] [--release]]`

With `--export` this process first writes checkpoint N to HF_DIR itself, with the export every
`clusterfsdp export` runs (worker/export.py, its checks and one-line errors; exit status
`EXIT_EXPORT_FAILED` when it fails), then evaluates it: one start of torch and transformers per
evaluation instead of two processes that each import them (about 3.5 s of CPU saved per
evaluation; bench/README.md). `--release` lets keep_last have the checkpoint once the export
read it (ckptfolder.release), as the evaluation did when the export was a process of its own.

The tasks are the run's [benchmarks] (its job.toml): a local task YAML is loaded with lm-eval's
own loader (`include:` and `!function` relative to the file, as --include_path reads it), its data_files made absolute
against the YAML's folder (core/benchfiles.py: how validate checked them), and passed to
`simple_evaluate` as a task config; a name is lm-eval's own task. FILE gets lm-eval's result
document (`lm_eval`, as `simple_evaluate` returns it, without per-sample logs) and the scores as
flat metric names (`metrics`: `bench/<task>/<metric>`, names TensorBoard, W&B and MLflow all
accept), written next to FILE and renamed into place; with `[log] trackers` naming
tensorboard, also as scalars in `<run>/tensorboard/benchmarks/`, and to W&B and MLflow
(`benchtrackers.log_benchmarks`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from lm_eval import utils
from lm_eval.evaluator import simple_evaluate
from lm_eval.tasks import TaskManager
from lm_eval.tasks._yaml_loader import load_yaml
from lm_eval.utils import simple_parse_args_string

from ..core import benchfiles, ckptfolder, runfolder
from ..core.benchresults import EXIT_EXPORT_FAILED, metric_name
from ..core.spec.benchsection import BenchmarksSection, is_local
from . import export
from .benchtrackers import log_benchmarks

EXIT_FAILED = 1


def task_configs(b: BenchmarksSection) -> list[str | dict[str, Any]]:
    """What `simple_evaluate(tasks=...)` gets for [benchmarks]: a name as it is, a local YAML as
    its loaded config with absolute data files (lm-eval would read relative ones against the
    working folder, not the YAML's)."""
    # lm-eval's own loader of task files (private, hence lm-eval pinned to one minor version in
    # pyproject): `include:` and `!function` resolved as lm-eval resolves them for --include_path.
    out: list[str | dict[str, Any]] = []
    for task in b.tasks:
        if not is_local(task):
            out.append(task)
            continue
        path = Path(task)
        benchfiles.local_task(path)  # (again here: whose the files and the code they name are now)
        config = load_yaml(path)
        files = benchfiles.data_files(config, path.parent)
        if files is not None:
            config["dataset_kwargs"] = {
                **config["dataset_kwargs"],
                "data_files": {split: [str(p) for p in paths] for split, paths in files.items()},
            }
        out.append(config)
    return out


def needs_task_index(tasks: list[str | dict[str, Any]]) -> bool:
    """Whether lm-eval must index its own task folder for `tasks`: for a task name, or a local
    group (whose members are names). A local task's config is built as it is, without the index
    (lm-eval's factory builds a TASK or PY_TASK entry from its config alone); indexing the ~15,000
    default task files costs 5-7 s of CPU per evaluation, more than a tiny task's scoring."""
    return any(isinstance(t, str) or "group" in t or not isinstance(t.get("task"), str) for t in tasks)


def task_manager(tasks: list[str | dict[str, Any]], model_args: str) -> TaskManager:
    """The TaskManager `simple_evaluate` would make (its metadata from the model arguments, as
    simple_evaluate gives it), without the default task index when `tasks` do not need it."""
    return TaskManager(include_defaults=needs_task_index(tasks), metadata=simple_parse_args_string(model_args))


def flat_metrics(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Every numeric score of lm-eval's `results` table as one flat name -> value (stderr 'N/A' left out)."""
    out = {}
    for task, scores in results.items():
        for key, value in scores.items():
            name = metric_name(task, key)
            if name is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
                out[name] = float(value)
    return out


def evaluate(run: runfolder.RunFolder, model: Path, step: int) -> dict[str, Any]:
    """lm-eval on the exported folder `model` with the run's [benchmarks]; the result document."""
    b = run.spec().benchmarks
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.time()
    tasks: list[Any] = task_configs(b)  # (simple_evaluate's list also takes Task objects: invariant)
    model_args = f"pretrained={model}"
    results = simple_evaluate(
        model="hf",
        model_args=model_args,
        tasks=tasks,
        task_manager=task_manager(tasks, model_args),
        num_fewshot=None if b.num_fewshot < 0 else b.num_fewshot,
        batch_size=b.batch_size,
        device=device,
        limit=b.limit or None,
        log_samples=False,
    )
    if results is None:  # simple_evaluate returns None on ranks other than 0; one process here
        raise RuntimeError("lm-eval returned no results")
    document = json.loads(json.dumps(results, default=utils.handle_non_serializable))
    return {
        "step": step,
        "time": time.time(),
        "seconds": round(time.time() - started, 3),
        "tasks": list(b.tasks),
        "metrics": flat_metrics(document.get("results", {})),
        "lm_eval": document,
    }


def write(out: Path, document: dict[str, Any]) -> None:
    """`out` whole or not at all: written beside it, then renamed (a reader never sees half)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    tmp.write_text(json.dumps(document, indent=1) + "\n")
    tmp.replace(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m clusterfsdp.worker.bench")
    p.add_argument("run", type=Path)
    p.add_argument("--step", type=int, required=True)
    p.add_argument("--model", type=Path, required=True, help="the exported HF folder of that step")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--export", action="store_true", help="write checkpoint --step to --model first")
    p.add_argument("--merge", action="store_true", help="with --export: a LoRA run's adapters merged in")
    p.add_argument("--release", action="store_true", help="with --export: release keep_last's hold once read")
    args = p.parse_args(argv)
    run = runfolder.RunFolder(args.run)
    if args.export and not export_step(run, args.step, args.model, merge=args.merge, release=args.release):
        return EXIT_EXPORT_FAILED
    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    document = evaluate(run, args.model, args.step)
    write(args.out, document)
    spec = run.spec()
    if "tensorboard" in spec.log.trackers:
        try:
            to_tensorboard(run, document)
        except Exception as e:  # the scores are kept in step-N.json whatever the plot does
            print(f"warning: benchmarks of step {args.step} not written to TensorBoard: {e}", file=sys.stderr)
    if {"wandb", "mlflow"} & set(spec.log.trackers):
        try:
            log_benchmarks(run, spec, args.step, document["metrics"])
        except Exception as e:  # (as above)
            print(f"warning: benchmarks of step {args.step} not written to W&B/MLflow: {e}", file=sys.stderr)
    return 0


def export_step(run: runfolder.RunFolder, step: int, to: Path, *, merge: bool, release: bool) -> bool:
    """Checkpoint `step` exported to `to` by `export.main` (its line on stderr if it fails); the
    warnings and logging it silences for its own output are back as they were afterwards, for
    lm-eval's. With `release`, the checkpoint's hold goes whatever the export did."""
    disabled = logging.root.manager.disable
    try:
        with warnings.catch_warnings():
            code = export.main([str(run.path), "--step", str(step), "--to", str(to), *(["--merge"] if merge else [])])
    finally:
        logging.disable(disabled)
        if release:
            ckptfolder.release(run.checkpoints_dir(), step)
    return code == 0


def to_tensorboard(run: runfolder.RunFolder, document: dict[str, Any]) -> None:
    """The scores at their checkpoint's step, in `<run>/tensorboard/benchmarks/`: a TensorBoard
    run of its own beside the training's, whose attempts purge the steps a resume repeats
    (worker/trackers.py) and would drop a result that landed after training moved on."""
    from torch.utils.tensorboard import SummaryWriter  # optional ([trackers] extra): only with tensorboard

    writer = SummaryWriter(log_dir=str(run.tensorboard_dir / "benchmarks"))
    try:
        for name, value in document["metrics"].items():
            writer.add_scalar(name, value, document["step"])
    finally:
        writer.close()


if __name__ == "__main__":
    sys.exit(main())
