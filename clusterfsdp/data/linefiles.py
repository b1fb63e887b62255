"""What .txt and .jsonl sources share: cut at line ends into units of about `unit_bytes` (byte
ranges of a plain file; chunks of the decompressed stream of a .gz / .zst file), and the
checks of validate that open the file and read its head. Each kind says what a line is
(`data.txtfile`, `data.jsonlfile`). Pure Python."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import IO

from ..core import spec as specmod
from .filekind import PIECE_BYTES, FileKind, Planning, SourceUnit
from .sources import Source, open_binary


def char_start(data: bytes, at: int) -> int:
    """The start of the UTF-8 character holding byte `at`: cutting there splits no character."""
    while at > 0 and data[at] & 0xC0 == 0x80:
        at -= 1
    return at


class LineFile(FileKind):
    """A text file read line by line, maybe compressed; `suffix` names it."""

    compressible = True

    def plain_text(self, src: Source) -> bool:
        return not src.compression

    # ---- validate
    def sniff(self, source: Source, data: specmod.DataSection) -> list[str]:
        where = f"{source.field}: {source.path}"
        if os.path.getsize(source.path) == 0:
            return [f"{where}: empty file"]
        try:
            with open_binary(source.path, source.compression) as f:
                return self.sniff_head(f, where, data)
        except (OSError, EOFError) as e:
            return [f"{where}: cannot read: {e.strerror if isinstance(e, OSError) and e.strerror else e}"]

    def sniff_head(self, f: IO[bytes], where: str, data: specmod.DataSection) -> list[str]:
        """The problems of the file's first SNIFF_BYTES (decompressed), read from `f`."""
        raise NotImplementedError

    # ---- planning
    def units(self, src: Source, index: int, shard: int, plan: Planning) -> Iterator[SourceUnit]:
        if src.compression:
            return self._stream_units(src, index, plan.unit_bytes, shard)
        return self._file_units(src, index, plan.unit_bytes, shard)

    def _file_units(self, src: Source, index: int, unit_bytes: int, shard: int) -> Iterator[SourceUnit]:
        size = os.path.getsize(src.path)
        with open(src.path, "rb") as f:
            pos = 0
            while pos < size:
                end = size if pos + unit_bytes >= size else self._boundary(f, pos + unit_bytes, size)
                yield SourceUnit(shard, index, pos, end, end - pos, 1 if pos == 0 else 0, pos == 0, end == size)
                shard, pos = shard + 1, end

    def _boundary(self, f: IO[bytes], pos: int, size: int) -> int:
        """The first cut at or after `pos`: just after a newline; for a document (.txt) without a
        newline in PIECE_BYTES, at the next UTF-8 character boundary."""
        f.seek(pos)
        scanned = 0
        while pos + scanned < size:
            block = f.read(1 << 16)
            nl = block.find(b"\n")
            if nl >= 0:
                return pos + scanned + nl + 1
            scanned += len(block)
            if self.one_document and scanned >= PIECE_BYTES:
                break
        if not self.one_document or pos + scanned >= size:
            return size
        f.seek(pos)
        head = f.read(4)
        return pos + next((i for i in range(4) if i == len(head) or head[i] & 0xC0 != 0x80), 0)

    def _stream_units(self, src: Source, index: int, unit_bytes: int, shard: int) -> Iterator[SourceUnit]:
        """A compressed file: the decompressed stream, cut after a newline about every unit_bytes."""
        raw = _Counting(open(src.path, "rb"))  # noqa: SIM115 - closed by the with below
        line, counted, carry, first = 1, 0, b"", True
        with raw, open_binary(src.path, src.compression, raw) as stream:  # type: ignore[arg-type]
            while block := stream.read(unit_bytes):
                data = carry + block
                cut = data.rfind(b"\n") + 1
                if cut == 0 and not self.one_document:
                    carry = data  # a record longer than a unit: read on
                    continue
                if cut == 0:  # a document without newlines: keep its last (maybe incomplete) character for later
                    cut = char_start(data, len(data) - 1)
                chunk, carry = data[:cut], data[cut:]
                yield SourceUnit(shard, index, 0, 0, raw.count - counted, line, first, False, chunk)
                line += chunk.count(b"\n")
                counted, first, shard = raw.count, False, shard + 1
            yield SourceUnit(shard, index, 0, 0, raw.count - counted, line, first, True, carry)  # ends the document


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
