"""The sections that say what a run leaves behind: `[checkpoint]` (how often, where, how many
kept), `[log]` (experiment trackers), and `[sweep]` (the runs one job file makes; read by
`clusterfsdp sweep`, never part of a run's JobSpec)."""

# No `from __future__ import annotations` here: the codec resolves these annotations on every
# load (`schema.hints`), and strings would be compiled one by one each time (start-up, issue 25 item 3).

from typing import Any, Literal

from ..value import value
from .docfield import F

# Upper bound of the writer threads of one rank: more is a typo, and would exhaust the node.
MAX_WRITER_THREADS = 64  # checkpoint.writer_threads


@value
class CheckpointSection:
    """[checkpoint]: how often and where the sharded checkpoints are written, and how many kept."""

    dir: str = F("", "Where checkpoints go (empty: <run folder>/checkpoints).")
    every_steps: int = F(0, "Save every N steps (0: only at the end and on preemption).")
    keep_last: int = F(2, "Complete checkpoints to keep; older ones are deleted after a newer one is complete.")
    keep_best: str = F(
        "",
        "'eval_loss': also save at every evaluation that beats the lowest eval loss so far, and keep that checkpoint "
        "(never pruned by keep_last; `export --best`); 'eval_reward_accuracy' (preference training): the same for "
        "the highest reward accuracy on the held-out pairs; 'bench/<task>/<metric>' (e.g. 'bench/tiny_mc/acc', a "
        "task of [benchmarks]): keep the checkpoint with the best benchmark score, decided as each result lands; "
        "'': off.",
    )
    async_: bool = F(False, "Save in the background (DCP async_save) while training continues.", key="async")
    async_mode: Literal["thread", "process"] = F(
        "thread", "With async: write from a thread, or from a saver process per rank (started at the first save)."
    )
    writer_threads: int = F(
        4, f"Threads writing each rank's checkpoint files (one file per thread), 1 to {MAX_WRITER_THREADS}."
    )


Tracker = Literal["tensorboard", "wandb", "mlflow"]


@value
class LogSection:
    """[log]: experiment trackers rank 0 logs to."""

    trackers: list[Tracker] = F(
        [],
        "Experiment trackers rank 0 logs to, any of 'tensorboard' (<run folder>/tensorboard/), 'wandb' "
        "(files in <run folder>/wandb/), 'mlflow'; one tracker run per clusterfsdp run, across requeues and "
        "resumes. Needs `pip install 'clusterfsdp[trackers]'` where the workers run.",
    )
    project: str = F("", "W&B project and MLflow experiment (empty: job.name). W&B's entity: $WANDB_ENTITY.")
    mlflow_tracking_uri: str = F(
        "",
        "MLflow server or store (empty: $MLFLOW_TRACKING_URI, else a file store in <run folder>/mlruns). "
        "Credentials belong in [env] MLFLOW_TRACKING_PASSWORD/TOKEN, never in this URI.",
    )


# Points of one sweep at most: Slurm's default MaxArraySize (1001) holds array indices 0-1000,
# and every point is a run folder made before anything is queued.
MAX_SWEEP_POINTS = 1000


@value
class SweepSection:
    """[sweep]: read by `clusterfsdp sweep` (control.sweep), never part of a run's JobSpec: each
    point is a normal run whose job.toml has the point's values in place."""

    grid: dict[str, list[Any]] = F(
        {},
        "Keys to vary, each with its list of values ('train.lr' = [1e-4, 3e-4]); every combination is a point "
        "(the cross product with zip). Values are typed by the schema as --set types them.",
    )
    zip: dict[str, list[Any]] = F(
        {},
        "Keys varied together: lists of one length, the i-th values of all of them make one point.",
    )
    max_parallel: int = F(
        0,
        "Points running at once (Slurm: the job array's %N throttle; local: processes at once); 0: Slurm all, "
        f"local 1. At most {MAX_SWEEP_POINTS} points per sweep.",
    )
