"""What a record is, in one place for `validate` (which reads the first record of each source)
and for prepare (which reads them all): the text of a text record, the messages of a chat
record, and the one-line errors naming file:line or row. Pure Python."""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import IO, Any

from ..control import spec as specmod
from .sources import DataError

MESSAGE_KEYS = ("role", "content")


def utf8_error(data: bytes, where: str, first_line: int = 1, final: bool = True) -> str | None:
    """'<where>:<line>: not UTF-8 (...)' if `data` is not valid UTF-8 (an incomplete last
    character is fine unless `final`)."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=final)
        return None
    except UnicodeDecodeError as e:
        line = first_line + data.count(b"\n", 0, e.start)
        return f"{where}:{line}: not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); re-encode the file"


def record_key(data: specmod.DataSection) -> str:
    """The record field the job reads: the text, or the messages of a conversation."""
    return data.messages_key if data.format == "chat" else data.text_key


def record_field(data: specmod.DataSection) -> str:
    """The job.toml key that names it."""
    return "data.messages_key" if data.format == "chat" else "data.text_key"


def column_problem(where: str, data: specmod.DataSection, columns: list[str]) -> str | None:
    """The error line for a table (parquet, dataset) without the record key's column."""
    key = record_key(data)
    if key in columns:
        return None
    return f"{where}: no column {key!r} ({record_field(data)}; it has: {', '.join(columns)})"


def record_value(record: Any, data: specmod.DataSection, where: str) -> str | list[dict[str, str]]:
    """The text (format 'text') or messages (format 'chat') of one decoded record; DataError
    naming `where` (file:line or file row) and the key when the record does not have them."""
    key = record_key(data)
    if not isinstance(record, dict):
        raise DataError(f"{where}: not a JSON object")
    if key not in record:
        has = ", ".join(sorted(map(str, record))[:8]) or "none"
        raise DataError(f"{where}: no {key!r} key ({record_field(data)}; the record has: {has})")
    value = record[key]
    if data.format == "text":
        if not isinstance(value, str):
            raise DataError(f"{where}: {key!r} is {type(value).__name__}, not a string")
        return value
    return check_messages(value, key, where)


def check_messages(value: Any, key: str, where: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: {key!r} must be a non-empty list of {{role, content}} messages")
    for n, m in enumerate(value):
        if not isinstance(m, dict) or not all(isinstance(m.get(k), str) for k in MESSAGE_KEYS):
            raise DataError(f"{where}: {key}[{n}] is not an object with string 'role' and 'content'")
    if not any(m["role"] == "assistant" for m in value):
        raise DataError(f"{where}: {key!r} has no 'assistant' message: nothing to train on")
    return value


def parse_json_line(line: bytes, data: specmod.DataSection, file: str, line_no: int) -> str | list[dict[str, str]]:
    """The text or messages of one .jsonl line; DataError naming file:line otherwise."""
    try:
        record = json.loads(line.rstrip(b"\r\n"))
    except UnicodeDecodeError:
        raise DataError(utf8_error(line, file, line_no) or f"{file}:{line_no}: not UTF-8") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{file}:{line_no}: not valid JSON ({e.msg} at column {e.colno})") from None
    return record_value(record, data, f"{file}:{line_no}")


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
