"""A mixture of datasets (`[[data.sources]]`): which source each sample of the training order
comes from, what an epoch of a mixture is, and the per-source shares `data prepare`, `validate`
and the job's log report. Pure Python (validate imports it); the reader is mixsamples.py.

Each source is its own prepared dataset with its own sample index (cache.dataset_refs), so a
source's samples are seq_len positions of that source only. The training order interleaves
them by weight as a pure function of (seed, position): positions are cut into blocks of BLOCK;
in every block source i gets c_i positions (its weight's share of BLOCK, at least one), laid
out evenly (the k-th of source i at key (k + phase_i) / c_i, the phases drawn from (seed,
block)), so any prefix of a block holds each source's share within one sample. The j-th
position drawn from source i reads that source's sample j of its own seeded order (reshuffled
at each of its passes, as for one dataset). Nothing is stateful: the data position stays one
integer (samples consumed), so a resume on any world size continues exactly.

An epoch of a mixture is as many samples as its sources hold together (the sum of their sample
counts): with weights proportional to the sources' sizes that is one pass over each; otherwise
source i is passed weight_i x total / samples_i times per epoch, which the report says.
"""

from __future__ import annotations

from typing import Any

import xxhash

from ..core import spec as specmod
from ..core.value import value
from .cache import DatasetRef
from .samplesets import batch_problem, epochs_note, eval_batches_note, index_meta, sample_roles, total_steps

BLOCK = 1 << 12  # positions per block of the interleave: weights are kept to 1/4096


def block_counts(weights: list[float], block: int = BLOCK) -> list[int]:
    """Positions per block for each source: largest remainders of the normalized weights, at
    least one each (a source with a weight is never left out)."""
    total = sum(weights)
    exact = [w / total * block for w in weights]
    counts = [max(1, int(x)) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - int(exact[i])), i))
    for i in by_remainder[: max(0, block - sum(counts))]:
        counts[i] += 1
    while sum(counts) > block:  # the minimum of one took positions: from the largest
        counts[max(range(len(counts)), key=lambda i: counts[i])] -= 1
    return counts


class Schedule:
    """Which source, and which of its samples, each position of the training order reads."""

    def __init__(self, weights: list[float], seed: int, block: int = BLOCK):
        self.counts, self.seed, self.block = block_counts(weights, block), seed, block
        self._cached: tuple[int, list[tuple[int, int]]] | None = None

    def _layout(self, b: int) -> list[tuple[int, int]]:
        """Block b: (source, k) at each of its positions, k counting that source's positions."""
        if self._cached is None or self._cached[0] != b:
            items = []
            for i, c in enumerate(self.counts):
                phase = xxhash.xxh3_64_intdigest(f"mixture:{self.seed}:{b}:{i}".encode()) / 2.0**64
                items += [((k + phase) / c, i, k) for k in range(c)]
            items.sort()
            self._cached = (b, [(i, k) for _, i, k in items])
        return self._cached[1]

    def __call__(self, position: int) -> tuple[int, int]:
        """(source, that source's sample position) of a position of the training order."""
        b, j = divmod(position, self.block)
        source, k = self._layout(b)[j]
        return source, b * self.counts[source] + k


@value(frozen=True)
class Part:
    """One source of a mixture as the report needs it."""

    label: str  # e.g. "data.sources[1] (/data/alpaca.jsonl)"
    weight: float
    samples: int
    trained: float  # fraction of its sample positions trained on (index meta 'trained')


def epoch_samples(parts: list[Part]) -> int:
    """The samples of one epoch of the mixture: all its sources' samples together."""
    return sum(p.samples for p in parts)


def share_lines(parts: list[Part]) -> list[str]:
    """One line per source: its weight, samples, share of the samples (= of the positions, each
    sample being seq_len positions), share of the trained tokens (padding and masked prompts
    left out), and passes over it per epoch."""
    counts = block_counts([p.weight for p in parts])
    total = sum(counts)
    trained = [c * p.trained for c, p in zip(counts, parts, strict=True)]
    per_epoch = epoch_samples(parts)
    out = []
    for p, c, t in zip(parts, counts, trained, strict=True):
        passes = c / total * per_epoch / max(p.samples, 1)
        out.append(
            f"mixture: {p.label}: weight {p.weight:g}, {p.samples:,} samples, {100 * c / total:.1f}% of the samples, "
            f"{100 * t / max(sum(trained), 1e-12):.1f}% of the trained tokens, {passes:.2f} passes per epoch"
        )
    return out


def label(spec: specmod.JobSpec, part: int) -> str:
    return f"data.sources[{part}] ({spec.data.sources[part].path})"


def part(spec: specmod.JobSpec, ref: DatasetRef, meta: dict[str, Any]) -> Part:
    weight = spec.data.sources[ref.part].weight
    return Part(label(spec, ref.part), weight, int(meta["samples"]), float(meta.get("trained", 1.0)))


def part_problem(spec: specmod.JobSpec, role: str, part: int, meta: dict[str, Any]) -> str | None:
    """An error line when a source of the mixture gives no samples of `role`: the mixture reads
    every source in its proportion (a source smaller than a batch is read again, an empty one
    cannot be)."""
    if int(meta["samples"]) > 0:
        return None
    dropped = int((meta.get("overlong") or {}).get("dropped", 0))
    if dropped and spec.packing == "pairs":  # pairs are never split: only a longer seq_len keeps them
        why = f" ({dropped:,} pairs left out: longer than seq_len, an answer cut off or data.overlong = 'drop')"
        fix = "raise data.seq_len"
    elif dropped:
        why = f" (data.overlong = {spec.data.overlong!r} left out {dropped:,} documents longer than seq_len)"
        fix = "set data.overlong = 'split' or raise data.seq_len"
    else:
        why, fix = "", "give it more data, lower data.seq_len or remove the source"
    return (
        f"{label(spec, part)}: 0 {role} samples of seq_len {spec.data.seq_len} ({spec.packing} packing){why}, and "
        f"the mixture reads every source in its proportion: {fix}"
    )


def labels_problem(metas: list[dict[str, Any]]) -> str | None:
    """An error line when the training sources of a mixture of unpaired examples (their index
    metas count the labels: index._labels) hold no desirable or no undesirable example between
    them (a single source is refused as it is indexed; in a mixture one source may hold each kind)."""
    if not metas or any("desirable" not in m for m in metas):
        return None
    good, bad = sum(int(m["desirable"]) for m in metas), sum(int(m["undesirable"]) for m in metas)
    if not good + bad or (good and bad):
        return None
    have, lacks = ("desirable", "undesirable (label false)") if good else ("undesirable", "desirable (label true)")
    return (
        f"data.sources: all {good + bad:,} unpaired examples of the mixture are {have}: train.objective = 'kto' "
        f"needs {lacks} examples too (check each source's label_key)"
    )


def state_lines(spec: specmod.JobSpec, refs: list[DatasetRef]) -> list[str]:
    """validate's lines about a mixture whose sources are all indexed: each source's share, the
    steps of train.epochs, the eval samples held out of the sources (eval.fraction), and an
    error line when one epoch (or the held-out set) is less than one batch."""
    mixed = [r for r in refs if r.part >= 0]
    out = []
    for role, data_role in sample_roles(spec):
        metas = [index_meta(r, spec, role) if r.key is not None else None for r in mixed]
        if data_role != "train" or not metas or None in metas:
            continue
        parts = [part(spec, r, m) for r, m in zip(mixed, metas, strict=True) if m]
        samples = epoch_samples(parts)
        if role == "train":
            out += [f"train: {line}" for line in share_lines(parts)]
        else:
            each = ", ".join(f"{p.samples:,}" for p in parts)
            out.append(f"eval: {samples:,} samples held out of the sources ({each}), read in the mixture's proportions")
        empty = [part_problem(spec, role, r.part, m) for r, m in zip(mixed, metas, strict=True) if m]
        empty.append(labels_problem([m for m in metas if m]) if role == "train" else None)
        out += [f"error: {problem}" for problem in empty if problem]
        if problem := batch_problem(spec, role, samples):
            out.append(f"error: {problem}")
        elif role == "train" and (note := epochs_note(spec, samples, total_steps(spec, samples))):
            out.append(f"train: {note}")
        elif role == "eval" and (note := eval_batches_note(spec, samples)):
            out.append(f"eval: {note}")
    return out
