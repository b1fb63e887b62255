"""metrics.jsonl read incrementally, for the live loss curve.

Each poll reads only the bytes appended since the last one, and keeps a few numbers per step
(not the whole JSON objects), so a week-long run's metrics stay small in memory. A resumed
attempt logs again from its checkpoint's step on: the newer row for a step replaces the older
one, so the curve shows the history that the current weights actually have.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Point:
    step: int
    loss: float | None
    tokens_per_s: float | None
    tokens_per_s_per_gpu: float | None
    mfu: float | None
    mem_peak_gb: float | None
    lr: float | None
    grad_norm: float | None
    eval_loss: float | None = None

    @classmethod
    def from_row(cls, row: dict) -> Point:
        def num(key: str) -> float | None:
            value = row.get(key)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        return cls(
            int(row["step"]),
            num("loss"),
            num("tokens_per_s"),
            num("tokens_per_s_per_gpu"),
            num("mfu"),
            num("mem_peak_gb"),
            num("lr"),
            num("grad_norm"),
            num("eval_loss"),
        )


class MetricsTail:
    """The points of one metrics.jsonl, by step; `read_new()` consumes appended lines only."""

    def __init__(self, path: Path, max_points: int = 200_000) -> None:
        self.path, self.max_points = path, max_points
        self.offset = 0
        self.by_step: dict[int, Point] = {}

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
                point = Point.from_row(row)
            except (ValueError, KeyError, TypeError):
                continue
            self.by_step[point.step] = point
            changed = True
        if len(self.by_step) > self.max_points:  # thin the oldest half, keep the recent detail
            steps = sorted(self.by_step)
            for step in steps[: len(steps) // 2 : 2]:
                del self.by_step[step]
        return changed

    def points(self) -> list[Point]:
        return [self.by_step[s] for s in sorted(self.by_step)]
