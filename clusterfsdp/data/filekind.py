"""What a kind of source is (.txt, .jsonl, .parquet, a dataset folder): the one interface every
kind of data file implements, so that adding one is a module and a line in `data.kinds`, not a
branch in each of recognition, validate's checks, prepare's planning and its reading.

A kind says which paths it is (`recognises`), what validate checks of its first record
(`sniff`), how prepare cuts a source into units, one shard's worth each (`units`), and what a
unit's records are (`records`, or `read` for a kind that is not records: a .txt file is one
document). The tokenizing and the shard files stay with prepare's reader (`data.readers`), which
each kind reaches through `UnitReading`. Pure Python: the control plane imports the kinds (through
`data.kinds`) for validate and submit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from ..core import spec as specmod
from .fieldmap import FieldMap
from .sources import Source

SNIFF_BYTES = 1 << 20  # what the checks read of a text file to judge it
PIECE_BYTES = 1 << 20  # text per encode call of a long .txt document
ROWS_PER_READ = 1024  # rows of a table (parquet, dataset) read at once


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


@dataclass(frozen=True)
class Planning:
    """What planning a source's units needs besides the source: how its records are read, the
    cache folder (a dataset folder's rows are copied there) and the source bytes per unit."""

    data: specmod.DataSection
    cache: Path
    unit_bytes: int


Record = tuple[Any, object]  # (text or messages, where it is: 'file:line' or a lazy form of it)


class UnitReading(Protocol):
    """What a kind's reading uses of prepare's reader (`data.readers.UnitReader`)."""

    fields: FieldMap
    data: specmod.DataSection
    cache: Path
    opened: dict[int, Any]  # per source index: what a kind keeps open across that source's units

    def unit_bytes(self, src: Source, unit: SourceUnit) -> bytes: ...

    def first_line(self, src: Source, unit: SourceUnit) -> int: ...

    def bad(self, error: Exception) -> None: ...

    def rows(self, src: Source, rows: list[dict[str, Any]], first_row: int) -> Iterator[Record]: ...

    def encode_records(self, records: Iterator[Record], writer: Any) -> None: ...

    def encode_document(self, pieces: list[str], unit: SourceUnit, writer: Any) -> None: ...


class FileKind(ABC):
    """One kind of source; `name` is what the source records and the cache key holds (stable:
    prepared datasets are found by it)."""

    name: ClassVar[str]
    suffix: ClassVar[str] = ""  # a file kind's name ending (before any compression suffix)
    folder: ClassVar[bool] = False  # a folder (its files are the content) rather than a file
    compressible: ClassVar[bool] = False  # also read as .gz / .zst
    one_document: ClassVar[bool] = False  # the whole file is one document (its tokens: bytes + EOS)

    def recognises(self, path: Path, name: str, is_dir: bool) -> bool:
        """Whether `path` (a folder when `is_dir`, looked at once by the caller) is a source of
        this kind; `name` is its lowercased file name without a compression suffix. A file kind
        is recognised by its suffix; a folder kind says what it looks for."""
        return not is_dir and bool(self.suffix) and name.endswith(self.suffix)

    def plain_text(self, src: Source) -> bool:
        """Whether the file's bytes are its text, uncompressed: its size bounds its tokens under
        the byte tokenizer, and its units (cut at byte offsets) are known from its size."""
        return False

    def sniff(self, source: Source, data: specmod.DataSection) -> list[str]:
        """The error lines validate finds in the source's first record (prepare reads it all)."""
        return []

    @abstractmethod
    def units(self, src: Source, index: int, shard: int, plan: Planning) -> Iterator[SourceUnit]:
        """The source's units in order, numbered from `shard`; a function of the content only
        (a prepare that continues an interrupted one cuts the same)."""

    def records(self, reader: UnitReading, src: Source, unit: SourceUnit) -> Iterator[Record]:
        """The unit's records (bad ones passed to `reader.bad`)."""
        raise NotImplementedError

    def read(self, reader: UnitReading, src: Source, unit: SourceUnit, writer: Any) -> None:
        """Tokenize the unit into `writer` (one shard)."""
        reader.encode_records(self.records(reader, src, unit), writer)
