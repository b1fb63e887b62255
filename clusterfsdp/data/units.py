"""Planning a prepare: the sources cut into *units*, one shard's worth each.

The sources are cut into units of about `unit_size(total)` bytes (line-aligned byte ranges of
.txt and .jsonl files, chunks of the decompressed stream of .gz/.zst files, row groups of
parquet files, row ranges of datasets); each unit becomes one shard. The cut depends only on
the content, so a prepare that continues an interrupted one (or a task of a prepare spread
over several processes or hosts) cuts the same units with the same shard numbers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from ..core import spec as specmod
from . import trust
from .formats import column_problem
from .sources import DataError, Source, open_binary

MIN_UNIT, MAX_UNIT = 1 << 20, 16 << 20  # source bytes per shard (and per task of the pool)
PIECE_BYTES = 1 << 20  # text per encode call of a long .txt document


@dataclass(frozen=True)
class SourceUnit:
    """One shard's worth of one source."""

    shard: int
    source: int  # index into the dataset's sources
    start: int  # byte offset (text files), row group (parquet) or row (datasets)
    stop: int
    weight: int  # bytes of the source file it accounts for (progress)
    first_line: int = 0  # line (or row) number of `start`; 0: counted only if an error needs it
    doc_start: bool = True  # .txt: the unit begins its file's document
    doc_end: bool = True  # .txt: the unit ends it
    payload: bytes | None = None  # decompressed text of a compressed source


def _text_boundary(f: IO[bytes], pos: int, size: int, kind: str) -> int:
    """The first cut at or after `pos`: just after a newline; for .txt without a newline in
    PIECE_BYTES, at the next UTF-8 character boundary."""
    f.seek(pos)
    scanned = 0
    while pos + scanned < size:
        block = f.read(1 << 16)
        nl = block.find(b"\n")
        if nl >= 0:
            return pos + scanned + nl + 1
        scanned += len(block)
        if kind == "txt" and scanned >= PIECE_BYTES:
            break
    if kind != "txt" or pos + scanned >= size:
        return size
    f.seek(pos)
    head = f.read(4)
    return pos + next((i for i in range(4) if i == len(head) or head[i] & 0xC0 != 0x80), 0)


def char_start(data: bytes, at: int) -> int:
    """The start of the UTF-8 character holding byte `at`: cutting there splits no character."""
    while at > 0 and data[at] & 0xC0 == 0x80:
        at -= 1
    return at


def unit_size(total: int) -> int:
    """Source bytes per unit: about 1/64 of the data (so every process of a pool gets several and
    they finish together), between 1 and 16 MiB. A function of the data only: a prepare that
    continues an interrupted one cuts the same units."""
    return max(MIN_UNIT, min(MAX_UNIT, total // 64))


def _file_units(src: Source, index: int, unit_bytes: int, shard: int) -> Iterator[SourceUnit]:
    size = os.path.getsize(src.path)
    with open(src.path, "rb") as f:
        pos = 0
        while pos < size:
            end = size if pos + unit_bytes >= size else _text_boundary(f, pos + unit_bytes, size, src.kind)
            yield SourceUnit(shard, index, pos, end, end - pos, 1 if pos == 0 else 0, pos == 0, end == size)
            shard, pos = shard + 1, end


class _Counting:
    """A binary file that counts the bytes read from it (the compressed position of a stream)."""

    def __init__(self, f: IO[bytes]):
        self.f, self.count = f, 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.count += len(data)
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.f.close()

    @property
    def closed(self) -> bool:
        return self.f.closed

    def __enter__(self) -> _Counting:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stream_units(src: Source, index: int, unit_bytes: int, shard: int) -> Iterator[SourceUnit]:
    """A compressed file: the decompressed stream, cut after a newline about every unit_bytes."""
    raw = _Counting(open(src.path, "rb"))  # noqa: SIM115 - closed by the with below
    line, counted, carry, first = 1, 0, b"", True
    with raw, open_binary(src.path, src.compression, raw) as stream:  # type: ignore[arg-type]
        while block := stream.read(unit_bytes):
            data = carry + block
            cut = data.rfind(b"\n") + 1
            if cut == 0 and src.kind == "jsonl":
                carry = data  # a record longer than a unit: read on
                continue
            if cut == 0:  # a .txt without newlines: keep its last (maybe incomplete) character for later
                cut = char_start(data, len(data) - 1)
            chunk, carry = data[:cut], data[cut:]
            yield SourceUnit(shard, index, 0, 0, raw.count - counted, line, first, False, chunk)
            line += chunk.count(b"\n")
            counted, first, shard = raw.count, False, shard + 1
        yield SourceUnit(shard, index, 0, 0, raw.count - counted, line, first, True, carry)  # ends the .txt document


def load_hf_dataset(src: Source, data: specmod.DataSection, cache: Path):
    """A save_to_disk folder or a folder datasets.load_dataset reads, as one split."""
    # HuggingFace datasets (heavy) only for a hub dataset
    import datasets

    where = f"{src.field}: {src.path}"
    try:
        if src.kind == "saved_dataset":
            ds = datasets.load_from_disk(src.path)
            if isinstance(ds, datasets.DatasetDict):
                if data.split not in ds:
                    it_has = ", ".join(map(str, ds))
                    raise DataError(f"{where}: no split {data.split!r} ({src.split_key}; it has: {it_has})")
                ds = ds[data.split]
        else:
            # datasets copies the rows into its cache and reuses them: a folder of this user's only
            own = trust.private_folder(cache / "hf-datasets")
            ds = datasets.load_dataset(src.path, split=data.split, cache_dir=str(own))
    except DataError:
        raise
    except Exception as e:  # datasets raises many kinds for unreadable folders and unknown splits
        raise DataError(f"{where}: datasets cannot read it: {type(e).__name__}: {e}") from None
    problem = column_problem(where, data, ds.column_names)
    if problem:
        raise DataError(problem)
    return ds


def _parquet_units(src: Source, index: int, data: specmod.DataSection, unit_bytes: int, shard: int):
    """Row groups, several to a unit while they fit in unit_bytes (uncompressed)."""
    # pyarrow only for Parquet files
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(src.path)
    problem = column_problem(f"{src.field}: {src.path}", data, pf.schema_arrow.names)
    if problem:
        raise DataError(problem)
    groups = [pf.metadata.row_group(i) for i in range(pf.metadata.num_row_groups)]
    sizes = [g.total_byte_size for g in groups]
    first_rows = np.concatenate([[0], np.cumsum([g.num_rows for g in groups])])
    file_size, total = os.path.getsize(src.path), max(1, sum(sizes))
    cuts = [0]
    for i in range(1, len(groups)):
        if sum(sizes[cuts[-1] : i + 1]) > unit_bytes:
            cuts.append(i)
    for a, b in zip(cuts, [*cuts[1:], len(groups)], strict=True):
        yield SourceUnit(shard, index, a, b, file_size * sum(sizes[a:b]) // total, int(first_rows[a]) + 1)
        shard += 1


def _dataset_units(src: Source, index: int, data: specmod.DataSection, cache: Path, unit_bytes: int, shard: int):
    ds = load_hf_dataset(src, data, cache)
    rows = len(ds)
    per_unit = max(1, unit_bytes * rows // max(1, ds.data.nbytes))
    size = src.size()
    for start in range(0, rows, per_unit):
        stop = min(rows, start + per_unit)
        yield SourceUnit(shard, index, start, stop, size * (stop - start) // max(1, rows), start + 1)
        shard += 1


def plan(sources: tuple[Source, ...], data: specmod.DataSection, cache: Path, unit_bytes: int) -> Iterator[SourceUnit]:
    """Every unit of every source in order; shard numbers depend only on the content."""
    shard = 0
    for i, src in enumerate(sources):
        if src.kind in ("txt", "jsonl") and src.compression:
            units: Iterable[SourceUnit] = _stream_units(src, i, unit_bytes, shard)
        elif src.kind in ("txt", "jsonl"):
            units = _file_units(src, i, unit_bytes, shard)
        elif src.kind == "parquet":
            units = _parquet_units(src, i, data, unit_bytes, shard)
        else:
            units = _dataset_units(src, i, data, cache, unit_bytes, shard)
        for unit in units:
            yield unit
            shard = unit.shard + 1
