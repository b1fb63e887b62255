"""Progress of long worker-side work (tokenizing the data, building and loading a model, saving
or loading a checkpoint, exporting): a rich progress bar where a person watches a terminal (the
export that `clusterfsdp export` runs), and plain lines otherwise (a rank's log, read with
`clusterfsdp logs -f`): one when the work starts, at most one every `every_s` seconds with the
fraction done, and one with the time it took. No colour when $NO_COLOR is set."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn


def on_a_terminal() -> bool:
    try:
        return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


class Task:
    """One piece of work with an optional total; `advance` as it goes."""

    def __init__(self, label: str, total: float | None, log: Callable[[str], None], every_s: float, bar: Any):
        self.label, self.total, self.log, self.every_s, self.bar = label, total, log, every_s, bar
        self.done, self.start = 0.0, time.monotonic()
        self._last = self.start
        self._id = bar.add_task(label, total=total) if bar is not None else None

    def advance(self, amount: float = 1.0) -> None:
        self.done += amount
        if self.bar is not None:
            self.bar.update(self._id, completed=self.done)
            return
        now = time.monotonic()
        if self.total and now - self._last >= self.every_s:
            self._last = now
            self.log(f"{self.label}: {100 * self.done / self.total:.0f}% ({now - self.start:.0f} s)")


@contextmanager
def task(
    label: str, total: float | None = None, log: Callable[[str], None] | None = print, every_s: float = 10.0
) -> Iterator[Task]:
    """`with task("tokenizing", total=n_bytes, log=log) as t: ... t.advance(k)`; `log=None`: quiet
    (ranks other than 0)."""
    if log is None:
        yield Task(label, None, lambda _: None, every_s, None)
        return
    if on_a_terminal():
        console = Console(stderr=True, no_color=bool(os.environ.get("NO_COLOR")))
        columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TaskProgressColumn()]
        with Progress(*columns, TimeElapsedColumn(), console=console) as bar:
            yield Task(label, total, log, every_s, bar)
        return
    log(f"{label} ...")
    t = Task(label, total, log, every_s, None)
    yield t
    log(f"{label}: done in {time.monotonic() - t.start:.1f} s")
