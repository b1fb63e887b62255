"""Training data on a rank: batches read from a prepared dataset (or synthetic tokens), in a
seeded global order that every data-parallel rank slices disjointly.

The data position is one integer, `consumed` (global samples used so far). Batch k of any
world size takes the next `world * micro_batch` samples of the same global order, so a
resume on a different number of GPUs neither repeats nor skips a sample. Ranges of that order
that the numerical guard took out (`Skipped`, worker/numguard.py) are passed over: the position
counts the samples read, not the ranges jumped.

Memory does not grow with the corpus: a sample's tokens are read from the shard files with
pread (not memory-mapped: pages of a mapping that random reads touch would stay in the rank's
resident set), the sample index likewise, and the order is computed per index
(index.Permutation). Rank 0 prepares what is missing (prepare.py) while the other ranks
wait for it (rankdata.py opens a job's data for a rank, a mixture included).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import trust
from .index import Permutation
from .shards import shard_offsets
from .sources import DataError
from .tokens import IGNORE_INDEX
from .unpaired import UNDESIRABLE


@dataclass
class Batch:
    """A micro-batch: inputs, shifted labels (IGNORE_INDEX where not trained on), and position
    ids that restart at each document (packing 'documents'; None otherwise). Preference pairs
    (packing 'pairs'): the chosen rows of the micro-batch's pairs, then their rejected rows, and
    `pair_ids` naming each pair (data.samples.pair_id: what a reference log-prob is looked up by).
    Unpaired examples (data.format 'unpaired') likewise, their completion rows then their KL rows,
    and `desirable` the label of each."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor | None = None
    pair_ids: torch.Tensor | None = None
    desirable: torch.Tensor | None = None  # bool per example (unpaired data only)

    def to(self, device: torch.device) -> Batch:
        positions = self.position_ids
        return Batch(
            self.input_ids.to(device, non_blocking=True),
            self.labels.to(device, non_blocking=True),
            None if positions is None else positions.to(device, non_blocking=True),
            self.pair_ids,
            None if self.desirable is None else self.desirable.to(device, non_blocking=True),
        )

    @property
    def label_count(self) -> int:
        """What the step's summed loss is divided by: the trained labels, or for pairs the pairs
        (a preference loss is a mean over pairs)."""
        if self.pair_ids is not None:
            return len(self.pair_ids)
        return int((self.labels != IGNORE_INDEX).sum())


@dataclass(frozen=True)
class Skipped:
    """Ranges [start, end) of positions of the global order that are never read (the samples of a
    run of bad steps, worker/numguard.py), sorted and disjoint. `raw` maps the data position
    (samples read so far) to the position in the order: every range at or before it is jumped.
    A range added beyond a position leaves every position before it where it was, so a
    checkpoint's `consumed` keeps its meaning when ranges are added after it."""

    ranges: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, ranges: list[list[int]]) -> Skipped:
        merged: list[tuple[int, int]] = []
        for start, end in sorted((int(a), int(b)) for a, b in ranges if b > a):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return cls(tuple(merged))

    def raw(self, position: int) -> int:
        for start, end in self.ranges:
            if position < start:
                break
            position += end - start
        return position

    def plus(self, first: int, end: int) -> Skipped:
        """These ranges and the data positions [first, end) (in pieces where they straddle a range)."""
        added, position = [list(r) for r in self.ranges], first
        while position < end:
            at = self.raw(position)
            after = next((start for start, _ in self.ranges if start > at), None)
            n = end - position if after is None else min(end - position, after - at)
            added.append([at, at + n])
            position += n
        return Skipped.of(added)

    def to_json(self) -> list[list[int]]:
        return [[a, b] for a, b in self.ranges]


@dataclass
class Sample:
    input_ids: np.ndarray  # (seq_len,), or (2, seq_len) for a pair: chosen, rejected
    labels: np.ndarray
    positions: np.ndarray | None = None
    pair_id: int = -1  # a pair's id (pair_id), -1 otherwise
    desirable: bool | None = None  # an unpaired example's label (None: not one)


PART_SHIFT = 40  # pair_id: a mixture's source index above the sample index


def pair_id(part: int, k: int) -> int:
    """The id of pair k of a mixture's source `part` (0 without a mixture): unique in a job's data."""
    return (part << PART_SHIFT) | k


class _Reader:
    """Reads ranges of one flat array spread over sealed files of a prepared dataset, with pread
    (O(1) memory); at most MAX_OPEN files are open at a time (a 1 TB corpus has tens of
    thousands of shards). Each file is checked against its seal when first opened (trust.py:
    one fstat, a hash only when its identity changed)."""

    MAX_OPEN = 64

    def __init__(self, dataset: Path, files: list[tuple[Path, dict[str, Any]]], offsets: np.ndarray, dtype: np.dtype):
        self.dataset, self.files, self.offsets, self.dtype = dataset, files, offsets, dtype
        self.fds: OrderedDict[int, int] = OrderedDict()
        self.verified: set[int] = set()

    def _fd(self, i: int) -> int:
        if i in self.fds:
            self.fds.move_to_end(i)
        else:
            if len(self.fds) >= self.MAX_OPEN:
                os.close(self.fds.popitem(last=False)[1])
            path, sealed = self.files[i]
            fd = os.open(path, os.O_RDONLY)
            if i not in self.verified:
                try:
                    trust.verify(fd, path, sealed, self.dataset)
                except DataError:
                    os.close(fd)
                    raise
                self.verified.add(i)
            self.fds[i] = fd
        return self.fds[i]

    def read(self, start: int, length: int) -> np.ndarray:
        out = np.empty(length, self.dtype)
        at = 0
        shard = int(np.searchsorted(self.offsets, start, side="right")) - 1
        while at < length:
            first = start + at - int(self.offsets[shard])
            n = min(length - at, int(self.offsets[shard + 1]) - (start + at))
            raw = _pread(self._fd(shard), n * self.dtype.itemsize, first * self.dtype.itemsize)
            out[at : at + n] = np.frombuffer(raw, self.dtype)
            at, shard = at + n, shard + 1
        return out

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _pread(fd: int, n: int, offset: int) -> bytes:
    parts, got = [], 0
    while got < n:
        chunk = os.pread(fd, n - got, offset + got)
        if not chunk:
            raise DataError(f"prepared data ended early (fd {fd} at {offset + got}): was it modified?")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class PreparedSamples:
    """The samples of one index of a prepared dataset (see index.py)."""

    def __init__(self, folder: Path, index: str, seq_len: int, seed: int, order: str):
        tables = folder / "index" / index
        trust.require(
            folder, folder / "manifest.json", folder / "shards", folder / "index", tables, tables / "meta.json"
        )
        self.manifest: dict[str, Any] = json.loads((folder / "manifest.json").read_text())
        self.meta: dict[str, Any] = json.loads((tables / "meta.json").read_text())
        self.seq_len, self.seed, self.order = seq_len, seed, order
        self.identity = f"{folder.name}/{index}"  # the prepared dataset and sample index it reads
        self.count = int(self.meta["samples"])
        self.documents = self.meta["packing"] == "documents"
        self.pairs = self.meta["packing"] == "pairs"
        self.unpaired = "desirable" in self.meta  # unpaired examples (data/unpaired.py): index.py counted them
        n = len(self.manifest["shards"])
        offsets = shard_offsets(self.manifest)
        shards = folder / "shards"

        def shard_files(ext: str) -> list[tuple[Path, dict[str, Any]]]:
            return [(shards / f"{i:05d}{ext}", self.manifest["shards"][i]["files"][ext]) for i in range(n)]

        self.tokens = _Reader(folder, shard_files(".tok"), offsets, np.dtype(self.manifest["dtype"]))
        self.mask = _Reader(folder, shard_files(".msk"), offsets, np.dtype(np.uint8)) if self.manifest["mask"] else None
        self.table = self.meta["kind"] == "table"
        sealed = self.meta.get("files", {})  # tables only
        i64 = np.dtype(np.int64)
        self.offsets = _Reader(
            folder, [(tables / "samples.i64", sealed.get("samples.i64", {}))], np.array([0, self.count + 1]), i64
        )
        self.segments = _Reader(
            folder, [(tables / "segments.i64", sealed.get("segments.i64", {}))], np.array([0, 1 << 62]), i64
        )
        self.pad = int(self.manifest["eos"])
        self._perm: tuple[int, Permutation] | None = None
        self.skipped = Skipped()  # set by the numerical guard (training order only)

    @property
    def all_labels_trained(self) -> bool:
        """Every label of every batch counts (no mask, no padding, no document boundaries)."""
        return not self.documents and self.mask is None

    def pieces(self, k: int) -> list[tuple[int, int]]:
        """(start, length) ranges of the token stream that sample k is made of: with documents
        packing one per document (or piece of one), its last token only a label; with concat
        packing together one window of seq_len + 1 tokens. `clusterfsdp data show` renders them."""
        return self._ranges(k)

    def _ranges(self, k: int) -> list[tuple[int, int]]:
        if not self.table:
            return [(k * self.seq_len, self.seq_len + 1)]
        a, b = (int(x) for x in self.offsets.read(k, 2))
        flat = self.segments.read(2 * a, 2 * (b - a))
        return [(int(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2)]

    def _labels(self, start: int, length: int) -> np.ndarray:
        labels = self.tokens.read(start + 1, length - 1).astype(np.int64)
        if self.mask is not None:
            labels[self.mask.read(start + 1, length - 1) == 0] = IGNORE_INDEX
        return labels

    def sample(self, k: int) -> Sample:
        """Sample k: input ids, labels and (packing 'documents') position ids, each seq_len long."""
        ranges = self._ranges(k)
        seq = self.seq_len
        if self.pairs:
            return self._pair(k, ranges)
        if not self.documents:  # one window of seq + 1 tokens, maybe in several ranges
            ids = np.concatenate([self.tokens.read(s, n) for s, n in ranges]).astype(np.int64)
            labels = ids[1:].copy()
            if self.mask is not None:
                mask = np.concatenate([self.mask.read(s, n) for s, n in ranges])
                labels[mask[1:] == 0] = IGNORE_INDEX
            return Sample(ids[:-1], labels)
        ids = np.full(seq, self.pad, np.int64)
        labels = np.full(seq, IGNORE_INDEX, np.int64)
        positions = np.zeros(seq, np.int64)
        at = 0
        for s, n in ranges:  # each range: a document (or a piece) of n tokens, n - 1 positions
            ids[at : at + n - 1] = self.tokens.read(s, n - 1)
            labels[at : at + n - 1] = self._labels(s, n)
            positions[at : at + n - 1] = np.arange(n - 1)
            at += n - 1
        return Sample(ids, labels, positions)

    def _pair(self, k: int, ranges: list[tuple[int, int]]) -> Sample:
        """Pair k: its chosen and rejected documents in two rows of seq_len positions, padded."""
        ids = np.full((2, self.seq_len), self.pad, np.int64)
        labels = np.full((2, self.seq_len), IGNORE_INDEX, np.int64)
        for row, (s, n) in enumerate(ranges):
            ids[row, : n - 1] = self.tokens.read(s, n - 1)
            labels[row, : n - 1] = self._labels(s, n)
        desirable = None
        if self.unpaired and self.mask is not None:  # the label is in the completion row's mask
            s, n = ranges[0]
            desirable = bool(self.mask.read(s + 1, n - 1).max(initial=0) != UNDESIRABLE)
        return Sample(ids, labels, pair_id=pair_id(0, k), desirable=desirable)

    def index_of(self, position: int) -> int:
        """The sample at a position of the read order: training epochs reshuffle; eval is fixed."""
        epoch, pos = divmod(position, self.count)
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, Permutation(self.count, self.seed, epoch if self.order == "train" else -1))
        return self._perm[1](pos)

    def batch(self, consumed: int, dp_rank: int, dp_size: int, micro_batch: int) -> Batch:
        """This rank's micro-batch of the global batch that starts at sample `consumed`."""
        first = consumed + dp_rank * micro_batch
        return stack([self.sample(self.index_of(self.skipped.raw(first + i))) for i in range(micro_batch)])


def stack(parts: list[Sample]) -> Batch:
    """Samples as one micro-batch."""
    positions = [p.positions for p in parts if p.positions is not None]
    if parts and parts[0].input_ids.ndim == 2:  # pairs: every chosen row, then every rejected row
        return Batch(
            torch.from_numpy(np.concatenate([np.stack([p.input_ids[j] for p in parts]) for j in (0, 1)])),
            torch.from_numpy(np.concatenate([np.stack([p.labels[j] for p in parts]) for j in (0, 1)])),
            pair_ids=torch.tensor([p.pair_id for p in parts], dtype=torch.int64),
            desirable=None if parts[0].desirable is None else torch.tensor([bool(p.desirable) for p in parts]),
        )
    return Batch(
        torch.from_numpy(np.stack([p.input_ids for p in parts])),
        torch.from_numpy(np.stack([p.labels for p in parts])),
        torch.from_numpy(np.stack(positions)) if positions else None,
    )


class SyntheticSamples:
    """Random tokens from a generator seeded by (seed, sample index): any sample, any rank."""

    all_labels_trained = True

    def __init__(self, seq_len: int, vocab_size: int, seed: int):
        self.seq_len, self.vocab, self.seed = seq_len, vocab_size, seed
        self.count = 1 << 30
        self.skipped = Skipped()

    def batch(self, consumed: int, dp_rank: int, dp_size: int, micro_batch: int) -> Batch:
        first = consumed + dp_rank * micro_batch
        rows = []
        for i in range(micro_batch):
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.skipped.raw(first + i))
            rows.append(torch.randint(0, self.vocab, (self.seq_len + 1,), generator=g))
        tokens = torch.stack(rows)
        return Batch(tokens[:, :-1], tokens[:, 1:])
