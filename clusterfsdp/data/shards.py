"""Shard files of a prepared dataset: writing one (under temporary names, renamed, sealed, its
stats file last: a complete shard has `NNNNN.json`), and reading the manifest's view of them."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import trust
from .tokens import DocumentEncoder, Encoded

EXTENSIONS = (".tok", ".doc", ".msk")


@dataclass
class ShardStats:
    shard: int
    vocab_size: int  # the tokenizer's, recorded with every shard so the manifest needs no tokenizer
    eos: int
    dtype: str
    tokens: int = 0
    documents: int = 0
    skipped: int = 0  # empty records
    records: int = 0  # records read (documents of .txt files not counted), bad ones included
    bad: int = 0  # records left out as unreadable (data.bad_records = 'skip')
    bad_at: list[str] = field(default_factory=list)  # the first skipped.BAD_KEPT: their error lines (file:line)
    max_id: int = -1
    weight: int = 0
    cpu_s: float = 0.0  # CPU time the unit took in its process
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # extension -> trust.seal


class ShardWriter:
    """Token ids (and mask) appended to temporary files; renamed and recorded by `finish`."""

    def __init__(self, folder: Path, shard: int, encoder: DocumentEncoder, chat: bool):
        self.base = folder / f"{shard:05d}"
        self.dtype = encoder.dtype
        self.stats = ShardStats(shard, encoder.vocab_size, encoder.eos, encoder.dtype.name)
        self.tok = open(self._tmp(".tok"), "wb")  # noqa: SIM115 - closed in finish
        self.msk = open(self._tmp(".msk"), "wb") if chat else None  # noqa: SIM115
        self.starts: list[int] = []
        for f in (self.tok, self.msk):
            if f is not None:
                trust.secure(f.fileno())

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
        trust.secure(self._tmp(".doc"))
        for ext in EXTENSIONS:
            if self._tmp(ext).exists():
                os.replace(self._tmp(ext), self.base.with_suffix(ext))
                self.stats.files[ext] = trust.seal(self.base.with_suffix(ext))
        trust.write(self.base.with_suffix(".json"), json.dumps(asdict(self.stats)))
        return self.stats


def shard_offsets(manifest: dict[str, Any]) -> np.ndarray:
    """Global token offset of every shard, and the total at the end."""
    return np.concatenate([[0], np.cumsum([s["tokens"] for s in manifest["shards"]], dtype=np.int64)])


def read_sealed(path: Path, sealed: dict[str, Any], dataset: Path, dtype: type) -> np.ndarray:
    """A whole sealed file of the dataset folder, checked against its seal first."""
    with open(path, "rb") as f:
        trust.verify(f.fileno(), path, sealed, dataset)
        return np.fromfile(f, dtype=dtype)


def document_starts(folder: Path, manifest: dict[str, Any]) -> np.ndarray:
    """Global token offset of every document's start."""
    offsets = shard_offsets(manifest)
    parts = [
        read_sealed(folder / "shards" / f"{i:05d}.doc", shard["files"][".doc"], folder, np.int64) + offsets[i]
        for i, shard in enumerate(manifest["shards"])
    ]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)
