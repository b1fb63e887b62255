"""metrics.jsonl read incrementally, for the run screen's charts.

Each poll reads only the bytes appended since the last one, and keeps a few numbers per step
(not the whole JSON objects), so a week-long run's metrics stay small in memory.

Rows come in two kinds, both keyed by step: training rows (`loss`, `lr`, ...) and eval rows
(`eval_loss`, `eval_ppl`), which may be rows of their own or keys of a training row. An eval row
adds to the step's point; it never erases its training numbers. A training row for a step at or
before the newest one seen is a resumed attempt logging again from its checkpoint: the points
after it are dropped, so the charts show the history the current weights actually have.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

TRAIN_KEYS = ("loss", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "mem_peak_gb", "lr", "grad_norm")
EVAL_KEYS = ("eval_loss", "eval_ppl")


@dataclass(frozen=True)
class Point:
    step: int
    loss: float | None = None
    tokens_per_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mfu: float | None = None
    mem_peak_gb: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    eval_loss: float | None = None
    eval_ppl: float | None = None


def numbers(row: dict, keys: tuple[str, ...]) -> dict[str, float]:
    """The keys of `row` that hold numbers (a bool, a string or null is not one)."""
    return {k: float(v) for k in keys if isinstance(v := row.get(k), (int, float)) and not isinstance(v, bool)}


class MetricsTail:
    """The points of one metrics.jsonl, by step; `read_new()` consumes appended lines only."""

    def __init__(self, path: Path, max_points: int = 200_000) -> None:
        self.path, self.max_points = path, max_points
        self.offset = 0
        self.by_step: dict[int, Point] = {}
        self.last_train_step: int | None = None

    def read_new(self) -> bool:
        """Read complete lines appended since the last call; True if any point changed."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return False
        end = data.rfind(b"\n") + 1  # a torn last line is read again next time
        self.offset += end
        changed = False
        for line in data[:end].splitlines():
            try:
                row = json.loads(line)
                step = int(row["step"])
            except (ValueError, KeyError, TypeError):
                continue
            changed = self._add(step, numbers(row, TRAIN_KEYS), numbers(row, EVAL_KEYS)) or changed
        if len(self.by_step) > self.max_points:  # thin the oldest half, keep the recent detail
            steps = sorted(self.by_step)
            for step in steps[: len(steps) // 2 : 2]:
                del self.by_step[step]
        return changed

    def _add(self, step: int, train: dict[str, float], evals: dict[str, float]) -> bool:
        if not train and not evals:
            return False
        if train:
            if self.last_train_step is not None and step <= self.last_train_step:  # a resumed attempt
                for later in [s for s in self.by_step if s >= step]:
                    del self.by_step[later]
            self.last_train_step = step
            earlier = self.by_step.get(step)  # an eval row logged before this step's training row
            kept = {k: v for k in EVAL_KEYS if earlier and (v := getattr(earlier, k)) is not None}
            self.by_step[step] = Point(step, **{**kept, **train, **evals})
        else:
            self.by_step[step] = dataclasses.replace(self.by_step.get(step, Point(step)), **evals)
        return True

    def points(self) -> list[Point]:
        return [self.by_step[s] for s in sorted(self.by_step)]
