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
line named) removes the partial folder: it can never complete with that content. Each unit is
claimed before it is tokenized, so several prepares of one dataset (the tasks of a Slurm job
array, `--share I/K`: array.py) never write the same unit.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from ..core import spec as specmod
from ..core.lock import FileLock, LockHeld
from . import array, index, mixindex, overlap, skipped, trust
from .cache import DatasetRef, cache_root, dataset_refs, same_data_problem, unhashed_bytes
from .checks import source_problems
from .pool import cpu_count
from .samplesets import batch_problem, sample_roles
from .sources import DataError

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
            # rich only for an interactive progress bar
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            Bar = Progress

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
    """Tokenize `ref`'s sources into its partial folder (every unit this process can claim, then
    waiting for those another prepare holds: array.py) and rename it complete; the manifest."""
    total = sum(s.size() for s in ref.sources)
    while True:
        progress = ByteProgress(f"tokenizing {ref.role} data", total, log, interactive)
        try:
            array.tokenize_share(
                ref, spec, log, array.LOCAL, workers=workers, unit_bytes=unit_bytes, progress=progress.advance
            )
        finally:
            progress.close()
        manifest = array.finish(ref, spec, log, workers or cpu_count())
        if manifest is not None:
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


def _dataset_lock(ref: DatasetRef) -> FileLock:
    return FileLock(ref.lock_path, "prepare dataset", heartbeat_s=20, stale_after_s=120)


def _prepare_locked(ref: DatasetRef, spec: specmod.JobSpec, log: Log, **kw: Any) -> None:
    """Build `ref` unless it is prepared; one process at a time per dataset, the others wait."""
    lock = _dataset_lock(ref)
    _take(lock, log)
    try:
        if ref.manifest() is None:
            build(ref, spec, log, **kw)
    finally:
        lock.release()


def finish_locked(ref: DatasetRef, spec: specmod.JobSpec, log: Log, workers: int) -> None:
    """A task of a prepare array: complete `ref` if every unit is (array.finish), under its lock."""
    lock = _dataset_lock(ref)
    _take(lock, log)
    try:
        if ref.manifest() is None:
            array.finish(ref, spec, log, workers or cpu_count())
    finally:
        lock.release()


def dataset_refs_fingerprinted(spec: specmod.JobSpec, log: Log, interactive: bool = False) -> list[DatasetRef]:
    """The job's datasets with their keys, fingerprinting the sources not hashed yet (with progress)."""
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
    return refs


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
    refs = dataset_refs_fingerprinted(spec, log, interactive)
    trust.mkdirs(cache_root(spec))
    for ref in refs:
        if ref.manifest() is None and spec.data.prepare == "require":
            raise DataError(
                f"data.prepare = 'require': the {ref.role} data is not prepared ({ref.folder}); "
                "prepare it with `clusterfsdp data prepare`"
            )
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
        meta = None
        if data_role == "train" and spec.data.sources:  # one index per source of the mixture
            samples = mixindex.ensure_indexes(refs, spec, log, role)
        else:
            meta = index.ensure(by_role[data_role], spec, role, log)
            samples = int(meta["samples"])
        problem = batch_problem(spec, role, samples, meta)
        if problem:
            raise DataError(problem)
    if "eval" in by_role:
        shared = overlap.shared_documents(by_role["train"], by_role["eval"])
        if shared is not None and (warning := shared.warning()):
            log(f"data: warning: {warning}")
    return refs


def run_task(
    spec: specmod.JobSpec, share: array.Share, log: Log = print, *, workers: int = 0, unit_bytes: int = 0
) -> bool:
    """One task of a prepare array: its share of every dataset the job lacks; then, when the
    datasets are complete (this task finished last), the manifests, the renames and the sample
    indexes (`ensure`, which also checks that each set holds a batch). True when the
    job's data is ready; False when other tasks still have units to finish."""
    refs = dataset_refs_fingerprinted(spec, log)
    workers = workers or spec.data.prepare_workers
    for ref in refs:
        if ref.manifest() is not None:
            continue
        array.tokenize_share(ref, spec, log, share, workers=workers, unit_bytes=unit_bytes)
        finish_locked(ref, spec, log, workers)
    if any(ref.manifest() is None for ref in refs):
        log(f"data: {share.describe()} is done; the task that finishes last completes the dataset")
        return False
    ensure(spec, log, workers=workers, unit_bytes=unit_bytes)
    return True


# ---------------------------------------------------------------- `clusterfsdp data prepare`


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="clusterfsdp data prepare")
    p.add_argument("job")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--workers", type=int, default=0, help="tokenizing processes (default: data.prepare_workers)")
    p.add_argument("--unit-bytes", type=int, default=0, help="source bytes per shard (default: from the data's size)")
    p.add_argument(
        "--share",
        default="",
        metavar="I/K",
        help="tokenize only task I's share of K (what each task of a prepare array does; array.py)",
    )
    p.add_argument(
        "--array",
        default=os.environ.get("SLURM_ARRAY_JOB_ID", ""),
        help="with --share: the id its tasks share (default: $SLURM_ARRAY_JOB_ID)",
    )
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
        if args.share:
            found = re.fullmatch(r"(\d+)/(\d+)", args.share)
            if not found or int(found[1]) >= int(found[2]):
                p.error(f"--share: {args.share!r} is not I/K with 0 <= I < K")
            share = array.Share(int(found[1]), int(found[2]), args.array)
            if not run_task(spec, share, workers=args.workers, unit_bytes=args.unit_bytes):
                return 0
            refs = dataset_refs(spec)
        else:
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
