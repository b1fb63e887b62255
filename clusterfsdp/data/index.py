"""Samples of a prepared dataset for one (seq_len, packing, split), and the order they are read in.

A sample is a list of token ranges of the prepared stream:

- packing 'concat': a window of seq_len + 1 tokens (inputs and shifted labels) of the stream
  of the split's documents. With every document in the split, window k is simply tokens
  [k·seq_len, k·seq_len + seq_len + 1): no table is stored. With a held-out split the windows run
  over the split's documents joined, and each window's ranges are stored.
- packing 'documents': whole documents packed in order into samples of seq_len positions
  (next-fit: a document that does not fit the rest of the sample starts the next one; the rest
  is padding). A document of L tokens gives L - 1 positions (its last token is only a label).
  A document longer than seq_len + 1 tokens is cut into pieces of seq_len positions (each
  piece overlaps the next by the one token that is its last label), each its own context; the
  last, shorter piece is packed like a short document.

Tables (`samples.i64`: n + 1 offsets into `segments.i64`: (start, length) rows) and
`meta.json` are built once, by the process that prepares the data, into
`<dataset>/index/<id>/` (written to a temporary folder and renamed, the tables sealed in
meta.json: trust.py), and read with pread.

The held-out split (eval.fraction) is by document: document d is held out when a hash of
(seed, d) falls below the fraction, so no document is in both splits. When that leaves fewer
than one evaluation batch held out, or less than one global batch to train on (one .txt file is
one document: a corpus of a few big files), it holds out *windows* instead: every document is
cut into pieces of seq_len + 1 tokens, and max(fraction of the pieces, one evaluation batch)
full pieces chosen by the seed are the eval split; every token is still in one split only, but
eval text then comes from the same documents as training text (the log and `validate` say so).
Both splits decide the same way, from the same counts, when the job that first builds them
does (with its batch sizes); later jobs, and resumes on other world sizes, reuse what it built.

The order: sample k of the training order in epoch e is `Permutation(n, seed, e)(k)`, a
bijection of [0, n) computed on the fly (a 4-round Feistel network with cycle walking), so
no rank holds a permutation of the whole dataset in memory.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ..control.spec import JobSpec
from . import trust
from .cache import DatasetRef
from .samplesets import held_out_pieces, holdout_note, index_id, index_meta, per_batch
from .shards import document_starts

M64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finalizer: a bijective, well-mixed 64-bit hash."""
    x &= M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


class Permutation:
    """A seeded bijection of [0, n) evaluated per index in O(1) memory."""

    ROUNDS = 4

    def __init__(self, n: int, *seed: int):
        self.n = n
        bits = max(2, (max(n, 1) - 1).bit_length())
        bits += bits % 2
        self.half, self.mask = bits // 2, (1 << (bits // 2)) - 1
        base = 0
        for s in seed:
            base = mix64(base ^ mix64(s + 0x9E3779B97F4A7C15))
        self.keys = [mix64(base + r) for r in range(self.ROUNDS)]

    def _round_trip(self, x: int) -> int:
        left, right = x >> self.half, x & self.mask
        for k in self.keys:
            left, right = right, left ^ (mix64(right ^ k) & self.mask)
        return (left << self.half) | right

    def __call__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        x = self._round_trip(i)
        while x >= self.n:  # cycle walking: stays a bijection of [0, n)
            x = self._round_trip(x)
        return x


def _uniform(seed: int, n: int) -> np.ndarray:
    """n floats in [0, 1), one per document index, from (seed, index) (vectorized splitmix64)."""
    with np.errstate(over="ignore"):
        x = np.arange(n, dtype=np.uint64) + np.uint64(mix64(seed + 0x5851F42D4C957F2D))
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


# ---------------------------------------------------------------- building
def _least_samples(lengths: np.ndarray, spec: JobSpec) -> int:
    """A lower bound of the samples these documents give (exact for concat)."""
    if spec.packing == "concat":
        return max(0, (int(lengths.sum()) - 1) // spec.data.seq_len)
    return int(np.maximum(lengths - 1, 0).sum()) // spec.data.seq_len


def _pieces(starts: np.ndarray, lengths: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Every document cut into pieces of `size` tokens (its last one shorter): starts, lengths."""
    count = -(-lengths // size)
    doc = np.repeat(np.arange(len(starts)), count)
    k = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    return starts[doc] + k * size, np.minimum(size, lengths[doc] - k * size)


def _split_documents(starts: np.ndarray, total: int, spec: JobSpec, role: str) -> tuple[np.ndarray, np.ndarray, str]:
    """(start, length) of the documents (or pieces) in this split, in stream order, and how the
    split was made: '' (no held-out split), 'documents' or 'windows'."""
    lengths = np.diff(np.append(starts, total))
    if not spec.eval.fraction or spec.eval.paths:
        return starts, lengths, ""
    held = _uniform(spec.job.seed, len(starts)) < spec.eval.fraction
    if _least_samples(lengths[held], spec) >= per_batch(spec, "eval") and _least_samples(
        lengths[~held], spec
    ) >= per_batch(spec, "train"):
        keep = held if role == "eval" else ~held
        return starts[keep], lengths[keep], "documents"
    starts, lengths = _pieces(starts, lengths, spec.data.seq_len + 1)
    full = np.flatnonzero(lengths == spec.data.seq_len + 1)
    k = held_out_pieces(spec, len(starts), len(full))
    held = np.zeros(len(starts), bool)
    if k:
        held[full[np.argpartition(_uniform(spec.job.seed + 1, len(full)), k - 1)[:k]]] = True
    keep = held if role == "eval" else ~held
    return starts[keep], lengths[keep], "windows"


def _concat_table(starts: np.ndarray, lengths: np.ndarray, seq: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows of seq + 1 tokens over the documents joined: offsets and (start, length) ranges."""
    cum = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    n = max(0, (int(cum[-1]) - 1) // seq)
    lo = np.arange(n, dtype=np.int64) * seq
    hi = lo + seq + 1  # exclusive
    first = np.searchsorted(cum, lo, side="right") - 1
    last = np.searchsorted(cum, hi - 1, side="right") - 1
    counts = last - first + 1
    sample = np.repeat(np.arange(n), counts)
    doc = np.repeat(first, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
    vstart = np.maximum(cum[doc], lo[sample])
    vend = np.minimum(cum[doc + 1], hi[sample])
    segments = np.stack([starts[doc] + (vstart - cum[doc]), vend - vstart], axis=1)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), segments.astype(np.int64)


def _documents_table(starts: np.ndarray, lengths: np.ndarray, seq: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Documents (and pieces of long ones) packed next-fit into samples of `seq` positions;
    returns offsets, (start, length) ranges and the padding fraction."""
    positions = lengths - 1
    keep = positions >= 1
    starts, positions = starts[keep], positions[keep]
    pieces = -(-positions // seq)
    doc = np.repeat(np.arange(len(starts)), pieces)
    k = np.arange(pieces.sum()) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    piece_start = starts[doc] + k * seq
    piece_pos = np.minimum(seq, positions[doc] - k * seq)
    full = piece_pos == seq
    # next-fit over the short pieces only: full pieces are samples of their own, in place
    sample_of = np.empty(len(piece_pos), np.int64)
    n_samples, room = 0, 0
    for i, (p, is_full) in enumerate(zip(piece_pos.tolist(), full.tolist(), strict=True)):
        if is_full:
            sample_of[i] = n_samples
            n_samples += 1
            room = 0
            continue
        if p > room:
            n_samples += 1
            room = seq
        sample_of[i] = n_samples - 1
        room -= p
    counts = np.bincount(sample_of, minlength=n_samples)
    segments = np.stack([piece_start, piece_pos + 1], axis=1).astype(np.int64)
    padding = 1 - float(piece_pos.sum()) / max(1, n_samples * seq)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), segments, padding


def build(dataset: Path, out: Path, manifest: dict[str, Any], spec: JobSpec, role: str) -> dict[str, Any]:
    """The index's meta (and its tables, written into `out`) for the prepared `dataset` folder."""
    seq = spec.data.seq_len
    total = int(manifest["tokens"])
    meta: dict[str, Any] = {"role": role, "packing": spec.packing, "seq_len": seq, "padding": 0.0}
    holdout = bool(spec.eval.fraction) and not spec.eval.paths
    if spec.packing == "concat" and not holdout:
        samples = max(0, (total - 1) // seq)
        return {**meta, "kind": "window", "samples": samples, "documents": manifest["documents"], "tokens": total}
    starts, lengths, how = _split_documents(document_starts(dataset, manifest), total, spec, role)
    meta.update(documents=len(starts), tokens=int(lengths.sum()), holdout=how, of_documents=manifest["documents"])
    if spec.packing == "concat":
        offsets, segments = _concat_table(starts, lengths, seq)
    else:
        offsets, segments, meta["padding"] = _documents_table(starts, lengths, seq)
    files = {}
    for name, table in (("samples.i64", offsets), ("segments.i64", segments)):
        table.tofile(out / name)
        trust.secure(out / name)
        files[name] = trust.seal(out / name)
    return {**meta, "kind": "table", "samples": len(offsets) - 1, "files": files}


def ensure(ref: DatasetRef, spec: JobSpec, role: str, log) -> dict[str, Any]:
    """The index of `role` over the prepared dataset `ref`, built now if missing (atomically:
    into a temporary folder, renamed; a concurrent builder's identical result wins)."""
    found = index_meta(ref, spec, role)
    if found is not None:
        return found
    final = ref.folder / "index" / index_id(spec, role)
    manifest = ref.manifest()
    assert manifest is not None, ref.folder
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    trust.mkdirs(tmp)
    try:
        meta = build(ref.folder, tmp, manifest, spec, role)
        trust.write(tmp / "meta.json", json.dumps(meta, indent=1))
        try:
            os.rename(tmp, final)
        except OSError:  # built meanwhile by another process: keep theirs
            if not (final / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    padding = f", {100 * meta['padding']:.1f}% padding" if meta["padding"] else ""
    what = f"pieces of {meta['seq_len'] + 1} tokens" if meta.get("holdout") == "windows" else "documents"
    log(
        f"data: {role} samples: {meta['samples']:,} of seq_len {meta['seq_len']} ({meta['packing']} packing, "
        f"{meta['documents']:,} {what}{padding})"
    )
    if role == "eval" and (note := holdout_note(spec, meta)):
        log(f"data: {note}")
    return meta
