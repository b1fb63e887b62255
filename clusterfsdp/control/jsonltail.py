"""Reading the JSON lines a writer appends (metrics.jsonl, events.jsonl) without reading the whole
file each time: `JsonlTail` hands out the complete lines appended since the last call (the TUI's
charts and the notebook's progress line poll it), `newest` walks back from the end until it
has what it was asked for (`status` and `runs` want the last logged row and the last evaluation,
so listing 10,000 runs costs what their last lines cost, not their whole histories).

Tolerant in both directions: a torn last line (the writer is mid-write) is left for the next call,
and a line that is not a JSON object, not UTF-8, nested too deep (`fileio.loads`) or longer than a
chunk is skipped, never fatal; a path that is not a regular file (a planted FIFO) reads as empty.
Polling by byte offset, not inotify, which sees nothing on NFS.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..core import fileio

CHUNK_BYTES = 1 << 20
Row = dict[str, Any]


class JsonlTail:
    """The complete lines appended to one JSONL file since the last `read_new()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read_new(self, chunk_bytes: int = CHUNK_BYTES) -> list[list[Row]]:
        """The new rows, a chunk (at most `chunk_bytes` of lines) per list, so a caller that keeps
        columns never holds more than a chunk of parsed rows at once. A line longer than a chunk
        is not a row of ours: it is skipped. Empty if nothing new (or no file yet)."""
        out = []
        try:
            with fileio.open_regular(self.path) as f:
                while True:
                    f.seek(self.offset)
                    data = f.read(chunk_bytes)
                    end = data.rfind(b"\n") + 1  # a torn last line is read again next time
                    if end == 0:
                        if len(data) < chunk_bytes:
                            break
                        self.offset += len(data)  # an over-long line: skipped, a chunk at a time
                        continue
                    self.offset += end
                    out.append(fileio.parse_lines(data[:end]))
        except OSError:  # no file yet, or not a regular file (a FIFO would block): nothing to read
            pass
        return out

    def new_rows(self) -> list[Row]:
        """The new rows in one list (for callers that take each row as it comes)."""
        return [row for chunk in self.read_new() for row in chunk]


def newest(path: Path, wanted: Sequence[Callable[[Row], bool]], max_bytes: int = 4 << 20) -> list[Row | None]:
    """For each predicate of `wanted`, the newest row for which it holds (None if none), read
    backwards from the end of the file, a line at a time in growing chunks, stopping when every
    one is found or after `max_bytes`: the cost of a long history is its last lines."""
    found: list[Row | None] = [None] * len(wanted)
    try:
        with fileio.open_regular(path) as f:
            end = f.seek(0, os.SEEK_END)
            read, size = 0, 4096
            carry = b""  # the start of a line whose beginning lies in the chunk before
            while end > 0 and read < max_bytes and None in found:
                size = min(size * 2, end, max_bytes - read)
                end -= size
                f.seek(end)
                data = f.read(size) + carry
                read += size
                cut = data.find(b"\n") + 1 if end > 0 else 0  # the first line may be incomplete
                if end > 0 and cut == 0:  # no line starts in here: read on back (within max_bytes)
                    carry = data
                    continue
                carry = data[:cut]
                for line in reversed(data[cut:].split(b"\n")):
                    row = _row(line)
                    if row is None:
                        continue
                    for i, test in enumerate(wanted):
                        if found[i] is None and test(row):
                            found[i] = row
                    if None not in found:
                        break
    except OSError:  # no file, not a regular file, not readable: nothing logged
        pass
    return found


def _row(line: bytes) -> Row | None:
    if not line.strip():
        return None
    try:
        row = fileio.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None
