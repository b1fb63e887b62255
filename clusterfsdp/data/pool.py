"""The process pool that tokenizes a prepare's units: one process per CPU (the tokenizer's Rust
batch encoder in each, single-threaded), forked from a server that imported transformers once,
with a bounded number of units in flight."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from .filekind import SourceUnit
from .readers import ReadTask, UnitReader
from .shards import ShardStats

PRELOAD = [
    "torch",
    "transformers",
    "transformers.models.auto.tokenization_auto",
    "transformers.tokenization_utils_tokenizers",
    "clusterfsdp.data.tokens",
]

_READER: UnitReader | None = None


def _init_pool_process(task: ReadTask) -> None:
    global _READER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"  # the parent shows the progress
    _READER = UnitReader(task)


def _run_in_pool(unit: SourceUnit) -> ShardStats:
    assert _READER is not None
    return _READER.run(unit)


def _bounded(ex: cf.Executor, units: Iterable[SourceUnit], in_flight: int) -> Iterator[ShardStats]:
    """Results of the units in order, with at most `in_flight` submitted at a time (a compressed
    stream is decompressed here only as fast as the pool tokenizes it)."""
    pending: deque[cf.Future] = deque()
    for unit in units:
        pending.append(ex.submit(_run_in_pool, unit))
        while len(pending) >= in_flight:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _pending(units: Iterator[SourceUnit], done: set[int], advance: Callable[[int], None]) -> Iterator[SourceUnit]:
    """The units whose shard is not complete yet (complete ones count as progress)."""
    for unit in units:
        if unit.shard in done:
            advance(unit.weight)
        else:
            yield unit


def tokenize(
    task: ReadTask,
    units: Iterator[SourceUnit],
    done: set[int],
    workers: int,
    advance: Callable[[int], None],
    written: Callable[[ShardStats], None],
) -> None:
    """Write the shard of every unit not in `done`, in `workers` processes (here when 1);
    `advance(source bytes)` as units complete, `written(stats)` as each new shard does, in shard
    order (it may raise to stop the prepare)."""
    todo = _pending(units, done, advance)
    if workers <= 1:
        reader = UnitReader(task)
        for unit in todo:
            stats = reader.run(unit)
            advance(stats.weight)
            written(stats)
        return
    # Forked from a fresh server process that imported torch and transformers once (loading a
    # tokenizer imports both: 3 CPU seconds) rather than from this process, which may hold threads
    # (rich's, torch's), so a worker is ready in a fraction of a second.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_pool_process, initargs=(task,)) as ex:
        try:
            for stats in _bounded(ex, todo, 2 * workers):
                advance(stats.weight)
                written(stats)
        except BaseException:
            ex.shutdown(wait=True, cancel_futures=True)
            raise


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
