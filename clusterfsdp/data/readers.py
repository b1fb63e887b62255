"""Reading a unit of a source and tokenizing it into one shard (in any process of the pool).

A .txt file is one document. One larger than a unit is tokenized in line-aligned pieces of
about PIECE_BYTES (each its own encode call, so a token never spans a piece boundary); its
document continues across the shards of its units. Records (.jsonl, parquet, datasets) are
encoded in batches of about BATCH_BYTES of text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core import spec as specmod
from ..core.spec import badrecords
from .fieldmap import FieldMap
from .formats import parse_json_line, utf8_error
from .recordparts import record_chars
from .shards import ShardStats, ShardWriter
from .skipped import BAD_KEPT
from .sources import DataError, Source
from .tokens import DocumentEncoder, Encoded
from .units import PIECE_BYTES, SourceUnit, char_start, load_hf_dataset

BATCH_BYTES = 1 << 20  # records' text per encode call
ROWS_PER_READ = 1024  # parquet / dataset rows read at once


@dataclass(frozen=True)
class ReadTask:
    """What a prepare process needs besides a unit (pickled once per process of the pool)."""

    data: specmod.DataSection
    sources: tuple[Source, ...]
    shards: str
    cache: str


class UnitReader:
    """One process's tokenizer and open datasets; `run(unit)` writes one complete shard."""

    def __init__(self, task: ReadTask):
        self.task = task
        self.encoder = DocumentEncoder(task.data.tokenizer)
        self.format = task.data.format
        self.fields = FieldMap.of(task.data)
        policy = badrecords.parse(task.data.bad_records)
        self.skip_bad = policy is not None and policy.skip
        self._datasets: dict[int, Any] = {}
        self._lines: dict[tuple[int, int], int] = {}  # (source, start) -> line number of a unit's start
        self._stats: ShardStats | None = None  # of the unit being read

    def run(self, unit: SourceUnit) -> ShardStats:
        cpu = time.process_time()
        src = self.task.sources[unit.source]
        writer = ShardWriter(Path(self.task.shards), unit.shard, self.encoder, self.format != "text")
        self._stats = writer.stats
        if src.kind == "txt":
            self._txt(src, unit, writer)
        elif src.kind == "jsonl":
            self._records(self._jsonl(src, unit), writer)
        elif src.kind == "parquet":
            self._records(self._parquet(src, unit), writer)
        else:
            self._records(self._dataset(src, unit), writer)
        writer.stats.cpu_s = time.process_time() - cpu
        return writer.finish(unit.weight)

    # ---- reading
    def _bytes(self, src: Source, unit: SourceUnit) -> bytes:
        if unit.payload is not None:
            return unit.payload
        with open(src.path, "rb") as f:
            f.seek(unit.start)
            return f.read(unit.stop - unit.start)

    def _bad(self, error: DataError) -> None:
        """A record that cannot be read: counted and left out with data.bad_records = 'skip' (the
        limit is the prepare's to check, over all shards), else the prepare's error."""
        if not self.skip_bad:
            raise error
        assert self._stats is not None
        self._stats.records += 1
        self._stats.bad += 1
        if len(self._stats.bad_at) < BAD_KEPT:
            self._stats.bad_at.append(str(error))

    def _first_line(self, src: Source, unit: SourceUnit) -> int:
        """Line number of the unit's first byte (counted from the file's start, once per unit, only
        when a record's location is needed)."""
        if unit.first_line:
            return unit.first_line
        if (unit.source, unit.start) not in self._lines:
            self._lines[(unit.source, unit.start)] = self._count_lines(src, unit)
        return self._lines[(unit.source, unit.start)]

    def _count_lines(self, src: Source, unit: SourceUnit) -> int:
        line = 1
        with open(src.path, "rb") as f:
            left = unit.start
            while left > 0:
                block = f.read(min(left, 1 << 24))
                line += block.count(b"\n")
                left -= len(block)
        return line

    def _txt(self, src: Source, unit: SourceUnit, writer: ShardWriter) -> None:
        data = self._bytes(src, unit)
        if utf8_error(data, src.path) is not None:
            raise DataError(str(utf8_error(data, f"{src.field}: {src.path}", self._first_line(src, unit))))
        pieces, pos = [], 0
        while pos < len(data):
            end = len(data) if pos + PIECE_BYTES >= len(data) else data.rfind(b"\n", pos, pos + PIECE_BYTES) + 1
            if end <= pos:  # no newline: cut at a character boundary
                end = char_start(data, pos + PIECE_BYTES)
            pieces.append(data[pos:end].decode("utf-8"))
            pos = end
        enc = self.encoder
        parts = ([enc.prefix] if unit.doc_start else []) + enc.pieces(pieces)
        if unit.doc_end:
            parts.append(np.asarray([enc.eos], enc.dtype))
        writer.add(Encoded(np.concatenate(parts) if parts else np.zeros(0, enc.dtype)), unit.doc_start)

    def _jsonl(self, src: Source, unit: SourceUnit) -> Iterator[tuple[Any, object]]:
        data = self._bytes(src, unit)
        first = unit.first_line
        file = f"{src.field}: {src.path}"
        for n, line in enumerate(data.splitlines()):
            if not line.strip():
                continue
            try:
                value = parse_json_line(line, self.fields, file, first + n)
            except DataError as e:
                error = e
                if not first:  # the error again, now with the file's line number
                    first = self._first_line(src, unit)
                    try:
                        parse_json_line(line, self.fields, file, first + n)
                    except DataError as located:
                        error = located
                self._bad(error)
                continue
            yield value, _Lazy(lambda n=n: f"{file}:{self._first_line(src, unit) + n}")

    def _rows(self, src: Source, rows: list[dict[str, Any]], first_row: int) -> Iterator[tuple[Any, object]]:
        for n, row in enumerate(rows):
            where = f"{src.field}: {src.path} row {first_row + n}"
            try:
                record = self.fields.apply(row, where)
            except DataError as e:
                self._bad(e)
                continue
            yield record, where

    def _parquet(self, src: Source, unit: SourceUnit) -> Iterator[tuple[Any, object]]:
        # pyarrow only for Parquet files
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(src.path)
        row = unit.first_line
        for group in range(unit.start, unit.stop):
            table = pf.read_row_group(group, columns=self.fields.columns())
            for at in range(0, table.num_rows, ROWS_PER_READ):
                yield from self._rows(src, table.slice(at, ROWS_PER_READ).to_pylist(), row + at)
            row += table.num_rows

    def _dataset(self, src: Source, unit: SourceUnit) -> Iterator[tuple[Any, object]]:
        if unit.source not in self._datasets:
            self._datasets[unit.source] = load_hf_dataset(src, self.task.data, Path(self.task.cache))
        ds = self._datasets[unit.source]
        columns = self.fields.columns()
        for at in range(unit.start, unit.stop, ROWS_PER_READ):
            batch = ds[at : min(unit.stop, at + ROWS_PER_READ)]
            rows = [
                dict(zip(columns, values, strict=True)) for values in zip(*(batch[c] for c in columns), strict=True)
            ]
            yield from self._rows(src, rows, at + 1)

    # ---- tokenizing
    def _records(self, records: Iterator[tuple[Any, object]], writer: ShardWriter) -> None:
        """Records encoded in batches of about BATCH_BYTES of text, each full batch held back
        until the next one fills, so that a last batch of one record joins it (an unpaired
        example takes its KL completion from another of its batch: data/unpaired.py)."""
        batch: list[Any] = []
        wheres: list[object] = []
        held: tuple[list[Any], list[object]] | None = None
        size = 0
        assert self._stats is not None
        for value, where in records:
            self._stats.records += 1
            if not value:
                writer.stats.skipped += 1
                continue
            batch.append(value)
            wheres.append(where)
            size += record_chars(value)
            if size >= BATCH_BYTES:
                if held is not None:
                    self._encode(*held, writer)
                held, batch, wheres, size = (batch, wheres), [], [], 0
        if held is not None and len(batch) == 1:
            held, batch, wheres = (held[0] + batch, held[1] + wheres), [], []
        for part, names in (held or ([], [])), (batch, wheres):
            if part:
                self._encode(part, names, writer)

    def _encode(self, batch: list[Any], wheres: list[object], writer: ShardWriter) -> None:
        for doc in self.encoder.encode(self.format, batch, wheres, self._template_refused):
            writer.add(doc)

    def _template_refused(self, error: DataError) -> None:
        """A conversation the chat template refuses: bad like an unreadable record (already counted)."""
        assert self._stats is not None
        self._stats.records -= 1
        self._bad(error)


class _Lazy:
    """A record's location, worked out only if an error names it (the line number of a record in
    a unit that starts mid-file takes counting the lines before it)."""

    def __init__(self, text: Callable[[], str]):
        self.text = text

    def __str__(self) -> str:
        return self.text()
