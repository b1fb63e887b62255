"""Whether an eval set (eval.paths) shares documents with the training set: an eval loss on
documents the model trains on measures memorization. Pure Python (validate asks it too) and
cheap: the eval documents are hashed (their token bytes, xxh3-64), then only the training
documents of a length some eval document has are read and hashed, up to BUDGET_BYTES of them.
A document continued across shards (a .txt file longer than a unit) is compared by its
pieces, so only its first piece can match."""

from __future__ import annotations

import itertools
import os
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import xxhash

from ..core.value import value
from . import trust
from .cache import DatasetRef

BUDGET_BYTES = 64 << 20  # token bytes read of each dataset at most


@value(frozen=True)
class Overlap:
    """How many eval documents are also training documents (a leak worth a warning)."""

    shared: int  # distinct eval documents that are also training documents
    checked: int  # distinct eval documents compared
    complete: bool  # False: a budget ran out before every candidate was compared

    def warning(self) -> str | None:
        if not self.shared:
            return None
        part = "" if self.complete else f" (of the part compared: {BUDGET_BYTES >> 20} MB of each set)"
        return (
            f"eval.paths: {self.shared:,} of {self.checked:,} distinct eval documents are also training "
            f"documents{part}: their eval loss measures memorization"
        )


def _sealed_bytes(folder: Path, shard: int, ext: str, manifest: dict[str, Any]) -> bytes:
    path = folder / "shards" / f"{shard:05d}{ext}"
    fd = os.open(path, os.O_RDONLY)
    try:
        trust.verify(fd, path, manifest["shards"][shard]["files"][ext], folder)
        return os.pread(fd, os.fstat(fd).st_size, 0)
    finally:
        os.close(fd)


def _documents(folder: Path, manifest: dict[str, Any], shard: int) -> list[tuple[int, int]]:
    """(start, end) in bytes of the documents that start in a shard (their part in it)."""
    starts = array("q")
    starts.frombytes(_sealed_bytes(folder, shard, ".doc", manifest))
    item = 2 if manifest["dtype"] == "uint16" else 4
    bounds = [s * item for s in starts] + [int(manifest["shards"][shard]["tokens"]) * item]
    return list(itertools.pairwise(bounds))


def _hashes(folder: Path, manifest: dict[str, Any], wanted: set[int] | None) -> Iterator[tuple[int, int] | None]:
    """(byte length, hash) of each document (of a length in `wanted`, when given); None once
    BUDGET_BYTES of shards were read."""
    read = 0
    for shard in range(len(manifest["shards"])):
        docs = _documents(folder, manifest, shard)
        if wanted is not None:
            docs = [(a, b) for a, b in docs if b - a in wanted]
        if not docs:
            continue
        if read >= BUDGET_BYTES:
            yield None
            return
        data = _sealed_bytes(folder, shard, ".tok", manifest)
        read += len(data)
        for a, b in docs:
            yield b - a, xxhash.xxh3_64_intdigest(data[a:b])


def shared_documents(train: DatasetRef, held: DatasetRef) -> Overlap | None:
    """How many eval documents are training documents; None when either is not prepared."""
    tm, em = train.manifest(), held.manifest()
    if tm is None or em is None or tm["dtype"] != em["dtype"]:
        return None
    seen: dict[tuple[int, int], bool] = {}
    complete = True
    for sig in _hashes(held.folder, em, None):
        if sig is None:
            complete = False
            break
        seen[sig] = False
    lengths = {n for n, _ in seen}
    for sig in _hashes(train.folder, tm, lengths):
        if sig is None:
            complete = False
            break
        if sig in seen:
            seen[sig] = True
    return Overlap(sum(seen.values()), len(seen), complete)
