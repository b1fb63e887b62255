"""`.jsonl` sources (maybe .gz / .zst): one record per line, a JSON object whose fields the
record mapping reads (`data.fieldmap`). Units are cut at line ends; a record longer than a
unit of a compressed stream is read on into the next. Pure Python."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import IO

from ..core import spec as specmod
from ..core.spec import badrecords
from .fieldmap import FieldMap, MissingKey
from .filekind import SNIFF_BYTES, Record, SourceUnit, UnitReading
from .formats import first_line, parse_json_line
from .linefiles import LineFile
from .sources import DataError, Source


class JsonLines(LineFile):
    name = "jsonl"
    suffix = ".jsonl"

    def sniff_head(self, f: IO[bytes], where: str, data: specmod.DataSection) -> list[str]:
        line_no, line = first_line(f, SNIFF_BYTES)
        if not line_no:
            return [f"{where}: no records in its first {SNIFF_BYTES >> 20} MiB (empty file?)"]
        if not line.endswith(b"\n") and len(line) >= SNIFF_BYTES:
            return []  # a record longer than what we read: prepare checks it
        try:
            parse_json_line(line, FieldMap.of(data), where, line_no)
        except DataError as e:
            policy = badrecords.parse(data.bad_records)
            if isinstance(e, MissingKey) and data.sources:  # a source's mapping that names no field of its records
                return [str(e)]
            return [] if policy is not None and policy.skip else [str(e)]  # skipping: prepare counts it
        return []

    def records(self, reader: UnitReading, src: Source, unit: SourceUnit) -> Iterator[Record]:
        data = reader.unit_bytes(src, unit)
        first = unit.first_line
        file = f"{src.field}: {src.path}"
        for n, line in enumerate(data.splitlines()):
            if not line.strip():
                continue
            try:
                value = parse_json_line(line, reader.fields, file, first + n)
            except DataError as e:
                error = e
                if not first:  # the error again, now with the file's line number
                    first = reader.first_line(src, unit)
                    try:
                        parse_json_line(line, reader.fields, file, first + n)
                    except DataError as located:
                        error = located
                reader.bad(error)
                continue
            yield value, _Lazy(lambda n=n: f"{file}:{reader.first_line(src, unit) + n}")


class _Lazy:
    """A record's location, worked out only if an error names it (the line number of a record in
    a unit that starts mid-file takes counting the lines before it)."""

    def __init__(self, text: Callable[[], str]):
        self.text = text

    def __str__(self) -> str:
        return self.text()


KIND = JsonLines()
