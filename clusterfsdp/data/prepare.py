"""Preparing a dataset: sources -> token shards on the shared filesystem, once per dataset.

`ensure(spec)` finds the job's prepared datasets (cache.py: keyed by content) and builds the
missing ones: one process per dataset, under `<cache>/<key>.lock` (a second job or
`clusterfsdp data prepare` waits for it, then uses its result), then the sample indexes of the
job's seq_len / packing / split (index.py). In a job only rank 0 calls it; the other ranks
wait (samples.py). `python -m clusterfsdp.data.prepare JOB.toml` is `clusterfsdp data prepare`.

The sources are cut into units (units.py), each tokenized into one shard (readers.py,
shards.py) by a pool of processes (pool.py). Everything goes into `<cache>/.<key>.partial/`;
a prepare that is interrupted (Ctrl-C, a killed job) keeps its complete shards and the next
one continues from them; only when every shard is complete is the manifest written and the
folder renamed to `<key>`, which is the only thing a job reads. Bad input (exit 2, file and
line named) removes the partial folder: it can never complete with that content.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any

from ..control import spec as specmod
from ..control.lock import FileLock, LockHeld
from . import index, mixindex, overlap, skipped, trust
from .cache import FORMAT_VERSION, DatasetRef, cache_root, dataset_refs, ref_data, same_data_problem, unhashed_bytes
from .checks import source_problems
from .pool import cpu_count, tokenize
from .readers import Task
from .samplesets import batch_problem, sample_roles
from .sources import DataError
from .units import plan, unit_size

Log = Callable[[str], None]
LOCK_RECHECK_S = 5.0  # how often a waiting prepare checks who holds the lock


class ByteProgress:
    """Bytes done of a total, with the rate and the time left: a rich progress bar on a terminal
    (`clusterfsdp data prepare`), else a log line every 30 s (a rank's log). Not
    worker/progress.py's `task`, whose lines give the fraction and elapsed time only: hashing and
    tokenizing a corpus take hours, and the rate is what tells whether the disk or the CPUs
    limit it."""

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


def build(
    ref: DatasetRef, spec: specmod.JobSpec, log: Log, workers: int, interactive: bool, unit_bytes: int
) -> dict[str, Any]:
    """Tokenize `ref`'s sources into its partial folder and rename it complete; returns the manifest."""
    t0 = time.perf_counter()
    partial, shards = ref.partial, ref.partial / "shards"
    total = sum(s.size() for s in ref.sources)
    unit_bytes = unit_bytes or unit_size(total)
    plan_id = {"version": FORMAT_VERSION, "unit_bytes": unit_bytes}
    if partial.exists():
        trust.require(partial, partial / "plan.json", shards)  # its shards would be kept
        try:
            same = json.loads((partial / "plan.json").read_text()) == plan_id
        except (OSError, ValueError):
            same = False
        if not same:
            shutil.rmtree(partial)
    trust.mkdirs(shards)
    trust.write(partial / "plan.json", json.dumps(plan_id))
    done = {int(p.stem) for p in shards.glob("[0-9]*.json")}
    workers = workers or cpu_count()
    if all(s.kind in ("txt", "jsonl") and not s.compression for s in ref.sources):
        workers = min(workers, -(-total // unit_bytes))
    data = ref_data(spec, ref)
    task = Task(data, ref.sources, str(shards), str(ref.root))
    log(
        f"data: preparing {ref.role} data ({len(ref.sources)} source(s), {total / 1e6:,.1f} MB) with "
        f"{max(1, workers)} process(es) into {ref.folder}" + (f" ({len(done)} shards kept)" if done else "")
    )
    progress = ByteProgress(f"tokenizing {ref.role} data", total, log, interactive)
    limit = skipped.EarlyLimit(data.bad_records, shards)
    try:
        tokenize(task, plan(ref.sources, data, ref.root, unit_bytes), done, workers, progress.advance, limit.written)
    except DataError:
        shutil.rmtree(partial, ignore_errors=True)  # this content can never complete
        raise
    finally:
        progress.close()
    stats = [json.loads(p.read_text()) for p in sorted(shards.glob("[0-9]*.json"), key=lambda p: int(p.stem))]
    try:
        bad = skipped.summary(data.bad_records, stats)
    except DataError:
        shutil.rmtree(partial, ignore_errors=True)  # over the limit: this content can never complete
        raise
    tokens = sum(s["tokens"] for s in stats)
    if tokens == 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise DataError(f"{ref.sources[0].field}: the {ref.role} data holds no text")
    seconds = time.perf_counter() - t0
    manifest = {
        "version": FORMAT_VERSION,
        "key": ref.key,
        "created": time.time(),
        "tokenizer": spec.data.tokenizer,
        "vocab_size": stats[0]["vocab_size"],
        "eos": stats[0]["eos"],
        "dtype": stats[0]["dtype"],
        "format": data.format,
        "mask": data.format == "chat",
        "tokens": tokens,
        "documents": sum(s["documents"] for s in stats),
        "skipped": sum(s["skipped"] for s in stats),
        "bad_records": bad,
        "max_id": max(s["max_id"] for s in stats),
        "shards": [{"tokens": s["tokens"], "documents": s["documents"], "files": s["files"]} for s in stats],
        "sources": [{"path": s.path, "kind": s.kind, "size": s.size()} for s in ref.sources],
        "bytes": total,
        "seconds": seconds,
        "cpu_seconds": sum(s["cpu_s"] for s in stats),  # tokenizing units, all processes
        "workers": max(1, workers),
    }
    trust.write(partial / "manifest.json", json.dumps(manifest, indent=1))
    try:
        os.rename(partial, ref.folder)
    except OSError:
        if ref.manifest() is None:
            raise
        shutil.rmtree(partial, ignore_errors=True)  # completed meanwhile by a process that broke our lock
    empty = f", {manifest['skipped']:,} empty records skipped" if manifest["skipped"] else ""
    log(
        f"data: prepared {tokens:,} tokens in {manifest['documents']:,} documents, {len(stats)} shards, "
        f"in {seconds:.1f} s ({total / 1e6 / max(seconds, 1e-9):.1f} MB/s, {manifest['cpu_seconds']:.1f} CPU-s "
        f"tokenizing){empty}"
    )
    return manifest


def _refuse_foreign(lock: FileLock) -> None:
    """DataError when the lock file belongs to someone this cache does not trust (a lock planted
    by another user, naming a live process of theirs, would otherwise be waited on forever)."""
    found = trust.problem(lock.path)
    if found:
        owner = lock.owner()
        raise DataError(f"{found} (a prepare lock naming {owner.describe() if owner else 'no readable owner'})")


def _take(lock: FileLock, log: Log) -> None:
    """Take the dataset's lock, waiting for a trusted holder as long as it keeps its heartbeat."""
    _refuse_foreign(lock)
    try:
        lock.acquire(0)
        return
    except LockHeld as e:
        log(f"data: waiting for the prepare that holds the lock ({e}); it keeps the lock's heartbeat")
    while True:
        _refuse_foreign(lock)  # the holder may change while we wait
        try:
            lock.acquire(LOCK_RECHECK_S)
            return
        except LockHeld:
            continue


def _prepare_locked(ref: DatasetRef, spec: specmod.JobSpec, log: Log, **kw: Any) -> None:
    """Build `ref` unless it is prepared; one process at a time per dataset, the others wait."""
    lock = FileLock(ref.lock_path, "prepare dataset", heartbeat_s=20, stale_after_s=120)
    _take(lock, log)
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
    root = cache_root(spec)
    unhashed = unhashed_bytes(spec)
    progress = ByteProgress("fingerprinting sources", unhashed, log, interactive) if unhashed else None
    if progress is not None:
        log(f"data: fingerprinting {unhashed / 1e6:,.1f} MB of sources (once per file version)")
    try:
        refs = dataset_refs(spec, progress=progress.advance if progress else None)
    finally:
        if progress is not None:
            progress.close()
    if problem := same_data_problem(refs):
        raise DataError(problem)
    trust.mkdirs(root)
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
    for ref in refs:
        manifest = ref.manifest()
        assert manifest is not None
        if problem := skipped.reuse_problem(spec.data.bad_records, ref.role, manifest):
            raise DataError(problem)
        for line in skipped.lines(ref.role, manifest):
            log(f"data: {line}")
    by_role = {r.role: r for r in refs}
    for role, data_role in sample_roles(spec):
        if data_role == "train" and spec.data.sources:  # one index per source of the mixture
            samples = mixindex.ensure_indexes(refs, spec, log, role)
        else:
            samples = int(index.ensure(by_role[data_role], spec, role, log)["samples"])
        problem = batch_problem(spec, role, samples)
        if problem:
            raise DataError(problem)
    if "eval" in by_role:
        shared = overlap.shared_documents(by_role["train"], by_role["eval"])
        if shared is not None and (warning := shared.warning()):
            log(f"data: warning: {warning}")
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
    errors = source_problems(spec)
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
