"""Reading a unit of a source and tokenizing it into one shard (in any process of the pool).

What a unit's records are is its source's kind's to say (`data.kinds`); this is what every
kind shares: the tokenizer, the shard, the record mapping and the bad-record policy. Records
(.jsonl, parquet, datasets) are encoded in batches of about BATCH_BYTES of text; a document
(a .txt file) in the pieces its kind cut.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core import spec as specmod
from ..core.spec import badrecords
from . import kinds
from .fieldmap import FieldMap
from .filekind import Record, SourceUnit
from .recordparts import record_chars
from .shards import ShardStats, ShardWriter
from .skipped import BAD_KEPT
from .sources import DataError, Source
from .tokens import DocumentEncoder, Encoded

BATCH_BYTES = 1 << 20  # records' text per encode call


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
        self.data, self.cache = task.data, Path(task.cache)
        self.encoder = DocumentEncoder(task.data.tokenizer)
        self.format = task.data.format
        self.fields = FieldMap.of(task.data)
        policy = badrecords.parse(task.data.bad_records)
        self.skip_bad = policy is not None and policy.skip
        self.opened: dict[int, Any] = {}  # what a source's kind keeps open across its units
        self._lines: dict[tuple[int, int], int] = {}  # (source, start) -> line number of a unit's start
        self._stats: ShardStats | None = None  # of the unit being read

    def run(self, unit: SourceUnit) -> ShardStats:
        cpu = time.process_time()
        src = self.task.sources[unit.source]
        writer = ShardWriter(Path(self.task.shards), unit.shard, self.encoder, self.format != "text")
        self._stats = writer.stats
        kinds.of(src).read(self, src, unit, writer)
        writer.stats.cpu_s = time.process_time() - cpu
        return writer.finish(unit.weight)

    # ---- reading (what a kind uses: data.filekind.UnitReading)
    def unit_bytes(self, src: Source, unit: SourceUnit) -> bytes:
        if unit.payload is not None:
            return unit.payload
        with open(src.path, "rb") as f:
            f.seek(unit.start)
            return f.read(unit.stop - unit.start)

    def bad(self, error: Exception) -> None:
        """A record that cannot be read: counted and left out with data.bad_records = 'skip' (the
        limit is the prepare's to check, over all shards), else the prepare's error."""
        if not self.skip_bad:
            raise error
        assert self._stats is not None
        self._stats.records += 1
        self._stats.bad += 1
        if len(self._stats.bad_at) < BAD_KEPT:
            self._stats.bad_at.append(str(error))

    def first_line(self, src: Source, unit: SourceUnit) -> int:
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

    def rows(self, src: Source, rows: list[dict[str, Any]], first_row: int) -> Iterator[Record]:
        """A table's rows as records, through the record mapping (`first_row`: the first's number)."""
        for n, row in enumerate(rows):
            where = f"{src.field}: {src.path} row {first_row + n}"
            try:
                record = self.fields.apply(row, where)
            except DataError as e:
                self.bad(e)
                continue
            yield record, where

    # ---- tokenizing
    def encode_document(self, pieces: list[str], unit: SourceUnit, writer: ShardWriter) -> None:
        """A document's text (one .txt file, or its part in this unit) in `pieces`, each its own
        encode call; BOS where the unit begins the document, EOS where it ends it."""
        enc = self.encoder
        parts = ([enc.prefix] if unit.doc_start else []) + enc.pieces(pieces)
        if unit.doc_end:
            parts.append(np.asarray([enc.eos], enc.dtype))
        writer.add(Encoded(np.concatenate(parts) if parts else np.zeros(0, enc.dtype)), unit.doc_start)

    def encode_records(self, records: Iterator[Record], writer: ShardWriter) -> None:
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
        self.bad(error)
