"""Planning a prepare: the sources cut into *units*, one shard's worth each.

The sources are cut into units of about `unit_size(total)` bytes, each by its kind
(`data.kinds`: line-aligned byte ranges of .txt and .jsonl files, chunks of the decompressed
stream of .gz/.zst files, row groups of parquet files, row ranges of datasets); each unit
becomes one shard. The cut depends only on the content, so a prepare that continues an
interrupted one (or a task of a prepare spread over several processes or hosts) cuts the same
units with the same shard numbers. Pure Python.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..core import spec as specmod
from . import kinds
from .filekind import Planning, SourceUnit
from .sources import Source

MIN_UNIT, MAX_UNIT = 1 << 20, 16 << 20  # source bytes per shard (and per task of the pool)


def unit_size(total: int) -> int:
    """Source bytes per unit: about 1/64 of the data (so every process of a pool gets several and
    they finish together), between 1 and 16 MiB. A function of the data only: a prepare that
    continues an interrupted one cuts the same units."""
    return max(MIN_UNIT, min(MAX_UNIT, total // 64))


def plan(sources: tuple[Source, ...], data: specmod.DataSection, cache: Path, unit_bytes: int) -> Iterator[SourceUnit]:
    """Every unit of every source in order; shard numbers depend only on the content."""
    shard = 0
    planning = Planning(data, cache, unit_bytes)
    for i, src in enumerate(sources):
        for unit in kinds.of(src).units(src, i, shard, planning):
            yield unit
            shard = unit.shard + 1
