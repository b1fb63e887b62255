"""`.txt` sources (maybe .gz / .zst): each file is one document. One larger than a unit is cut
at line ends (at a character boundary where a line is longer than PIECE_BYTES), and its
document continues across the shards of its units; it is tokenized in pieces of about
PIECE_BYTES, each its own encode call (a token never spans a piece boundary). Pure Python."""

from __future__ import annotations

from typing import IO, Any

from ..core import spec as specmod
from .filekind import PIECE_BYTES, SNIFF_BYTES, SourceUnit, UnitReading
from .formats import utf8_error
from .linefiles import LineFile, char_start
from .sources import DataError, Source


class TextFile(LineFile):
    name = "txt"
    suffix = ".txt"
    one_document = True

    def sniff_head(self, f: IO[bytes], where: str, data: specmod.DataSection) -> list[str]:
        head = f.read(SNIFF_BYTES)
        if not head.strip():
            return [f"{where}: empty file (no text)"]
        problem = utf8_error(head, where, final=len(head) < SNIFF_BYTES)
        return [problem] if problem else []

    def read(self, reader: UnitReading, src: Source, unit: SourceUnit, writer: Any) -> None:
        data = reader.unit_bytes(src, unit)
        if utf8_error(data, src.path) is not None:
            raise DataError(str(utf8_error(data, f"{src.field}: {src.path}", reader.first_line(src, unit))))
        pieces, pos = [], 0
        while pos < len(data):
            end = len(data) if pos + PIECE_BYTES >= len(data) else data.rfind(b"\n", pos, pos + PIECE_BYTES) + 1
            if end <= pos:  # no newline: cut at a character boundary
                end = char_start(data, pos + PIECE_BYTES)
            pieces.append(data[pos:end].decode("utf-8"))
            pos = end
        reader.encode_document(pieces, unit, writer)


KIND = TextFile()
