"""What a record is, in one place for `validate` (which reads the first record of each source)
and for prepare (which reads them all): the text of a text record, the messages of a chat
record, and the one-line errors naming file:line or row. Pure Python."""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import IO

from ..core import spec as specmod
from .fieldmap import FieldMap
from .sources import DataError


def utf8_error(data: bytes, where: str, first_line: int = 1, final: bool = True) -> str | None:
    """'<where>:<line>: not UTF-8 (...)' if `data` is not valid UTF-8 (an incomplete last
    character is fine unless `final`)."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=final)
        return None
    except UnicodeDecodeError as e:
        line = first_line + data.count(b"\n", 0, e.start)
        return f"{where}:{line}: not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); re-encode the file"


def column_problem(where: str, data: specmod.DataSection, columns: list[str]) -> str | None:
    """The error line for a table (parquet, dataset) without a column the record mapping reads."""
    fm = FieldMap.of(data)
    missing = [c for c in fm.columns() if c not in columns]
    if not missing:
        return None
    field = fm.field if not fm.templated else f"a template of {fm.where or 'the source'}"
    return f"{where}: no column {missing[0]!r} ({field}; it has: {', '.join(columns)})"


def parse_json_line(line: bytes, fields: FieldMap, file: str, line_no: int) -> str | list[dict[str, str]]:
    """The text or messages of one .jsonl line; DataError naming file:line otherwise."""
    try:
        record = json.loads(line.rstrip(b"\r\n"))
    except UnicodeDecodeError:
        raise DataError(utf8_error(line, file, line_no) or f"{file}:{line_no}: not UTF-8") from None
    except json.JSONDecodeError as e:
        # ("Unterminated string starting at" ends with its own "at")
        raise DataError(f"{file}:{line_no}: not valid JSON ({e.msg.removesuffix(' at')} at column {e.colno})") from None
    return fields.apply(record, f"{file}:{line_no}")


def first_line(stream: IO[bytes], limit: int) -> tuple[int, bytes]:
    """(line number, bytes) of the first non-blank line within `limit` bytes; (0, b'') if none."""
    n = 0
    read = 0
    while read < limit:
        line = stream.readline(limit - read)
        if not line:
            break
        n += 1
        read += len(line)
        if line.strip():
            return n, line
    return 0, b""


def has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False
