"""Tokenizing one dataset in several processes at once, on one host or many: the units of the
plan (units.py) shared out, each claimed before it is tokenized, and the dataset finished by
whoever completes it.

- A *share* is the units one process tokenizes: all of them for a local prepare (`LOCAL`), every
  K-th for task i of a Slurm job array of K tasks (`python -m clusterfsdp.data.prepare` is one
  process; `clusterfsdp data prepare --executor slurm` queues the array, control/prepjob.py).
  Every process cuts the same units with the same shard numbers, because the cut depends only on
  the content, so the shares are disjoint without talking to each other.
- A unit is *claimed* with a lock file (`claims/NNNNN.lock`, core/lock.py, with a heartbeat)
  before it is tokenized and released once its shard is complete (`shards/NNNNN.json`). Two
  prepares of one dataset (a rerun beside a live array, a job's rank 0 beside `data prepare`)
  therefore never write the same unit: one tokenizes it, the other waits for it (or takes it over
  once its holder is dead: at once on the same host, after UNIT_STALE_S elsewhere).
- A complete unit is never tokenized again: a task that dies (killed, preempted, out of time)
  leaves its complete units, and the next prepare of the dataset does only the rest.
- Bad input in one task (exit 2, file and line) is written to `failed.json`; the other tasks of
  the array stop at their next unit with the same error, and nothing is renamed into place.
- *Finishing* (`finish`) checks that every unit of the plan is complete and its files have their
  sealed sizes, writes the manifest and renames the folder into place, under the dataset's lock
  (`<key>.lock`): the last task of an array to finish its share does it; the others see units
  still missing and leave it to that one.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..core import spec as specmod
from ..core.lock import FileLock, LockHeld
from . import kinds, skipped, trust
from .arraystate import claims_dir, failed_file, read_json, started_file, units_file
from .cache import FORMAT_VERSION, DatasetRef, ref_data
from .filekind import SourceUnit
from .pool import cpu_count, tokenize
from .readers import ReadTask
from .shards import ShardStats
from .sources import DataError
from .units import plan, unit_size

Log = Callable[[str], None]
UNIT_HEARTBEAT_S, UNIT_STALE_S = 10.0, 60.0  # a unit claim's heartbeat, and when another host's is dead
WAIT_S = 1.0  # how often a prepare looks again at units another prepare holds


@dataclass(frozen=True)
class Share:
    """Task `index` of `count`: the units whose shard number is `index` modulo `count`. `array`:
    the Slurm array's job id ('' for a prepare that is not a task of an array)."""

    index: int = 0
    count: int = 1
    array: str = ""

    def holds(self, shard: int) -> bool:
        return shard % self.count == self.index

    def describe(self) -> str:
        return f"task {self.index} of {self.count} of array job {self.array}" if self.array else "this process"


LOCAL = Share()


def open_partial(ref: DatasetRef, unit_bytes: int, share: Share) -> bool:
    """The partial folder of `ref`, kept when it was cut the same way (its complete units are kept)
    and made anew otherwise, or when an earlier prepare failed on its content; False when there is
    nothing left to do: the dataset is complete (another task renamed the folder into place,
    perhaps while this one was opening it). A task of an array that already failed stops with that
    error instead."""
    try:
        return _open_partial(ref, unit_bytes, share)
    except FileNotFoundError:
        if ref.manifest() is None:
            raise
        return False


def _open_partial(ref: DatasetRef, unit_bytes: int, share: Share) -> bool:
    partial, shards = ref.partial, ref.partial / "shards"
    plan_id = {"version": FORMAT_VERSION, "unit_bytes": unit_bytes}
    if not partial.exists() and ref.manifest() is not None:
        return False  # (a rename is atomic: no partial folder, and then the complete one)
    if partial.exists():
        trust.require(partial, partial / "plan.json", shards, claims_dir(ref))
        failed = read_json(failed_file(ref))
        if failed is not None and share.array and failed.get("array") == share.array:
            raise DataError(str(failed.get("error")))
        if failed is not None or read_json(partial / "plan.json") != plan_id:
            shutil.rmtree(partial, ignore_errors=True)
    trust.mkdirs(shards)
    trust.keep_private(partial, [f for src in ref.sources for f in src.files()])
    trust.mkdirs(claims_dir(ref))
    trust.write(partial / "plan.json", json.dumps(plan_id))
    if not started_file(ref).exists():
        trust.write(started_file(ref), json.dumps({"time": time.time()}))
    return True


class Claims:
    """The unit locks one prepare process holds; `pending` yields the units of a share that are
    not complete and that this process could claim."""

    def __init__(self, ref: DatasetRef, advance: Callable[[int], None]):
        self.ref, self.advance = ref, advance
        self.shards = ref.partial / "shards"
        self.held: dict[int, FileLock] = {}
        self.busy: set[int] = set()  # units of the share another process held in the last pass
        self.counted: set[int] = set()  # units already shown as progress
        self.units = 0  # units of the whole plan, counted by the last complete pass

    def complete(self, shard: int) -> bool:
        return (self.shards / f"{shard:05d}.json").exists()

    def _count(self, unit: SourceUnit) -> None:
        if unit.shard not in self.counted:
            self.counted.add(unit.shard)
            self.advance(unit.weight)

    def pending(self, units: Iterator[SourceUnit], share: Share) -> Iterator[SourceUnit]:
        self.busy.clear()
        seen = 0
        for unit in units:
            seen += 1
            if not share.holds(unit.shard):
                continue
            if self.complete(unit.shard):
                self._count(unit)
                continue
            failed = read_json(failed_file(self.ref))
            if failed is not None:  # another task met bad input: the dataset can never complete
                raise DataError(str(failed.get("error")))
            path = claims_dir(self.ref) / f"{unit.shard:05d}.lock"
            lock = FileLock(path, "prepare unit", heartbeat_s=UNIT_HEARTBEAT_S, stale_after_s=UNIT_STALE_S)
            try:
                lock.acquire(0)
            except LockHeld:
                self.busy.add(unit.shard)
                continue
            if self.complete(unit.shard):  # completed by the holder just before we took it
                lock.release()
                self._count(unit)
                continue
            self.held[unit.shard] = lock
            yield unit
        self.units = seen

    def _claimable(self, shard: int) -> bool:
        """The unit is complete, or its holder let it go (or died): worth another pass."""
        if self.complete(shard):
            return True
        lock = FileLock(claims_dir(self.ref) / f"{shard:05d}.lock", stale_after_s=UNIT_STALE_S)
        try:
            lock.acquire(0)
        except LockHeld:
            return False
        lock.release()
        return True

    def wait_for_busy(self) -> None:
        """Until a unit another prepare held is complete or may be claimed (another pass then
        cuts the sources again, which for a compressed source means decompressing it: not on
        every poll)."""
        while not any(self._claimable(shard) for shard in sorted(self.busy)):
            time.sleep(WAIT_S)

    def written(self, stats: ShardStats) -> None:
        self.counted.add(stats.shard)
        self.held.pop(stats.shard).release()

    def release(self) -> None:
        for lock in self.held.values():
            lock.release()
        self.held.clear()


def tokenize_share(
    ref: DatasetRef,
    spec: specmod.JobSpec,
    log: Log,
    share: Share,
    *,
    workers: int,
    unit_bytes: int,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Tokenize every unit of `share` that is not complete into `ref`'s partial folder, waiting for
    the units another prepare holds until they are complete (or their holder is dead). DataError
    for bad input: a local prepare removes the partial folder; a task of an array records the
    error there for its other tasks, status and the next prepare."""
    total = sum(s.size() for s in ref.sources)
    unit_bytes = unit_bytes or unit_size(total)
    if not open_partial(ref, unit_bytes, share):
        log(f"data: the {ref.role} data is prepared (by another task): nothing to do")
        return
    shards = ref.partial / "shards"
    done = len(list(shards.glob("[0-9]*.json")))
    workers = workers or cpu_count()
    if all(kinds.of(s).plain_text(s) for s in ref.sources):
        workers = min(workers, -(-total // (unit_bytes * share.count)))
    data = ref_data(spec, ref)
    task = ReadTask(data, ref.sources, str(shards), str(ref.root))
    log(
        f"data: preparing {ref.role} data ({len(ref.sources)} source(s), {total / 1e6:,.1f} MB) with "
        f"{max(1, workers)} process(es) into {ref.folder}"
        + (f" as {share.describe()}" if share.array else "")
        + (f" ({done} shards kept)" if done else "")
    )
    claims = Claims(ref, progress or (lambda n: None))
    limit = skipped.EarlyLimit(data.bad_records, shards)

    def written(stats: ShardStats) -> None:
        claims.written(stats)
        limit.written(stats)

    waiting = False
    try:
        while True:
            units = claims.pending(plan(ref.sources, data, ref.root, unit_bytes), share)
            tokenize(task, units, set(), workers, progress or (lambda n: None), written)
            trust.write(units_file(ref), json.dumps({"units": claims.units}))
            if not claims.busy:
                return
            if not waiting:
                log(f"data: {len(claims.busy)} unit(s) are being tokenized by another prepare: waiting for them")
                waiting = True
            claims.wait_for_busy()
    except FileNotFoundError:
        if ref.manifest() is None:
            raise
        log(f"data: the {ref.role} data was completed by another task meanwhile")  # (its folder renamed)
    except DataError as e:
        if share.array:
            if not failed_file(ref).exists():
                trust.write(failed_file(ref), json.dumps({"error": str(e), "array": share.array, "task": share.index}))
        else:
            shutil.rmtree(ref.partial, ignore_errors=True)  # this content can never complete
        raise
    finally:
        claims.release()


def _complete_stats(ref: DatasetRef) -> list[dict[str, Any]] | None:
    """The stats of every unit of the plan, in shard order, when every one is complete and its
    files have the sizes they were sealed with; None otherwise (a unit whose files do not is
    unmarked, so the next prepare tokenizes it again)."""
    counted = read_json(units_file(ref))
    shards = ref.partial / "shards"
    paths = sorted(shards.glob("[0-9]*.json"), key=lambda p: int(p.stem))
    if counted is None or [int(p.stem) for p in paths] != list(range(int(counted["units"]))):
        return None
    stats = [json.loads(p.read_text()) for p in paths]
    for path, s in zip(paths, stats, strict=True):
        for ext, sealed in s["files"].items():
            file = path.with_suffix(ext)
            if not file.is_file() or file.stat().st_size != sealed["size"]:
                path.unlink(missing_ok=True)
                return None
    return stats


def finish(ref: DatasetRef, spec: specmod.JobSpec, log: Log, workers: int) -> dict[str, Any] | None:
    """Write the manifest and rename the partial folder into place when every unit is complete
    (the caller holds the dataset's lock); the manifest, or None while units are missing."""
    stats = _complete_stats(ref)
    if stats is None:
        return None
    partial = ref.partial
    data = ref_data(spec, ref)
    try:
        bad = skipped.summary(data.bad_records, stats)
        tokens = sum(s["tokens"] for s in stats)
        if tokens == 0:
            raise DataError(f"{ref.sources[0].field}: the {ref.role} data holds no text")
    except DataError:
        shutil.rmtree(partial, ignore_errors=True)  # this content can never complete
        raise
    started = read_json(started_file(ref)) or {}
    seconds = time.time() - float(started.get("time", time.time()))
    total = sum(s.size() for s in ref.sources)
    manifest = {
        "version": FORMAT_VERSION,
        "key": ref.key,
        "created": time.time(),
        "tokenizer": spec.data.tokenizer,
        "vocab_size": stats[0]["vocab_size"],
        "eos": stats[0]["eos"],
        "dtype": stats[0]["dtype"],
        "format": data.format,
        "mask": data.format != "text",
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
    shutil.rmtree(claims_dir(ref), ignore_errors=True)
    for path in (units_file(ref), started_file(ref)):
        path.unlink(missing_ok=True)
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
