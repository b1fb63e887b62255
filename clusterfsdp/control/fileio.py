"""File primitives every writer of a run folder, the data cache and the model sources shares:
a file replaced whole (never seen half-written), a JSON line appended, the JSON lines read back.

Apart from `runfolder` so that what needs only these (`validate`'s data and model checks) does not
import the run folder's records and their dataclasses: start-up is paid on every call."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from . import jsonltail


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one line; a single write() of a short line is atomic on local filesystems and NFS appends."""
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line that is a JSON object; a torn last line (writer killed mid-write), a
    line that is not UTF-8 or not an object is skipped, not fatal (jsonltail.parse_lines)."""
    try:
        return jsonltail.parse_lines(path.read_bytes())
    except (FileNotFoundError, IsADirectoryError):
        return []
