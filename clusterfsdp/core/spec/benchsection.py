"""[benchmarks]: lm-evaluation-harness tasks run on a run's checkpoints (issue 38), and the
checks of the section that need no file system (`errors`).

Its own module because schema.py is long already; its fields are made with `dataclasses.field`
and the same metadata as schema's `F` (a call of `F` here would trip ruff's RUF009, which
accepts `F` only in the module that defines it). schema.py imports this module, never the
reverse. Pure Python: no torch, no lm_eval (it imports torch): what a task needs on disk is
checked by `benchfiles` before queueing.
"""

# No `from __future__ import annotations`: the codec resolves these annotations (schema.hints).

from dataclasses import field

from ..value import value

YAML_SUFFIXES = (".yaml", ".yml")
MAX_BENCH_GPUS = 256  # as schema.MAX_TASKS_PER_NODE: more is a typo


def _doc(doc: str) -> dict:
    return {"doc": doc, "key": None}


@value
class BenchmarksSection:
    """[benchmarks]: lm-evaluation-harness on checkpoints (`clusterfsdp bench`, and after each
    save with every_checkpoints)."""

    tasks: list[str] = field(
        default_factory=list,
        metadata=_doc(
            "lm-evaluation-harness tasks run on checkpoints: paths of local task YAML files (relative to this file; "
            "their dataset_kwargs data_files relative to the YAML's folder, so no internet is needed) or names of "
            "tasks that ship with lm-eval (checked against the installed lm-eval before queueing; their data comes "
            "from the Hugging Face hub). Empty: no benchmarks. Needs `pip install 'clusterfsdp[bench]'`."
        ),
    )
    every_checkpoints: int = field(
        default=1,
        metadata=_doc(
            "Evaluate every N-th checkpoint an attempt saves, as it is saved (never blocking training: a background "
            "process locally, a Slurm job of its own on `partition`); 0: only by hand (`clusterfsdp bench RUN`)."
        ),
    )
    limit: int = field(default=0, metadata=_doc("Examples per task at most (lm-eval's limit); 0: all."))
    num_fewshot: int = field(default=-1, metadata=_doc("Few-shot examples per prompt; -1: each task's own default."))
    batch_size: int = field(default=1, metadata=_doc("lm-eval's batch size."))
    partition: str = field(
        default="", metadata=_doc("Slurm partition of the evaluation jobs (empty: slurm.partition).")
    )
    gpus: int = field(default=0, metadata=_doc("GPUs of an evaluation job (0: it runs on CPU)."))
    time: str = field(default="1:00:00", metadata=_doc("Time limit of an evaluation job (Slurm's forms)."))


def is_local(task: str) -> bool:
    """A task given as a local YAML file (by its suffix) rather than an lm-eval task name."""
    return task.lower().endswith(YAML_SUFFIXES)


def errors(b: BenchmarksSection) -> list[str]:
    """The section's values alone (ranges, names that reach #SBATCH); files: `benchfiles`."""
    from .allowlists import sbatch_name_error
    from .schema import parse_time_minutes, short

    if not b.tasks:
        return []
    out = []
    for i, task in enumerate(b.tasks):
        if not task.strip() or (any(c.isspace() or c == "," for c in task) and not is_local(task)):
            out.append(f"benchmarks.tasks[{i}]: {short(task)} is neither a task name nor a .yaml file")
    if len(set(b.tasks)) != len(b.tasks):
        out.append("benchmarks.tasks: a task is named twice")
    for key, found, low, high in (
        ("every_checkpoints", b.every_checkpoints, 0, None),
        ("limit", b.limit, 0, None),
        ("num_fewshot", b.num_fewshot, -1, 1000),
        ("batch_size", b.batch_size, 1, 4096),
        ("gpus", b.gpus, 0, MAX_BENCH_GPUS),
    ):
        if found < low or (high is not None and found > high):
            bound = f">= {low}" if high is None else f"in [{low}, {high}]"
            out.append(f"benchmarks.{key}: must be {bound}, found {found!r}")
    if problem := sbatch_name_error("benchmarks.partition", b.partition):
        out.append(problem)
    try:
        parse_time_minutes(b.time)
    except ValueError as e:
        out.append(f"benchmarks.time: {e}")
    return out
