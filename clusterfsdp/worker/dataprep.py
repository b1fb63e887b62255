"""Preparing a dataset: sources -> token shards on the shared filesystem, once per dataset.

`ensure(spec)` finds the job's prepared datasets (control/datasource.py: keyed by content) and
builds the missing ones: one process per dataset, under `<cache>/<key>.lock` (a second job or
`clusterfsdp data prepare` waits for it, then uses its result), then the sample indexes of the
job's seq_len / packing / split (dataindex.py). In a job only rank 0 calls it; the other ranks
wait (data.py). `python -m clusterfsdp.worker.dataprep JOB.toml` is `clusterfsdp data prepare`.

The sources are cut into units of about `unit_size(total)` bytes (line-aligned byte ranges of .txt and
.jsonl files, chunks of the decompressed stream of .gz/.zst files, row groups of parquet
files, row ranges of datasets); each unit becomes one shard, tokenized by a pool of processes
(one per CPU; the tokenizer's Rust batch encoder in each, single-threaded). A shard is written
under temporary names and renamed, then its stats file is written last: a complete shard has
`NNNNN.json`. Everything goes into `<cache>/.<key>.partial/`; a prepare that is interrupted
(Ctrl-C, a killed job) keeps its complete shards and the next one continues from them; only
when every shard is complete is the manifest written and the folder renamed to `<key>`, which
is the only thing a job reads. Bad input (exit 2, file and line named) removes the partial
folder: it can never complete with that content.

A .txt file is one document. One larger than a unit is tokenized in line-aligned pieces of
about PIECE_BYTES (each its own encode call, so a token never spans a piece boundary); its
document continues across the shards of its units.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing
import os
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..control import datasource, runfolder
from ..control import spec as specmod
from ..control.datasource import DataError, DatasetRef, Source
from ..control.lock import FileLock, LockHeld
from . import dataindex
from .tokens import DocumentEncoder, Encoded

MIN_UNIT, MAX_UNIT = 1 << 20, 16 << 20  # source bytes per shard (and per task of the pool)
PIECE_BYTES = 1 << 20  # text per encode call of a long .txt document
BATCH_BYTES = 1 << 20  # records' text per encode call
ROWS_PER_READ = 1024  # parquet / dataset rows read at once
PRELOAD = [
    "torch",
    "transformers",
    "transformers.models.auto.tokenization_auto",
    "transformers.tokenization_utils_tokenizers",
    "clusterfsdp.worker.tokens",
]

Log = Callable[[str], None]


# ---------------------------------------------------------------- units and shards
@dataclass(frozen=True)
class Unit:
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


@dataclass
class ShardStats:
    shard: int
    vocab_size: int  # the tokenizer's, recorded with every shard so the manifest needs no tokenizer
    eos: int
    dtype: str
    tokens: int = 0
    documents: int = 0
    skipped: int = 0  # empty records
    max_id: int = -1
    weight: int = 0
    cpu_s: float = 0.0  # CPU time the unit took in its process


class ShardWriter:
    """Token ids (and mask) appended to temporary files; renamed and recorded by `finish`."""

    def __init__(self, folder: Path, shard: int, encoder: DocumentEncoder, chat: bool):
        self.base = folder / f"{shard:05d}"
        self.dtype = encoder.dtype
        self.stats = ShardStats(shard, encoder.vocab_size, encoder.eos, encoder.dtype.name)
        self.tok = open(self._tmp(".tok"), "wb")  # noqa: SIM115 - closed in finish
        self.msk = open(self._tmp(".msk"), "wb") if chat else None  # noqa: SIM115
        self.starts: list[int] = []

    def _tmp(self, ext: str) -> Path:
        return self.base.with_name(f".{self.base.name}{ext}.tmp")

    def add(self, doc: Encoded, starts_document: bool = True) -> None:
        if starts_document:
            self.starts.append(self.stats.tokens)
            self.stats.documents += 1
        if len(doc.ids):
            self.stats.max_id = max(self.stats.max_id, int(doc.ids.max()))
        self.tok.write(doc.ids.astype(self.dtype, copy=False).tobytes())
        if self.msk is not None:
            assert doc.mask is not None
            self.msk.write(doc.mask.tobytes())
        self.stats.tokens += len(doc.ids)

    def finish(self, weight: int) -> ShardStats:
        self.stats.weight = weight
        for f in (self.tok, self.msk):
            if f is not None:
                f.close()
        np.asarray(self.starts, np.int64).tofile(self._tmp(".doc"))
        for ext in (".doc", ".msk", ".tok"):
            if self._tmp(ext).exists():
                os.replace(self._tmp(ext), self.base.with_suffix(ext))
        runfolder.atomic_write(self.base.with_suffix(".json"), json.dumps(asdict(self.stats)))
        return self.stats


# ---------------------------------------------------------------- planning (one process)
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


def _char_start(data: bytes, at: int) -> int:
    """The start of the UTF-8 character holding byte `at`: cutting there splits no character."""
    while at > 0 and data[at] & 0xC0 == 0x80:
        at -= 1
    return at


def unit_size(total: int) -> int:
    """Source bytes per unit: about 1/64 of the data (so every process of a pool gets several and
    they finish together), between 1 and 16 MiB. A function of the data only: a prepare that
    continues an interrupted one cuts the same units."""
    return max(MIN_UNIT, min(MAX_UNIT, total // 64))


def _file_units(src: Source, index: int, unit_bytes: int, shard: int) -> Iterator[Unit]:
    size = os.path.getsize(src.path)
    with open(src.path, "rb") as f:
        pos = 0
        while pos < size:
            end = size if pos + unit_bytes >= size else _text_boundary(f, pos + unit_bytes, size, src.kind)
            yield Unit(shard, index, pos, end, end - pos, 1 if pos == 0 else 0, pos == 0, end == size)
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


def _stream_units(src: Source, index: int, unit_bytes: int, shard: int) -> Iterator[Unit]:
    """A compressed file: the decompressed stream, cut after a newline about every unit_bytes."""
    raw = _Counting(open(src.path, "rb"))  # noqa: SIM115 - closed by the with below
    line, counted, carry, first = 1, 0, b"", True
    with raw, datasource.open_binary(src.path, src.compression, raw) as stream:  # type: ignore[arg-type]
        while block := stream.read(unit_bytes):
            data = carry + block
            cut = data.rfind(b"\n") + 1
            if cut == 0 and src.kind == "jsonl":
                carry = data  # a record longer than a unit: read on
                continue
            if cut == 0:  # a .txt without newlines: keep its last (maybe incomplete) character for later
                cut = _char_start(data, len(data) - 1)
            chunk, carry = data[:cut], data[cut:]
            yield Unit(shard, index, 0, 0, raw.count - counted, line, first, False, chunk)
            line += chunk.count(b"\n")
            counted, first, shard = raw.count, False, shard + 1
        yield Unit(shard, index, 0, 0, raw.count - counted, line, first, True, carry)  # ends the .txt document


def load_hf_dataset(src: Source, data: specmod.DataSection, cache: Path):
    """A save_to_disk folder or a folder datasets.load_dataset reads, as one split."""
    import datasets

    where = f"{src.field}: {src.path}"
    try:
        if src.kind == "saved_dataset":
            ds = datasets.load_from_disk(src.path)
            if isinstance(ds, datasets.DatasetDict):
                if data.split not in ds:
                    raise DataError(f"{where}: no split {data.split!r} (data.split; it has: {', '.join(map(str, ds))})")
                ds = ds[data.split]
        else:
            ds = datasets.load_dataset(src.path, split=data.split, cache_dir=str(cache / "hf-datasets"))
    except DataError:
        raise
    except Exception as e:  # datasets raises many kinds for unreadable folders and unknown splits
        raise DataError(f"{where}: datasets cannot read it: {type(e).__name__}: {e}") from None
    problem = datasource.column_problem(where, data, ds.column_names)
    if problem:
        raise DataError(problem)
    return ds


def _parquet_units(src: Source, index: int, data: specmod.DataSection, unit_bytes: int, shard: int):
    """Row groups, several to a unit while they fit in unit_bytes (uncompressed)."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(src.path)
    problem = datasource.column_problem(f"{src.field}: {src.path}", data, pf.schema_arrow.names)
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
        yield Unit(shard, index, a, b, file_size * sum(sizes[a:b]) // total, int(first_rows[a]) + 1)
        shard += 1


def _dataset_units(src: Source, index: int, data: specmod.DataSection, cache: Path, unit_bytes: int, shard: int):
    ds = load_hf_dataset(src, data, cache)
    rows = len(ds)
    per_unit = max(1, unit_bytes * rows // max(1, ds.data.nbytes))
    size = src.size()
    for start in range(0, rows, per_unit):
        stop = min(rows, start + per_unit)
        yield Unit(shard, index, start, stop, size * (stop - start) // max(1, rows), start + 1)
        shard += 1


def plan(sources: tuple[Source, ...], data: specmod.DataSection, cache: Path, unit_bytes: int) -> Iterator[Unit]:
    """Every unit of every source in order; shard numbers depend only on the content."""
    shard = 0
    for i, src in enumerate(sources):
        if src.kind in ("txt", "jsonl") and src.compression:
            units: Iterable[Unit] = _stream_units(src, i, unit_bytes, shard)
        elif src.kind in ("txt", "jsonl"):
            units = _file_units(src, i, unit_bytes, shard)
        elif src.kind == "parquet":
            units = _parquet_units(src, i, data, unit_bytes, shard)
        else:
            units = _dataset_units(src, i, data, cache, unit_bytes, shard)
        for unit in units:
            yield unit
            shard = unit.shard + 1


# ---------------------------------------------------------------- tokenizing a unit (any process)
@dataclass(frozen=True)
class Task:
    """What a prepare process needs besides a unit (pickled once per process of the pool)."""

    data: specmod.DataSection
    sources: tuple[Source, ...]
    shards: str
    cache: str


class UnitReader:
    """One process's tokenizer and open datasets; `run(unit)` writes one complete shard."""

    def __init__(self, task: Task):
        self.task = task
        self.encoder = DocumentEncoder(task.data.tokenizer)
        self.chat = task.data.format == "chat"
        self._datasets: dict[int, Any] = {}

    def run(self, unit: Unit) -> ShardStats:
        cpu = time.process_time()
        src = self.task.sources[unit.source]
        writer = ShardWriter(Path(self.task.shards), unit.shard, self.encoder, self.chat)
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
    def _bytes(self, src: Source, unit: Unit) -> bytes:
        if unit.payload is not None:
            return unit.payload
        with open(src.path, "rb") as f:
            f.seek(unit.start)
            return f.read(unit.stop - unit.start)

    def _first_line(self, src: Source, unit: Unit) -> int:
        """Line number of the unit's first byte (counted from the file's start on an error path only)."""
        if unit.first_line:
            return unit.first_line
        line = 1
        with open(src.path, "rb") as f:
            left = unit.start
            while left > 0:
                block = f.read(min(left, 1 << 24))
                line += block.count(b"\n")
                left -= len(block)
        return line

    def _txt(self, src: Source, unit: Unit, writer: ShardWriter) -> None:
        data = self._bytes(src, unit)
        if datasource.utf8_error(data, src.path) is not None:
            raise DataError(str(datasource.utf8_error(data, f"{src.field}: {src.path}", self._first_line(src, unit))))
        pieces, pos = [], 0
        while pos < len(data):
            end = len(data) if pos + PIECE_BYTES >= len(data) else data.rfind(b"\n", pos, pos + PIECE_BYTES) + 1
            if end <= pos:  # no newline: cut at a character boundary
                end = _char_start(data, pos + PIECE_BYTES)
            pieces.append(data[pos:end].decode("utf-8"))
            pos = end
        enc = self.encoder
        parts = ([enc.prefix] if unit.doc_start else []) + enc.pieces(pieces)
        if unit.doc_end:
            parts.append(np.asarray([enc.eos], enc.dtype))
        writer.add(Encoded(np.concatenate(parts) if parts else np.zeros(0, enc.dtype)), unit.doc_start)

    def _jsonl(self, src: Source, unit: Unit) -> Iterator[tuple[Any, object]]:
        data = self._bytes(src, unit)
        first = unit.first_line
        file = f"{src.field}: {src.path}"
        for n, line in enumerate(data.splitlines()):
            if not line.strip():
                continue
            try:
                value = datasource.parse_json_line(line, self.task.data, file, first + n)
            except DataError:
                if first:
                    raise
                first = self._first_line(src, unit)  # the error again, now with the file's line number
                value = datasource.parse_json_line(line, self.task.data, file, first + n)
            yield value, _Lazy(lambda n=n: f"{file}:{self._first_line(src, unit) + n}")

    def _rows(self, src: Source, values: list[Any], first_row: int) -> Iterator[tuple[Any, object]]:
        key = datasource.record_key(self.task.data)
        for n, value in enumerate(values):
            where = f"{src.field}: {src.path} row {first_row + n}"
            if value is None:
                raise DataError(f"{where}: {key!r} is null")
            yield datasource.record_value({key: value}, self.task.data, where), where

    def _parquet(self, src: Source, unit: Unit) -> Iterator[tuple[Any, object]]:
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(src.path)
        row = unit.first_line
        for group in range(unit.start, unit.stop):
            column = pf.read_row_group(group, columns=[datasource.record_key(self.task.data)]).column(0)
            for at in range(0, len(column), ROWS_PER_READ):
                values = column.slice(at, ROWS_PER_READ).to_pylist()
                yield from self._rows(src, values, row + at)
            row += len(column)

    def _dataset(self, src: Source, unit: Unit) -> Iterator[tuple[Any, object]]:
        if unit.source not in self._datasets:
            self._datasets[unit.source] = load_hf_dataset(src, self.task.data, Path(self.task.cache))
        ds = self._datasets[unit.source]
        key = datasource.record_key(self.task.data)
        for at in range(unit.start, unit.stop, ROWS_PER_READ):
            values = ds[at : min(unit.stop, at + ROWS_PER_READ)][key]
            yield from self._rows(src, values, at + 1)

    # ---- tokenizing
    def _records(self, records: Iterator[tuple[Any, object]], writer: ShardWriter) -> None:
        batch: list[Any] = []
        wheres: list[object] = []
        size = 0
        for value, where in records:
            if not value:
                writer.stats.skipped += 1
                continue
            batch.append(value)
            wheres.append(where)
            size += len(value) if isinstance(value, str) else sum(len(m["content"]) for m in value)
            if size >= BATCH_BYTES:
                self._encode(batch, wheres, writer)
                batch, wheres, size = [], [], 0
        if batch:
            self._encode(batch, wheres, writer)

    def _encode(self, batch: list[Any], wheres: list[object], writer: ShardWriter) -> None:
        docs = self.encoder.chats(batch, wheres) if self.chat else self.encoder.texts(batch)
        for doc in docs:
            writer.add(doc)


class _Lazy:
    """A record's location, worked out only if an error names it (the line number of a record in
    a unit that starts mid-file takes counting the lines before it)."""

    def __init__(self, text: Callable[[], str]):
        self.text = text

    def __str__(self) -> str:
        return self.text()


_READER: UnitReader | None = None


def _init_pool_process(task: Task) -> None:
    global _READER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"  # the parent shows the progress
    _READER = UnitReader(task)


def _run_in_pool(unit: Unit) -> ShardStats:
    assert _READER is not None
    return _READER.run(unit)


# ---------------------------------------------------------------- progress
class Progress:
    """Bytes done of a total: a rich progress bar on a terminal, else a log line every 30 s."""

    def __init__(self, label: str, total: int, log: Log, interactive: bool):
        self.label, self.total, self.log, self.done = label, max(total, 1), log, 0
        self.t0 = self.last = time.monotonic()
        self.bar = None
        if interactive:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )
            from rich.progress import Progress as Bar

            self.bar = Bar(
                TextColumn(label),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                transient=False,
            )
            self.task = self.bar.add_task(label, total=self.total)
            self.bar.start()

    def advance(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done)
        elif time.monotonic() - self.last >= 30:
            self.last = time.monotonic()
            rate = self.done / max(1e-9, self.last - self.t0)
            eta = (self.total - self.done) / max(rate, 1e-9)
            self.log(
                f"{self.label}: {100 * self.done / self.total:.0f}% of {self.total / 1e6:,.0f} MB, "
                f"{rate / 1e6:.1f} MB/s, about {eta / 60:.0f} min left"
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


# ---------------------------------------------------------------- running the units
def _bounded(ex: cf.Executor, units: Iterable[Unit], in_flight: int) -> Iterator[ShardStats]:
    """Results of the units in order, with at most `in_flight` submitted at a time (a compressed
    stream is decompressed here only as fast as the pool tokenizes it)."""
    pending: deque[cf.Future] = deque()
    for unit in units:
        pending.append(ex.submit(_run_in_pool, unit))
        while len(pending) >= in_flight:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _pending(units: Iterator[Unit], done: set[int], progress: Progress) -> Iterator[Unit]:
    """The units whose shard is not complete yet (complete ones count as progress)."""
    for unit in units:
        if unit.shard in done:
            progress.advance(unit.weight)
        else:
            yield unit


def _tokenize(task: Task, units: Iterator[Unit], done: set[int], workers: int, progress: Progress) -> None:
    todo = _pending(units, done, progress)
    if workers <= 1:
        reader = UnitReader(task)
        for unit in todo:
            progress.advance(reader.run(unit).weight)
        return
    # Forked from a fresh server process that imported torch and transformers once (loading a
    # tokenizer imports both: 3 CPU seconds) rather than from this process, which may hold threads
    # (rich's, torch's), so a worker is ready in a fraction of a second.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_pool_process, initargs=(task,)) as ex:
        try:
            for stats in _bounded(ex, todo, 2 * workers):
                progress.advance(stats.weight)
        except BaseException:
            ex.shutdown(wait=True, cancel_futures=True)
            raise


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def build(
    ref: DatasetRef, spec: specmod.JobSpec, log: Log, workers: int, interactive: bool, unit_bytes: int
) -> dict[str, Any]:
    """Tokenize `ref`'s sources into its partial folder and rename it complete; returns the manifest."""
    t0 = time.perf_counter()
    partial, shards = ref.partial, ref.partial / "shards"
    total = sum(s.size() for s in ref.sources)
    unit_bytes = unit_bytes or unit_size(total)
    plan_id = {"version": datasource.FORMAT_VERSION, "unit_bytes": unit_bytes}
    if partial.exists():
        try:
            same = json.loads((partial / "plan.json").read_text()) == plan_id
        except (OSError, ValueError):
            same = False
        if not same:
            shutil.rmtree(partial)
    shards.mkdir(parents=True, exist_ok=True)
    runfolder.atomic_write(partial / "plan.json", json.dumps(plan_id))
    done = {int(p.stem) for p in shards.glob("[0-9]*.json")}
    workers = workers or cpu_count()
    if all(s.kind in ("txt", "jsonl") and not s.compression for s in ref.sources):
        workers = min(workers, -(-total // unit_bytes))
    task = Task(spec.data, ref.sources, str(shards), str(ref.root))
    log(
        f"data: preparing {ref.role} data ({len(ref.sources)} source(s), {total / 1e6:,.1f} MB) with "
        f"{max(1, workers)} process(es) into {ref.folder}" + (f" ({len(done)} shards kept)" if done else "")
    )
    progress = Progress(f"tokenizing {ref.role} data", total, log, interactive)
    try:
        _tokenize(task, plan(ref.sources, spec.data, ref.root, unit_bytes), done, workers, progress)
    except DataError:
        shutil.rmtree(partial, ignore_errors=True)  # this content can never complete
        raise
    finally:
        progress.close()
    stats = [json.loads(p.read_text()) for p in sorted(shards.glob("[0-9]*.json"), key=lambda p: int(p.stem))]
    tokens = sum(s["tokens"] for s in stats)
    if tokens == 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise DataError(f"{ref.sources[0].field}: the {ref.role} data holds no text")
    seconds = time.perf_counter() - t0
    manifest = {
        "version": datasource.FORMAT_VERSION,
        "key": ref.key,
        "created": time.time(),
        "tokenizer": spec.data.tokenizer,
        "vocab_size": stats[0]["vocab_size"],
        "eos": stats[0]["eos"],
        "dtype": stats[0]["dtype"],
        "format": spec.data.format,
        "mask": spec.data.format == "chat",
        "tokens": tokens,
        "documents": sum(s["documents"] for s in stats),
        "skipped": sum(s["skipped"] for s in stats),
        "max_id": max(s["max_id"] for s in stats),
        "shards": [{"tokens": s["tokens"], "documents": s["documents"]} for s in stats],
        "sources": [{"path": s.path, "kind": s.kind, "size": s.size()} for s in ref.sources],
        "bytes": total,
        "seconds": seconds,
        "cpu_seconds": sum(s["cpu_s"] for s in stats),  # tokenizing units, all processes
        "workers": max(1, workers),
    }
    runfolder.atomic_write(partial / "manifest.json", json.dumps(manifest, indent=1))
    try:
        os.rename(partial, ref.folder)
    except OSError:
        if ref.manifest() is None:
            raise
        shutil.rmtree(partial, ignore_errors=True)  # completed meanwhile by a process that broke our lock
    skipped = f", {manifest['skipped']:,} empty records skipped" if manifest["skipped"] else ""
    log(
        f"data: prepared {tokens:,} tokens in {manifest['documents']:,} documents, {len(stats)} shards, "
        f"in {seconds:.1f} s ({total / 1e6 / max(seconds, 1e-9):.1f} MB/s, {manifest['cpu_seconds']:.1f} CPU-s "
        f"tokenizing){skipped}"
    )
    return manifest


def _prepare_locked(ref: DatasetRef, spec: specmod.JobSpec, log: Log, **kw: Any) -> None:
    """Build `ref` unless it is prepared; one process at a time per dataset, the others wait."""
    lock = FileLock(ref.lock_path, "prepare dataset", heartbeat_s=20, stale_after_s=120)
    try:
        lock.acquire(0)
    except LockHeld as e:
        log(f"data: waiting for the prepare that holds the lock ({e}); it keeps the lock's heartbeat")
        lock.acquire(math.inf)
    try:
        if ref.manifest() is None:
            build(ref, spec, log, **kw)
    finally:
        lock.release()


def ensure(
    spec: specmod.JobSpec,
    log: Log = print,
    *,
    workers: int = 0,
    interactive: bool = False,
    unit_bytes: int = 0,
) -> list[DatasetRef]:
    """The job's prepared datasets and sample indexes, building what is missing; DataError for
    unusable data (a dataset smaller than one batch included)."""
    root = datasource.cache_root(spec)
    unhashed = datasource.unhashed_bytes(spec)
    progress = Progress("fingerprinting sources", unhashed, log, interactive) if unhashed else None
    if progress is not None:
        log(f"data: fingerprinting {unhashed / 1e6:,.1f} MB of sources (once per file version)")
    try:
        refs = datasource.dataset_refs(spec, progress=progress.advance if progress else None)
    finally:
        if progress is not None:
            progress.close()
    root.mkdir(parents=True, exist_ok=True)
    for ref in refs:
        if ref.manifest() is None:
            _prepare_locked(
                ref,
                spec,
                log,
                workers=workers or spec.data.prepare_workers,
                interactive=interactive,
                unit_bytes=unit_bytes,
            )
    by_role = {r.role: r for r in refs}
    for role, data_role in datasource.sample_roles(spec):
        meta = dataindex.ensure(by_role[data_role], spec, role, log)
        problem = datasource.batch_problem(spec, role, int(meta["samples"]))
        if problem:
            raise DataError(problem)
    return refs


# ---------------------------------------------------------------- `clusterfsdp data prepare`
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="clusterfsdp data prepare")
    p.add_argument("job")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--workers", type=int, default=0, help="tokenizing processes (default: data.prepare_workers)")
    p.add_argument("--unit-bytes", type=int, default=0, help="source bytes per shard (default: from the data's size)")
    args = p.parse_args(argv)
    try:
        spec = specmod.load(args.job, args.set)
    except specmod.SpecError as e:
        for line in e.errors:
            print(f"error: {line}", file=sys.stderr)
        return 2
    if spec.data.source != "files":
        print("data.source = 'synthetic': nothing to prepare")
        return 0
    errors = datasource.source_problems(spec)
    if errors:
        for line in errors:
            print(f"error: {line}", file=sys.stderr)
        return 2
    try:
        refs = ensure(spec, workers=args.workers, interactive=sys.stderr.isatty(), unit_bytes=args.unit_bytes)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the complete shards are kept; the next prepare continues from them", file=sys.stderr)
        return 130
    for ref in refs:
        print(f"{ref.role}: {ref.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
