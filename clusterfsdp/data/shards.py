"""Shard files of a prepared dataset: writing one (under temporary names, renamed, its stats
file last: a complete shard has `NNNNN.json`), and reading the manifest's view of them."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..control import runfolder
from .tokens import DocumentEncoder, Encoded


@dataclass
class ShardStats:
    shard: int
    vocab_size: int  # the tokenizer's, recorded with every shard so the manifest needs no tokenizer
    eos: int
    dtype: str
    tokens: int = 0
    documents: int = 0
    skipped: int = 0  # empty records
    max_id: int = -1
    weight: int = 0
    cpu_s: float = 0.0  # CPU time the unit took in its process


class ShardWriter:
    """Token ids (and mask) appended to temporary files; renamed and recorded by `finish`."""

    def __init__(self, folder: Path, shard: int, encoder: DocumentEncoder, chat: bool):
        self.base = folder / f"{shard:05d}"
        self.dtype = encoder.dtype
        self.stats = ShardStats(shard, encoder.vocab_size, encoder.eos, encoder.dtype.name)
        self.tok = open(self._tmp(".tok"), "wb")  # noqa: SIM115 - closed in finish
        self.msk = open(self._tmp(".msk"), "wb") if chat else None  # noqa: SIM115
        self.starts: list[int] = []

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
        for ext in (".doc", ".msk", ".tok"):
            if self._tmp(ext).exists():
                os.replace(self._tmp(ext), self.base.with_suffix(ext))
        runfolder.atomic_write(self.base.with_suffix(".json"), json.dumps(asdict(self.stats)))
        return self.stats


def shard_offsets(manifest: dict[str, Any]) -> np.ndarray:
    """Global token offset of every shard, and the total at the end."""
    return np.concatenate([[0], np.cumsum([s["tokens"] for s in manifest["shards"]], dtype=np.int64)])


def document_starts(folder: Path, manifest: dict[str, Any]) -> np.ndarray:
    offsets = shard_offsets(manifest)
    parts = [
        np.fromfile(folder / "shards" / f"{i:05d}.doc", dtype=np.int64) + offsets[i]
        for i in range(len(manifest["shards"]))
    ]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)
