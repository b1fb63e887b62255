"""Terminal styling for the CLI: colour only where a person reads it (a TTY), never in pipes,
files or scripts, and never when $NO_COLOR is set (no-color.org) or TERM is 'dumb'. Plain ANSI
codes: the CLI starts without importing rich."""

from __future__ import annotations

import os
from typing import IO

from .control.records import RunState

_CODES = {"red": "31", "green": "32", "yellow": "33", "cyan": "36", "bold": "1", "dim": "2"}


def use_colour(stream: IO[str]) -> bool:
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def style(text: str, name: str, stream: IO[str]) -> str:
    return f"\x1b[{_CODES[name]}m{text}\x1b[0m" if use_colour(stream) else text


def state_style(state: RunState) -> str:
    """The colour of a run state: red for bad ends, green for completed, cyan for live."""
    if state.bad:
        return "red"
    if state is RunState.COMPLETED:
        return "green"
    if state.live:
        return "cyan"
    return "yellow" if state is RunState.CANCELLED else "dim"


def state_text(state: RunState, width: int, stream: IO[str]) -> str:
    """The state padded to `width` (padding outside the colour codes, so columns line up)."""
    return style(str(state), state_style(state), stream) + " " * max(0, width - len(state))
