"""A log file read by byte offsets, so a 1 GB log costs what is on screen, not what is on disk.

The log view holds a window of at most a few tens of thousands of lines. Opening a file reads
only its last megabyte; following reads only the bytes written since the last poll; search and
"first error" stream the file in chunks (in a worker) and return a byte offset, around which a
new window is read. Polling, not inotify: inotify sees nothing on NFS, where cluster logs live.
Nothing here touches the UI, so it is tested and benchmarked on its own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from clusterfsdp.core import fileio

CHUNK_BYTES = 1 << 20
# A "line" longer than this (a binary dump, a progress bar without newlines) is cut, so a scan
# never holds more than this much of one line in memory.
MAX_LINE_BYTES = 1 << 20


@dataclass
class Chunk:
    """Lines read from one byte range: `offsets[i]` is where `lines[i]` starts in the file."""

    start: int
    end: int  # offset just past the last complete line (a trailing partial line is not counted)
    lines: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    partial: bool = False  # the last line has no newline yet: it is shown, and read again next poll
    reset: bool = False  # the file shrank or grew too fast: the caller should reopen at the tail


def split_lines(data: bytes, base: int, keep_partial: bool) -> Chunk:
    """Split `data` (which starts at file offset `base`, at a line start) into lines."""
    parts = data.split(b"\n")
    rest = parts.pop()
    lines, offsets, pos = [], [], base
    for raw in parts:
        offsets.append(pos)
        lines.append(raw.decode("utf-8", "replace").rstrip("\r"))
        pos += len(raw) + 1
    chunk = Chunk(base, pos, lines, offsets)
    if rest and keep_partial:
        chunk.lines.append(rest.decode("utf-8", "replace").rstrip("\r"))
        chunk.offsets.append(pos)
        chunk.partial = True
    return chunk


@dataclass(frozen=True)
class Search:
    """What to look for in a log's bytes. `pattern` decides whether a line matches; every match
    contains one of `literals` (lower-cased when `fold`), which find the candidate lines at
    `bytes.find` speed: Python's regex engine scans an alternation like ERRORS' at ~20 MB/s,
    `find` at memory speed, and a 1 GB log must not take a minute to reach its first error."""

    pattern: re.Pattern[bytes]
    literals: tuple[bytes, ...]
    fold: bool = False

    @property
    def text(self) -> re.Pattern[str]:
        """The same search over decoded lines (for the lines already on screen)."""
        return re.compile(self.pattern.pattern.decode(), self.pattern.flags & re.IGNORECASE)

    def _line(self, data: bytes, at: int) -> tuple[int, int]:
        start = data.rfind(b"\n", 0, at) + 1
        end = data.find(b"\n", at)
        return start, len(data) if end < 0 else end

    def first_line(self, data: bytes) -> int | None:
        """Where the first matching line of `data` starts."""
        hay = data.lower() if self.fold else data
        next_at = {lit: hay.find(lit) for lit in self.literals}
        while live := [i for i in next_at.values() if i >= 0]:
            start, end = self._line(data, min(live))
            if self.pattern.search(data, start, end):
                return start
            for lit, at in next_at.items():  # the whole line was checked: go on after it
                if 0 <= at <= end:
                    next_at[lit] = hay.find(lit, end + 1)
        return None

    def last_line(self, data: bytes) -> int | None:
        """Where the last matching line of `data` starts."""
        hay = data.lower() if self.fold else data
        prev_at = {lit: hay.rfind(lit) for lit in self.literals}
        while live := [i for i in prev_at.values() if i >= 0]:
            start, end = self._line(data, max(live))
            if self.pattern.search(data, start, end):
                return start
            for lit, at in prev_at.items():  # go on before the line
                if at >= start:
                    prev_at[lit] = hay.rfind(lit, 0, start)
        return None


# What "first error" jumps to: Python tracebacks and exception names, log levels, C-level deaths.
ERRORS = Search(
    re.compile(
        rb"Traceback \(most recent call last\)|Error\b|Exception\b|\bERROR\b|\bFATAL\b|\berror:"
        rb"|Segmentation fault|out of memory|\bKilled\b"
    ),
    (
        b"Traceback (most recent call last)",
        b"Error",
        b"Exception",
        b"ERROR",
        b"FATAL",
        b"error:",
        b"Segmentation fault",
        b"out of memory",
        b"Killed",
    ),
)
ERROR_TEXT = ERRORS.text


def compile_query(text: str) -> Search:
    """A literal search; smart case like less -i: case matters only if `text` has capitals."""
    fold = not any(c.isupper() for c in text)
    needle = text.encode()
    return Search(
        re.compile(re.escape(needle), re.IGNORECASE if fold else 0), (needle.lower() if fold else needle,), fold
    )


class LogFile:
    """One log file, read from the end; `end` is how far complete lines have been consumed."""

    def __init__(self, path: Path, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.path = path
        self.chunk_bytes = chunk_bytes
        self.end = 0

    def size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            return 0

    def _read(self, start: int, stop: int) -> bytes:
        with fileio.open_regular(self.path) as f:
            f.seek(start)
            return f.read(max(0, stop - start))

    def tail(self, max_bytes: int = CHUNK_BYTES) -> Chunk:
        """The last lines of the file within `max_bytes`; following continues from here."""
        size = self.size()
        start = max(0, size - max_bytes)
        data = self._read(start, size)
        if start > 0:  # the first line is cut: skip to the next line start
            cut = data.find(b"\n") + 1
            data, start = data[cut:], start + cut
        chunk = split_lines(data, start, keep_partial=True)
        self.end = chunk.end
        return chunk

    def read_new(self, max_bytes: int = 4 * CHUNK_BYTES) -> Chunk:
        """Bytes written since the last call (only those). If the file shrank (rotated, rewritten)
        or more than `max_bytes` arrived, the chunk says `reset` and nothing is read."""
        size = self.size()
        if size < self.end or size - self.end > max_bytes:
            return Chunk(self.end, self.end, reset=True)
        chunk = split_lines(self._read(self.end, size), self.end, keep_partial=True)
        self.end = chunk.end
        return chunk

    def before(self, offset: int, max_bytes: int = CHUNK_BYTES) -> Chunk:
        """Complete lines that end at `offset` (a line start), reading at most `max_bytes`."""
        start = max(0, offset - max_bytes)
        data = self._read(start, offset)
        if start > 0:
            cut = data.find(b"\n") + 1
            data, start = data[cut:], start + cut
        return split_lines(data, start, keep_partial=False)

    def after(self, offset: int, max_bytes: int = CHUNK_BYTES) -> Chunk:
        """Lines from `offset` (a line start) within `max_bytes`; the last one may be partial at EOF."""
        size = self.size()
        stop = min(size, offset + max_bytes)
        return split_lines(self._read(offset, stop), offset, keep_partial=stop == size)

    def around(self, offset: int, max_bytes: int = CHUNK_BYTES) -> Chunk:
        """A window with the line at `offset` a quarter of the way down (context above, more below)."""
        above = self.before(offset, max_bytes // 4)
        below = self.after(offset, max_bytes - max_bytes // 4)
        return Chunk(
            above.start, below.end, above.lines + below.lines, above.offsets + below.offsets, partial=below.partial
        )

    def search_forward(self, search: Search, start: int, cancelled: Callable[[], bool] = lambda: False) -> int | None:
        """Start offset of the first line at or after `start` (a line start) that matches."""
        pos, carry = start, b""
        with fileio.open_regular(self.path) as f:
            f.seek(start)
            while not cancelled():
                block = f.read(self.chunk_bytes)
                data = carry + block
                if not block:  # EOF: a last line without a newline
                    hit = search.first_line(data)
                    return None if hit is None else pos + hit
                cut = data.rfind(b"\n") + 1
                if cut == 0 and len(data) < MAX_LINE_BYTES:
                    carry = data
                    continue
                cut = cut or len(data)
                body, carry = data[:cut], data[cut:]
                hit = search.first_line(body)
                if hit is not None:
                    return pos + hit
                pos += cut
        return None

    def search_backward(self, search: Search, start: int, cancelled: Callable[[], bool] = lambda: False) -> int | None:
        """Start offset of the last line before `start` (a line start) that matches."""
        pos, head = start, b""  # head: the first, incomplete line of the previous block
        with fileio.open_regular(self.path) as f:
            while pos > 0 and not cancelled():
                lo = max(0, pos - self.chunk_bytes)
                f.seek(lo)
                data = f.read(pos - lo) + head
                base = lo
                if lo > 0:
                    cut = data.find(b"\n") + 1
                    if cut == 0 and len(data) < MAX_LINE_BYTES:
                        head, pos = data, lo
                        continue
                    head, data, base = data[:cut], data[cut:], lo + cut
                hit = search.last_line(data)
                if hit is not None:
                    return base + hit
                pos = lo
        return None
