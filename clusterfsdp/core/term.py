"""Terminal output for the CLI: text from files is shown as text, and colour only where a person
reads it.

Run roots are shared, so a run's folder name, job id, reasons and log excerpts may come from
another user, and a string with escape sequences would drive the reader's terminal (set its
title, clear the screen, write the clipboard with OSC 52). `printable` writes every control
character as its escape (ESC as `\\x1b`); `SafeStream` is the one place the CLI's output goes
through it (`cli.main` puts it in front of stdout and stderr for every command), and the TUI's
tables show `printable` cells. Only a log's own bytes (`logs`, `--follow`) are written as they
are, to `raw(stream)`, as `cat` would, and only when the log is yours (cli `_log_output`).

Colour (`style`) only on a TTY, never in pipes, files or scripts, and never when $NO_COLOR is set
(no-color.org) or TERM is 'dumb'. Plain ANSI codes: the CLI starts without importing rich. Codes
meant for a SafeStream are written with a random mark of this process, which it turns into ESC
after escaping everything else: text read from a file cannot carry the mark."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterable, Iterator
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # (state_style compares values: every command imports this module, not the records)
    from .records import RunState

_CODES = {"red": "31", "green": "32", "yellow": "33", "cyan": "36", "bold": "1", "dim": "2"}
# C0 controls but newline and tab, DEL, C1 controls, and the marks that reorder a line's display
# (bidirectional overrides, isolates): what a terminal acts on or a reader could be misled by.
# Lone surrogates too (a folder name that is not UTF-8, a JSON "\udcff"): a UTF-8 terminal's
# stream cannot encode them, and printing one raised UnicodeEncodeError.
_OTHERS = "\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_CONTROL = re.compile(f"[\x00-\x08\x0b-\x1f{_OTHERS}]")
_CONTROL_IN_LINE = re.compile(f"[\x00-\x1f{_OTHERS}]")
_MARK = f"\ue000{os.urandom(8).hex()}\ue001"  # stands for ESC + '[' in text meant for a SafeStream


def _escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape", "backslashreplace").decode("ascii")


def printable(text: str, lines: bool = True) -> str:
    """`text` with every control character written as its escape (`\\x1b`, `\\r`, `\\u202e`);
    newlines and tabs kept with `lines`, escaped too without (a table cell, one line)."""
    return (_CONTROL if lines else _CONTROL_IN_LINE).sub(_escape, text)


class SafeStream:
    """A text stream in front of `raw` that writes `printable` text, but for the colour codes
    `style` wrote for it. Everything else is the raw stream's (isatty, fileno, flush, ...)."""

    def __init__(self, raw: IO[str]) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        return self.raw.write(printable(text).replace(_MARK, "\x1b["))

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def raw(stream: IO[str]) -> IO[str]:
    """The stream under a SafeStream (or `stream` itself): where a log's own bytes go."""
    return stream.raw if isinstance(stream, SafeStream) else stream


@contextlib.contextmanager
def safe_output() -> Iterator[None]:
    """stdout and stderr through SafeStream while a command runs."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(out), SafeStream(err)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def use_colour(stream: IO[str]) -> bool:
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def style(text: str, name: str, stream: IO[str]) -> str:
    if not use_colour(stream):
        return text
    esc = _MARK if isinstance(stream, SafeStream) else "\x1b["
    return f"{esc}{_CODES[name]}m{text}{esc}0m"


def state_style(state: RunState) -> str:
    """The colour of a run state: red for bad ends, green for completed, cyan for live. (A state
    is a string enum: compared by its value, so that this module, which every command imports,
    does not import the records.)"""
    if state.bad:
        return "red"
    if state == "COMPLETED":
        return "green"
    if state.live:
        return "cyan"
    return "yellow" if state == "CANCELLED" else "dim"


def state_text(state: RunState, width: int, stream: IO[str]) -> str:
    """The state padded to `width` (padding outside the colour codes, so columns line up)."""
    return style(str(state), state_style(state), stream) + " " * max(0, width - len(state))
