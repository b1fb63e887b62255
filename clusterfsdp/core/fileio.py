"""File primitives every writer of a run folder, the data cache and the model sources shares:
a file replaced whole (never seen half-written), a JSON line appended, and the reading back of
files another program or user may have written or planted (run roots are shared).

Reading is bounded in both senses: only regular files are opened (`open_regular`: a FIFO planted
in a shared run root would block its reader forever, /dev/zero would never end), and JSON is
parsed with a bound on its nesting (`loads`: a deeply nested file raised RecursionError, which no
caller expects, and broke `runs` for the whole run root).

Apart from `runfolder` so that what needs only these (`validate`'s data and model checks) does not
import the run folder's records and their dataclasses: start-up is paid on every call."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

# Our own files nest a few levels (state.json: attempts, their leader and exit codes); deeper is
# not ours. Bounded well below the interpreter's recursion limit, which `repr` or `json.dumps` of
# a value nested a little less than json's own limit would still hit later, deeper in a stack.
MAX_JSON_DEPTH = 64

# A job file is a few KB; anything far larger is a mistake (`validate /dev/zero`, a data file).
MAX_JOB_FILE_BYTES = 1 << 20

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))  # fmt: skip


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one line; a single write() of a short line is atomic on local filesystems and NFS appends."""
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


class NotRegularFile(OSError):
    """A FIFO, a socket or a device where a file was to be read (its strerror says which)."""


def _refuse_special(path: Path, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder", str(path))
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        raise NotRegularFile(errno.EINVAL, f"not a regular file ({kind})", str(path))


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading in binary, if it is a regular file (symlinks followed): a FIFO, a
    socket or a device (or a link to one) raises NotRegularFile ("not a regular file (a FIFO)") without
    being opened, so it never blocks, never reads without end and never runs a driver's open.
    Checked again on the open file (O_NONBLOCK: a FIFO swapped in between does not block either)."""
    _refuse_special(path, os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _refuse_special(path, os.fstat(fd).st_mode)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: Path, limit: int | None = None) -> bytes:
    """The content of a regular file (at most `limit` bytes); OSError otherwise (`open_regular`)."""
    with open_regular(path) as f:
        return f.read() if limit is None else f.read(limit)


def read_text(path: Path, limit: int | None = None) -> str:
    """`read_bytes` as UTF-8 (UnicodeDecodeError, a ValueError, when it is not)."""
    return read_bytes(path, limit).decode()


def loads(data: bytes | str) -> Any:
    """`json.loads` for files we did not necessarily write: ValueError (as for any JSON error) for
    nesting deeper than MAX_JSON_DEPTH, never RecursionError."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    if too_deep(value):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `value` nests containers more than `limit` deep (iterative: no recursion to overflow)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


def load_json(path: Path, limit: int | None = None) -> Any:
    """A JSON file another program may have written: `loads` of `read_bytes`. OSError or ValueError."""
    return loads(read_bytes(path, limit))


def parse_lines(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects among the lines of `data`: parsed as one array (one call, not one per
    line), or line by line when some line is not JSON (that line is skipped)."""
    lines = [line for line in data.split(b"\n") if line.strip()]
    try:
        rows = loads(b"[" + b",".join(lines) + b"]")
    except ValueError:  # JSON or UTF-8 errors, or too deep: find the bad lines one by one
        rows = []
        for line in lines:
            try:
                rows.append(loads(line))
            except ValueError:
                pass
    return [r for r in rows if isinstance(r, dict)]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line that is a JSON object; a torn last line (writer killed mid-write), a
    line that is not UTF-8 or not an object is skipped, not fatal (`parse_lines`). No file, or one
    that is not a regular file (a folder, a FIFO), reads as empty."""
    try:
        return parse_lines(read_bytes(path))
    except OSError:
        return []
