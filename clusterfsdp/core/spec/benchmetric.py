"""checkpoint.keep_best and train.early_stopping.metric on a benchmark score (issue 38):
`bench/<task>/<metric>` (`bench/<task>/<metric>/<filter>` for a filter other than lm-eval's
'none'), the names worker/bench.py gives the scores in `<run>/benchmarks/step-N.json`.

Whether higher is better is read from a small explicit table of lm-eval's metric names, never
guessed: a metric outside it is an error naming the key (a keep_best that kept the worst
checkpoint would be silently wrong). The results land after training moved on: keep_best decides
as each lands (core/benchbest.py), early stopping counts them when the trainer reads them
(worker/benchstop.py). Pure Python, no file system: that a local task YAML declares the task is
checked by `benchfiles.problems` before queueing.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..value import value
from .schema import closest

if TYPE_CHECKING:
    from .schema import JobSpec

PREFIX = "bench/"
EVAL_KEEP_BEST = ("", "eval_loss", "eval_reward_accuracy")  # checkpoint.keep_best's other values
EVAL_STOPPING = ("", "eval_loss")  # train.early_stopping.metric's
# lm-eval's metric names (the part before the comma of 'acc,none'), by direction.
HIGHER = frozenset(
    {"acc", "acc_norm", "acc_mutual_info", "exact_match", "em", "f1", "mcc", "bleu", "chrf", "rouge1", "rouge2",
     "rougeL", "rougeLsum", "pass_1", "pass_10", "likelihood"}
)  # fmt: skip
LOWER = frozenset({"perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte", "ter", "brier_score"})
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/]")


def flat(name: str) -> str:
    """A score's name as TensorBoard, W&B and MLflow all accept it: characters outside letters,
    digits and `_.-/` made '_' (MLflow refuses commas, among others; `pass@1` is `pass_1`)."""
    return _UNSAFE.sub("_", name)


def is_bench(metric: str) -> bool:
    return metric.startswith(PREFIX)


@value(frozen=True)
class BenchMetric:
    """A benchmark score named in job.toml: its task, its metric, and which way is better."""

    name: str  # bench/<task>/<metric>[/<filter>], as step-N.json names it
    task: str
    metric: str
    higher: bool

    def better(self, found: float, than: float, by: float = 0.0) -> bool:
        """`found` beats `than` by more than `by` in this metric's direction."""
        return found > than + by if self.higher else found < than - by


def parse(key: str, name: str) -> BenchMetric:
    """`bench/<task>/<metric>[/<filter>]` (ValueError: one line naming `key` and what to set)."""
    parts = name[len(PREFIX) :].split("/")
    if not is_bench(name) or len(parts) not in (2, 3) or not all(parts) or flat(name) != name:
        raise ValueError(
            f"{key}: {name!r} is no benchmark score; write 'bench/<task>/<metric>' (e.g. 'bench/tiny_mc/acc'), "
            "as benchmarks/step-N.json names them"
        )
    metric = parts[1]
    if metric not in HIGHER and metric not in LOWER:
        known = ", ".join(sorted(HIGHER | LOWER))
        raise ValueError(
            f"{key}: cannot tell whether a higher or a lower {metric!r} is better (known lm-eval metrics: {known}); "
            "name one of those"
        )
    return BenchMetric(name, parts[0], metric, metric in HIGHER)


def used(spec: JobSpec, every: bool = False) -> list[tuple[str, str]]:
    """(key, value) of each of keep_best and early_stopping.metric set to a benchmark score (with
    `every`: both, whatever they are set to)."""
    pairs = (
        ("checkpoint.keep_best", spec.checkpoint.keep_best),
        ("train.early_stopping.metric", spec.train.early_stopping.metric),
    )
    return [(key, metric) for key, metric in pairs if every or is_bench(metric)]


def errors(spec: JobSpec) -> list[str]:
    """keep_best and early_stopping.metric: one of their evaluation metrics or a benchmark score
    of a task in [benchmarks].tasks, with a known direction; early stopping on one needs the run
    to evaluate its checkpoints itself (benchmarks.every_checkpoints, checkpoint.every_steps)."""
    out = []
    for (key, metric), plain in zip(used(spec, every=True), (EVAL_KEEP_BEST, EVAL_STOPPING), strict=True):
        if not is_bench(metric):
            if metric not in plain:
                near = closest(metric, [p for p in plain if p])
                hint = f" (did you mean {near!r}?)" if near else ""
                choices = ", ".join(repr(p) for p in plain)
                out.append(f"{key}: expected one of {choices} or 'bench/<task>/<metric>', found {metric!r}{hint}")
            continue
        try:
            parse(key, metric)
        except ValueError as e:
            out.append(str(e))
            continue
        if not spec.benchmarks.tasks:
            out.append(f"{key}: {metric!r} is a benchmark score: set benchmarks.tasks to the task it comes from")
    stop, b = spec.train.early_stopping.metric, spec.benchmarks
    if is_bench(stop) and b.tasks and not (b.every_checkpoints > 0 and spec.checkpoint.every_steps > 0):
        out.append(
            f"train.early_stopping.metric: {stop!r} needs the run to evaluate its checkpoints as it saves them: set "
            "checkpoint.every_steps and benchmarks.every_checkpoints to at least 1"
        )
    return out
