"""`.parquet` sources: a unit is one or more row groups (several while they fit in a unit's
bytes, uncompressed), read ROWS_PER_READ rows at a time. pyarrow is imported only when a job
has a Parquet file (it is heavy, and optional for the control plane). Pure Python otherwise."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

from .filekind import ROWS_PER_READ, FileKind, Planning, Record, SourceUnit, UnitReading
from .formats import column_problem
from .sources import DataError, Source


class ParquetFile(FileKind):
    name = "parquet"
    suffix = ".parquet"

    def units(self, src: Source, index: int, shard: int, plan: Planning) -> Iterator[SourceUnit]:
        # pyarrow only for Parquet files
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(src.path)
        problem = column_problem(f"{src.field}: {src.path}", plan.data, pf.schema_arrow.names)
        if problem:
            raise DataError(problem)
        groups = [pf.metadata.row_group(i) for i in range(pf.metadata.num_row_groups)]
        sizes = [g.total_byte_size for g in groups]
        first_rows = [0, *itertools.accumulate(g.num_rows for g in groups)]
        file_size, total = os.path.getsize(src.path), max(1, sum(sizes))
        cuts = [0]
        for i in range(1, len(groups)):
            if sum(sizes[cuts[-1] : i + 1]) > plan.unit_bytes:
                cuts.append(i)
        for a, b in zip(cuts, [*cuts[1:], len(groups)], strict=True):
            yield SourceUnit(shard, index, a, b, file_size * sum(sizes[a:b]) // total, first_rows[a] + 1)
            shard += 1

    def records(self, reader: UnitReading, src: Source, unit: SourceUnit) -> Iterator[Record]:
        # pyarrow only for Parquet files
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(src.path)
        row = unit.first_line
        for group in range(unit.start, unit.stop):
            table = pf.read_row_group(group, columns=reader.fields.columns())
            for at in range(0, table.num_rows, ROWS_PER_READ):
                yield from reader.rows(src, table.slice(at, ROWS_PER_READ).to_pylist(), row + at)
            row += table.num_rows


KIND = ParquetFile()
