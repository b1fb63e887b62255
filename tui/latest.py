"""Results of the TUI's exclusive thread workers: the newest request wins.

Textual's `exclusive=True` cancels the older worker of a group when a newer one starts, but a
thread cannot be stopped: the older read goes on and hands its result to the screen when it ends,
which may be after the newer one's (a Data view once kept source 0 on screen after s had asked
for source 1). `deliver` drops the result of a worker cancelled meanwhile. The check runs on the
app's thread, where Textual cancels workers, so it is exact."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.app import App
from textual.worker import get_current_worker


def deliver(app: App, callback: Callable[..., object], *args: Any) -> None:
    """From a thread worker: call `callback(*args)` on the app's thread unless a newer worker of
    the group (or the screen's removal) has cancelled this one by then."""
    worker = get_current_worker()

    def unless_overtaken() -> None:
        if not worker.is_cancelled:
            callback(*args)

    app.call_from_thread(unless_overtaken)
