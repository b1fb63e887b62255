"""metrics.jsonl read incrementally, for the run screen's charts.

Each poll reads only the bytes appended since the last one, and keeps the numbers in columns
(one array of 8-byte floats per key, NaN where a row had none), not the JSON objects, so a run
of a hundred thousand logged steps costs about 8 MB; past `max_points` the older half is thinned.

Rows come in two kinds, both keyed by step: training rows (`loss`, `lr`, ...) and eval rows
(`eval_loss`, `eval_ppl`, `eval_reward_accuracy`, `eval_reward_margin`), which may be rows of
their own or keys of a training row. An eval row adds to its step; it never erases the step's
training numbers. A training row for a step at or before the newest training step seen is a
resumed attempt logging again from its checkpoint: the steps from it on are dropped, so the
charts show the history the current weights have.
"""

from __future__ import annotations

import bisect
import math
from array import array
from dataclasses import dataclass
from pathlib import Path

from clusterfsdp.control.jsonltail import JsonlTail, Row

TRAIN_KEYS = (
    "loss", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "mem_peak_gb", "lr", "grad_norm", "epoch", "reward_accuracy",
    "reward_margin",
)  # fmt: skip
EVAL_KEYS = ("eval_loss", "eval_ppl", "eval_reward_accuracy", "eval_reward_margin")
KEYS = TRAIN_KEYS + EVAL_KEYS
NAN = math.nan


@dataclass(frozen=True)
class Metrics:
    """A copy of the columns at one moment: steps in increasing order, one array per key."""

    steps: array
    columns: dict[str, array]

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def last_step(self) -> int | None:
        return self.steps[-1] if self.steps else None

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """The steps that have `key`, and its values there."""
        pairs = [(s, v) for s, v in zip(self.steps, self.columns[key], strict=True) if v == v]  # v == v: not NaN
        return [s for s, _ in pairs], [v for _, v in pairs]

    def latest(self, key: str) -> float | None:
        column = self.columns[key]
        return next((v for v in reversed(column) if v == v), None)


EMPTY = Metrics(array("q"), {k: array("d") for k in KEYS})


class MetricsTail:
    """The columns of one metrics.jsonl; `read_new()` consumes appended lines only."""

    def __init__(self, path: Path, max_points: int = 200_000) -> None:
        self.path, self.max_points = path, max_points
        self.lines = JsonlTail(path)  # the bytes read so far: the shared JSONL tail (control.jsonltail)
        self.steps = array("q")
        self.columns = {k: array("d") for k in KEYS}
        self.last_train_step: int | None = None

    @property
    def offset(self) -> int:
        return self.lines.offset

    def read_new(self, chunk_bytes: int = 1 << 20) -> bool:
        """Read complete lines appended since the last call; True if any value changed. A
        megabyte at a time, so a long file read for the first time never holds more than a
        megabyte of parsed rows at once."""
        changed = False
        for rows in self.lines.read_new(chunk_bytes):
            changed = self._parse(rows) or changed
        if len(self.steps) > self.max_points:  # thin the oldest half, keep the recent detail
            half = len(self.steps) // 2
            self._keep([i for i in range(len(self.steps)) if i >= half or i % 2])
        return changed

    def _parse(self, rows: list[Row]) -> bool:
        changed = False
        for row in rows:
            if type(step := row.get("step")) is not int:
                continue
            # a number, else NaN (true and false are bools, not numbers); inline: it runs per key per row
            values = [
                float(v) if isinstance(v := row.get(k), (int, float)) and not isinstance(v, bool) else NAN for k in KEYS
            ]
            changed = self._add(step, values) or changed
        return changed

    def _add(self, step: int, values: list[float]) -> bool:
        present = [v == v for v in values]  # not NaN
        train = True in present[: len(TRAIN_KEYS)]
        if not train and True not in present:
            return False
        if train:
            if self.last_train_step is not None and step <= self.last_train_step:  # a resumed attempt
                cut = bisect.bisect_left(self.steps, step)
                del self.steps[cut:]
                for column in self.columns.values():
                    del column[cut:]
            self.last_train_step = step
        if not self.steps or step > self.steps[-1]:  # the usual case: a new step at the end
            self.steps.append(step)
            for column, value in zip(self.columns.values(), values, strict=True):
                column.append(value)
            return True
        at = bisect.bisect_left(self.steps, step)
        if self.steps[at] != step:
            self.steps.insert(at, step)
            for column in self.columns.values():
                column.insert(at, NAN)
        for column, value, there in zip(self.columns.values(), values, present, strict=True):
            if there:
                column[at] = value
        return True

    def _keep(self, indices: list[int]) -> None:
        self.steps = array("q", (self.steps[i] for i in indices))
        self.columns = {k: array("d", (c[i] for i in indices)) for k, c in self.columns.items()}

    def snapshot(self) -> Metrics:
        """A copy the UI thread can hold while this tail reads on (arrays copy as memory)."""
        return Metrics(array("q", self.steps), {k: array("d", c) for k, c in self.columns.items()})
