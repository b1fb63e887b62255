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
  last, shorter piece is packed like a short document. That is data.overlong = 'split';
  'drop' leaves such documents out and 'truncate' keeps their start (text: the first seq_len + 1
  tokens; a conversation: the longest run of whole leading turns that fits, a turn ending where
  an answer's masked tokens end, so no answer is kept without its prompt; none fits: dropped).
  The policy acts here, on the index (its id names it), not on the prepared tokens: the same
  prepared dataset serves every seq_len and policy.
- packing 'pairs' (data.format = 'preference'): sample k is pair k, its two documents (prompt +
  chosen answer, prompt + rejected answer) in two rows of seq_len positions, padded. A document
  longer than seq_len + 1 tokens keeps its first seq_len + 1 ('split' and 'truncate'), or its pair
  is dropped ('drop'); a pair one of whose answers would keep no trained token is dropped. The
  held-out split (eval.fraction) is by pair. Unpaired examples (data.format = 'unpaired') are
  indexed the same way (prompt + completion, prompt + the KL completion), their labels counted.

meta.json also holds the index's statistics (documents, tokens, samples, what the policy did,
padding, the fraction of label positions trained on, document lengths), which `data prepare`,
a job's log and `validate` show.

Tables (`samples.i64`: n + 1 offsets into `segments.i64`: (start, length) rows) and
`meta.json` are built once, by the process that prepares the data, into
`<dataset>/index/<id>/` (written to a temporary folder and renamed, the tables sealed in
meta.json: trust.py), and read with pread; `validate` and `submit` build those of prepared
data through `python -m clusterfsdp.data.index` (data.checks.build_missing_indexes).

The held-out split (eval.fraction) is by document: document d is held out when a hash of
(seed, d) falls below the fraction, so no document is in both splits. When that leaves fewer
than one evaluation batch held out, or less than one global batch to train on (one .txt file is
one document: a corpus of a few big files), it holds out *windows* instead: every document is
cut into pieces of seq_len + 1 tokens, and max(fraction of the pieces, one evaluation batch)
full pieces chosen by the seed are the eval split; every token is still in one split only, but
eval text then comes from the same documents as training text (the log and `validate` say so).
Documents too short to give one evaluation batch of such pieces (short chat records) are
refused instead, with the least fraction whose documents would (`least_fraction`): a split that
held out nothing read an empty eval set (a mixture's source divided by zero at the first
evaluation, issue 40). Both splits decide the same way, from the same counts, when the job that first builds them
does (with its batch sizes); later jobs, and resumes on other world sizes, reuse what it built.

The order: sample k of the training order in epoch e is `Permutation(n, seed, e)(k)`, a
bijection of [0, n) computed on the fly (a 4-round Feistel network with cycle walking), so
no rank holds a permutation of the whole dataset in memory.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..core.spec import JobSpec, loads
from . import trust
from .cache import DatasetRef
from .mixture import label
from .samplesets import eval_samples, held_out_pieces, holdout_note, index_id, index_meta, per_batch, stats_line
from .shards import document_starts, read_sealed, shard_offsets
from .sources import DataError
from .unpaired import UNDESIRABLE

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


def _split_documents(
    starts: np.ndarray, total: int, spec: JobSpec, role: str, what: str
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(start, length) of the documents (or pieces) in this split, in stream order, and how the
    split was made (meta: 'holdout' '' for none, 'documents' or 'windows'; for windows, the
    documents the fraction held out and which split they left short). DataError, naming what
    to set, when neither way gives one evaluation batch (`what` names the data in it)."""
    lengths = np.diff(np.append(starts, total))
    if not spec.eval.fraction or spec.eval.paths:
        return starts, lengths, {"holdout": ""}
    u = _uniform(spec.job.seed, len(starts))
    held = u < spec.eval.fraction
    eval_ok = _least_samples(lengths[held], spec) >= per_batch(spec, "eval")
    if eval_ok and _least_samples(lengths[~held], spec) >= per_batch(spec, "train"):
        keep = held if role == "eval" else ~held
        return starts[keep], lengths[keep], {"holdout": "documents"}
    facts = {"holdout": "windows", "held_documents": int(held.sum()), "short": "train" if eval_ok else "eval"}
    pieces, sizes = _pieces(starts, lengths, spec.data.seq_len + 1)
    full = np.flatnonzero(sizes == spec.data.seq_len + 1)
    k = held_out_pieces(spec, len(pieces), len(full))
    if eval_samples(spec, k) < per_batch(spec, "eval"):  # documents too short to hold out windows
        raise DataError(_fraction_problem(spec, lengths, u, held, what))
    chosen = np.zeros(len(pieces), bool)
    if k:
        chosen[full[np.argpartition(_uniform(spec.job.seed + 1, len(full)), k - 1)[:k]]] = True
    keep = chosen if role == "eval" else ~chosen
    return pieces[keep], sizes[keep], facts


def _split_counts(lengths: np.ndarray, spec: JobSpec) -> tuple[np.ndarray, np.ndarray]:
    """With the documents held out in the order given: the samples (lower bounds, as
    `_least_samples`) of the first k held out and of the rest, for k = 1..n."""
    seq = spec.data.seq_len
    if spec.packing == "concat":
        held = np.cumsum(lengths)
        rest = int(lengths.sum()) - held
        return np.maximum(held - 1, 0) // seq, np.maximum(rest - 1, 0) // seq
    positions = np.maximum(lengths - 1, 0)
    held = np.cumsum(positions)
    return held // seq, (int(positions.sum()) - held) // seq


def least_fraction(spec: JobSpec, lengths: np.ndarray, u: np.ndarray) -> float | None:
    """The smallest eval.fraction (2 decimals where they do) whose documents held out give one
    evaluation batch and leave one global batch to train on; None when none does."""
    order = np.argsort(u, kind="stable")
    held, rest = _split_counts(lengths[order], spec)
    enough = np.flatnonzero(held >= per_batch(spec, "eval"))
    if not len(enough):
        return None
    last = float(u[order[enough[0]]])  # the fraction must exceed the u of the last document it needs
    ranked = u[order]
    for digits in range(2, 7):
        fraction = (math.floor(last * 10**digits) + 1) / 10**digits
        n = int(np.searchsorted(ranked, fraction, side="left"))  # documents with u < fraction
        if fraction < 1 and rest[n - 1] >= per_batch(spec, "train"):
            return fraction
    return None


def _fraction_problem(spec: JobSpec, lengths: np.ndarray, u: np.ndarray, held: np.ndarray, what: str) -> str:
    """The one line that refuses an eval.fraction that cannot split these documents into one
    evaluation batch and one global batch (when windows cannot either), with what to set."""
    seq, n_eval, n_train = spec.data.seq_len, per_batch(spec, "eval"), per_batch(spec, "train")
    taken, left = _least_samples(lengths[held], spec), _least_samples(lengths[~held], spec)
    said = (
        f"eval.fraction: {spec.eval.fraction:g} holds out {int(held.sum()):,} of the {len(lengths):,} documents of "
        f"{what}: tokens for {taken} eval and {left} training samples of seq_len {seq} ({spec.packing} packing), "
    )
    if taken < n_eval:
        said += f"fewer than one evaluation batch ({spec.world_size} ranks x {spec.train.micro_batch_size}) = {n_eval}"
    else:
        said += f"fewer than one global batch to train on = {n_train}"
    said += f", and its documents are too short to hold out windows of {seq + 1} tokens instead"
    fraction = least_fraction(spec, lengths, u)
    if fraction is None:
        return f"{said}; no fraction gives both: set eval.paths, or lower train.micro_batch_size or data.seq_len"
    if taken < n_eval:
        return f"{said}: raise eval.fraction to at least {fraction:g} or set eval.paths"
    return f"{said}: set eval.fraction to {fraction:g} or set eval.paths"


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


def _masks(dataset: Path, manifest: dict[str, Any], shards: np.ndarray) -> dict[int, np.ndarray]:
    """The loss masks (uint8 per token) of the given shards, read whole and checked against their seals."""
    return {
        int(i): read_sealed(
            dataset / "shards" / f"{i:05d}.msk", manifest["shards"][i]["files"][".msk"], dataset, np.uint8
        )
        for i in shards
    }


def _fit(
    dataset: Path, manifest: dict[str, Any], starts: np.ndarray, lengths: np.ndarray, spec: JobSpec
) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """data.overlong applied to the documents longer than seq_len positions: (starts, lengths, counts)."""
    seq, policy = spec.data.seq_len, spec.data.overlong
    over = lengths - 1 > seq
    counts = {"overlong": int(over.sum()), "split": 0, "truncated": 0, "dropped": 0}
    if policy == "split":
        counts["split"] = counts["overlong"]
        return starts, lengths, counts
    keep = ~over
    lengths = lengths.copy()
    if policy == "truncate" and manifest["mask"]:
        offsets = shard_offsets(manifest)
        shard_of = np.searchsorted(offsets, starts, side="right") - 1
        masks = _masks(dataset, manifest, np.unique(shard_of[over]))
        for d in np.flatnonzero(over):
            at = int(starts[d] - offsets[shard_of[d]])
            m = masks[int(shard_of[d])][at : at + seq + 2].astype(np.int8)  # one past the longest prefix kept
            ends = np.flatnonzero(np.diff(m) == -1) + 1  # token counts that end an answer
            if len(ends):
                lengths[d], keep[d] = int(ends[-1]), True
    elif policy == "truncate":
        lengths[over], keep[over] = seq + 1, True
    counts["truncated"] = int((over & keep).sum())
    counts["dropped"] = int((over & ~keep).sum())
    return starts[keep], lengths[keep], counts


def _pair_split(n: int, spec: JobSpec, role: str, what: str) -> np.ndarray:
    """The pairs of this split (eval.fraction: pair p held out when a hash of (seed, p) falls below
    it); DataError when either split would hold less than one batch."""
    if not spec.eval.fraction or spec.eval.paths:
        return np.ones(n, bool)
    held = _uniform(spec.job.seed, n) < spec.eval.fraction
    n_eval, n_train = per_batch(spec, "eval"), per_batch(spec, "train")
    if held.sum() < n_eval or (~held).sum() < n_train:
        raise DataError(
            f"eval.fraction: {spec.eval.fraction:g} holds out {int(held.sum())} of the {n} pairs of {what}, "
            f"leaving {int((~held).sum())}: one evaluation batch needs {n_eval} and one global batch {n_train}; "
            "set eval.fraction (or eval.paths) so that both fit"
        )
    return held if role == "eval" else ~held


def _pairs(
    dataset: Path, out: Path, manifest: dict[str, Any], spec: JobSpec, role: str, what: str, meta: dict[str, Any]
) -> dict[str, Any]:
    """The index of preference pairs (packing 'pairs'): two (start, length) rows per sample."""
    seq, policy = spec.data.seq_len, spec.data.overlong
    starts = document_starts(dataset, manifest)
    if len(starts) % 2:
        raise DataError(f"{dataset}: a preference dataset holds an odd number of documents: prepare it again")
    lengths = np.diff(np.append(starts, int(manifest["tokens"])))
    pair_starts, pair_lengths = starts.reshape(-1, 2), lengths.reshape(-1, 2)
    keep = _pair_split(len(pair_starts), spec, role, what)
    over = (pair_lengths - 1 > seq).any(axis=1) & keep
    counts = {"overlong": int(over.sum()), "split": 0, "truncated": 0, "dropped": 0}
    if policy == "drop":
        keep &= ~over
    elif over.any():  # keep the first seq + 1 tokens, if an answer's token is left in each
        offsets = shard_offsets(manifest)
        shard_of = np.searchsorted(offsets, pair_starts, side="right") - 1
        masks = _masks(dataset, manifest, np.unique(shard_of[over]))
        for p in np.flatnonzero(over):
            for j in range(2):
                at = int(pair_starts[p, j] - offsets[shard_of[p, j]])
                if not masks[int(shard_of[p, j])][at + 1 : at + min(seq + 1, int(pair_lengths[p, j]))].any():
                    keep[p] = False
    counts["dropped"] = int((over & ~keep).sum())
    counts["truncated"] = int((over & keep).sum())
    if spec.data.format == "unpaired" or any(s.format == "unpaired" for s in spec.data.sources):
        meta.update(_labels(dataset, manifest, spec, pair_starts[keep, 0], pair_lengths[keep, 0], role, what))
    rows = np.stack([pair_starts[keep], np.minimum(pair_lengths[keep], seq + 1)], axis=2).reshape(-1, 2)
    n = int(keep.sum())
    offsets_table = np.arange(0, 2 * n + 1, 2, dtype=np.int64)
    segments = rows.astype(np.int64)
    meta.update(
        documents=2 * n,
        tokens=int(segments[:, 1].sum()),
        of_documents=manifest["documents"],
        holdout="pairs" if spec.eval.fraction and not spec.eval.paths else "",
        lengths=_lengths(pair_lengths[keep].reshape(-1)),
        overlong=counts,
        policy=policy,
        padding=1 - float((segments[:, 1] - 1).sum()) / max(1, 2 * n * seq),
        trained=_trained(dataset, manifest, segments) / max(1, 2 * n * seq),
    )
    files = {}
    for name, table in (("samples.i64", offsets_table), ("segments.i64", segments)):
        table.tofile(out / name)
        trust.secure(out / name)
        files[name] = trust.seal(out / name)
    return {**meta, "kind": "table", "samples": n, "files": files}


def _labels(
    dataset: Path,
    manifest: dict[str, Any],
    spec: JobSpec,
    starts: np.ndarray,
    lengths: np.ndarray,
    role: str,
    what: str,
) -> dict[str, int]:
    """How many of these unpaired examples (their completion rows) are desirable and undesirable
    (the label is in the mask: data/unpaired.py); DataError for training data without either
    (a mixture's sources are checked together: mixture.labels_problem): KTO weighs one against
    the other (TRL would train on, pushing one way only)."""
    offsets = shard_offsets(manifest)
    shard_of = np.searchsorted(offsets, starts, side="right") - 1
    masks = _masks(dataset, manifest, np.unique(shard_of))
    bad = sum(
        int(masks[int(i)][s - offsets[i] : s - offsets[i] + n].max(initial=0) == UNDESIRABLE)
        for s, n, i in zip(starts.tolist(), lengths.tolist(), shard_of.tolist(), strict=True)
    )
    good = len(starts) - bad
    if role == "train" and len(spec.data.sources) < 2 and len(starts) and not (good and bad):
        have, lacks = ("desirable", "undesirable (label false)") if good else ("undesirable", "desirable (label true)")
        raise DataError(
            f"{what}: all {len(starts):,} unpaired examples are {have}: train.objective = 'kto' needs {lacks} "
            "examples too (check data.label_key)"
        )
    return {"desirable": good, "undesirable": bad}


def _trained(dataset: Path, manifest: dict[str, Any], segments: np.ndarray) -> int:
    """Label positions trained on in these (start, length) segments: each segment's tokens after its
    first, and for chat only those the mask marks."""
    if not manifest["mask"]:
        return int((segments[:, 1] - 1).sum())
    offsets = shard_offsets(manifest)
    shard_of = np.searchsorted(offsets, segments[:, 0], side="right") - 1
    total = 0
    for i, mask in _masks(dataset, manifest, np.unique(shard_of)).items():
        cum = np.concatenate([[0], np.cumsum(mask != 0, dtype=np.int64)])  # (an undesirable completion's are 2)
        rows = segments[shard_of == i]
        lo = rows[:, 0] - offsets[i] + 1
        total += int((cum[lo + rows[:, 1] - 1] - cum[lo]).sum())
    return total


def _trained_share(dataset: Path, manifest: dict[str, Any]) -> float:
    """The share of the whole stream's tokens the mask trains on (concat windows of chat data)."""
    masks = _masks(dataset, manifest, np.arange(len(manifest["shards"])))
    return sum(int(np.count_nonzero(m)) for m in masks.values()) / max(1, int(manifest["tokens"]))


def _lengths(lengths: np.ndarray) -> dict[str, int]:
    """Token-length statistics of the documents."""
    if not len(lengths):
        return {}
    p50, p95 = np.percentile(lengths, [50, 95])
    return {"min": int(lengths.min()), "median": round(p50), "p95": round(p95), "max": int(lengths.max())}


def build(
    dataset: Path, out: Path, manifest: dict[str, Any], spec: JobSpec, role: str, what: str = "the training data"
) -> dict[str, Any]:
    """The index's meta (and its tables, written into `out`) for the prepared `dataset` folder
    (`what` names it in an error)."""
    seq = spec.data.seq_len
    total = int(manifest["tokens"])
    meta: dict[str, Any] = {"role": role, "packing": spec.packing, "seq_len": seq, "padding": 0.0}
    holdout = bool(spec.eval.fraction) and not spec.eval.paths
    if spec.packing == "concat" and not holdout:
        samples = max(0, (total - 1) // seq)
        trained = _trained_share(dataset, manifest) if manifest["mask"] else 1.0
        return {
            **meta,
            "kind": "window",
            "samples": samples,
            "documents": manifest["documents"],
            "tokens": total,
            "trained": trained,
        }
    if spec.packing == "pairs":
        return _pairs(dataset, out, manifest, spec, role, what, meta)
    starts, lengths, split = _split_documents(document_starts(dataset, manifest), total, spec, role, what)
    meta.update(documents=len(starts), tokens=int(lengths.sum()), of_documents=manifest["documents"], **split)
    meta["lengths"] = _lengths(lengths)
    if spec.packing == "concat":
        offsets, segments = _concat_table(starts, lengths, seq)
    else:
        starts, lengths, meta["overlong"] = _fit(dataset, manifest, starts, lengths, spec)
        meta["policy"] = spec.data.overlong
        offsets, segments, meta["padding"] = _documents_table(starts, lengths, seq)
    meta["trained"] = _trained(dataset, manifest, segments) / max(1, (len(offsets) - 1) * seq)
    files = {}
    for name, table in (("samples.i64", offsets), ("segments.i64", segments)):
        table.tofile(out / name)
        trust.secure(out / name)
        files[name] = trust.seal(out / name)
    return {**meta, "kind": "table", "samples": len(offsets) - 1, "files": files}


def ensure(ref: DatasetRef, spec: JobSpec, role: str, log) -> dict[str, Any]:
    """The index of `role` over the prepared dataset `ref`, built now if missing (atomically:
    into a temporary folder, renamed; a concurrent builder's identical result wins)."""
    meta = index_meta(ref, spec, role)
    if meta is None:
        meta = _build_atomically(ref, spec, role, label(spec, ref.part) if ref.part >= 0 else "the training data")
    log(f"data: {stats_line(role, meta)}")
    if role == "eval" and (note := holdout_note(spec, meta)):
        log(f"data: {note}")
    return meta


def _build_atomically(ref: DatasetRef, spec: JobSpec, role: str, what: str) -> dict[str, Any]:
    final = ref.folder / "index" / index_id(spec, role)
    manifest = ref.manifest()
    assert manifest is not None, ref.folder
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    trust.mkdirs(tmp)
    try:
        meta = build(ref.folder, tmp, manifest, spec, role, what)
        trust.write(tmp / "meta.json", json.dumps(meta, indent=1))
        try:
            os.rename(tmp, final)
        except OSError:  # built meanwhile by another process: keep theirs
            if not (final / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return meta


def main(argv: list[str]) -> int:
    """`python -m clusterfsdp.data.index ROLE:PART:FOLDER...` with the job's TOML on stdin: build
    the sample indexes of `role` of these prepared datasets (data.checks.build_missing_indexes,
    for validate and submit); each that the job would refuse is an `error: ` line on stdout
    (exit 2). A cache folder this user cannot write to is left to the job."""
    spec = loads(sys.stdin.read())
    errors = []
    for item in argv:
        role, part, folder = item.split(":", 2)
        ref = DatasetRef("train" if role == "train" or not spec.eval.paths else "eval", (), Path(folder).name,
                         Path(folder).parent, int(part))  # fmt: skip
        try:
            ensure(ref, spec, role, lambda _: None)
        except DataError as e:  # both roles of a held-out split meet the same problem: said once
            errors += [] if f"error: {e}" in errors else [f"error: {e}"]
        except OSError:
            continue
    print("\n".join(errors))
    return 2 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
