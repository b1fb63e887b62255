"""[benchmarks]: lm-evaluation-harness tasks run on a run's checkpoints (issue 38), and the
checks of the section that need no file system (`errors`).

One of the schema's section modules (schema.py imports it, never the reverse); its fields are
made with `docfield.F` like every section's. Pure Python: no torch, no lm_eval (it imports
torch): what a task needs on disk is checked by `benchfiles` before queueing.
"""

# No `from __future__ import annotations`: the codec resolves these annotations (schema.hints).

from ..value import value
from .docfield import F

YAML_SUFFIXES = (".yaml", ".yml")
MAX_BENCH_GPUS = 256  # as schema.MAX_TASKS_PER_NODE: more is a typo


@value
class BenchmarksSection:
    """[benchmarks]: lm-evaluation-harness on checkpoints (`clusterfsdp bench`, and after each
    save with every_checkpoints)."""

    tasks: list[str] = F(
        [],
        "lm-evaluation-harness tasks run on checkpoints: paths of local task YAML files (relative to this file; "
        "their dataset_kwargs data_files relative to the YAML's folder, so no internet is needed) or names of "
        "tasks that ship with lm-eval (checked against the installed lm-eval before queueing; their data comes "
        "from the Hugging Face hub). Empty: no benchmarks. Needs `pip install 'clusterfsdp[bench]'`.",
    )
    every_checkpoints: int = F(
        1,
        "Evaluate every N-th checkpoint an attempt saves, as it is saved (never blocking training: a background "
        "process locally, a Slurm job of its own on `partition`); 0: only by hand (`clusterfsdp bench RUN`).",
    )
    limit: int = F(0, "Examples per task at most (lm-eval's limit); 0: all.")
    num_fewshot: int = F(-1, "Few-shot examples per prompt; -1: each task's own default.")
    batch_size: int = F(1, "lm-eval's batch size.")
    partition: str = F("", "Slurm partition of the evaluation jobs (empty: slurm.partition).")
    gpus: int = F(0, "GPUs of an evaluation job (0: it runs on CPU).")
    time: str = F("1:00:00", "Time limit of an evaluation job (Slurm's forms).")


def is_local(task: str) -> bool:
    """A task given as a local YAML file (by its suffix) rather than an lm-eval task name."""
    return task.lower().endswith(YAML_SUFFIXES)
