"""The sample sets a job reads (training samples, evaluation samples) and what they must hold:
which prepared dataset each comes from, the name of its sample index, and whether it is big
enough for one step. Pure Python: `validate` answers from an index's meta.json, the job from
the index it builds (index.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from ..core import spec as specmod
from . import trust
from .cache import FORMAT_VERSION, DatasetRef, text_hash


def index_id(spec: specmod.JobSpec, role: str) -> str:
    """Names the sample index of one (seq_len, packing, split, data.overlong) of a prepared dataset."""
    holdout = spec.eval.fraction if not spec.eval.paths else 0.0
    payload = {
        "v": FORMAT_VERSION,
        "seq_len": spec.data.seq_len,
        "packing": spec.packing,
        "role": role,
        "holdout": holdout,
        "seed": spec.job.seed if holdout else 0,
    }
    # ('split' keeps the ids built before it)
    if spec.packing in ("documents", "pairs") and spec.data.overlong != "split":
        payload["overlong"] = spec.data.overlong
    return text_hash(json.dumps(payload, sort_keys=True))[:16]


def index_meta(ref: DatasetRef, spec: specmod.JobSpec, role: str) -> dict[str, Any] | None:
    """The meta of a built sample index (None: not built); DataError if it is not one to trust."""
    folder = ref.folder / "index" / index_id(spec, role)
    trust.require(ref.folder / "index", folder, folder / "meta.json")
    try:
        return json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def sample_roles(spec: specmod.JobSpec) -> Iterator[tuple[str, str]]:
    """(sample set, dataset role) pairs a job reads: train from the train data; eval from the
    held-out part of the train data or from eval.paths."""
    yield "train", "train"
    if spec.eval.paths:
        yield "eval", "eval"
    elif spec.eval.fraction:
        yield "eval", "train"


def per_batch(spec: specmod.JobSpec, role: str) -> int:
    """Samples one step reads (train: the global batch) or one evaluation batch reads (eval)."""
    return spec.global_batch if role == "train" else spec.world_size * spec.train.micro_batch_size


def batch_problem(spec: specmod.JobSpec, role: str, samples: int, meta: dict[str, Any] | None = None) -> str | None:
    """An error line when a sample set is smaller than what one step (or one evaluation) reads,
    with what to change (`meta`, the index's: documents data.overlong left out)."""
    per_step = per_batch(spec, role)
    if samples >= per_step:
        return None
    lost = int(((meta or {}).get("overlong") or {}).get("dropped", 0))
    if role == "train":
        what = (
            f"one global batch ({spec.world_size} ranks x {spec.train.micro_batch_size} x {spec.train.grad_accum} "
            "accumulation)"
        )
        key = "data.sources" if spec.data.sources else "data.paths"
        fix = "add training data, or lower train.micro_batch_size, train.grad_accum or data.seq_len"
        if spec.eval.fraction and not spec.eval.paths:
            fix += ", or lower eval.fraction"
    else:
        what = f"one evaluation batch ({spec.world_size} ranks x {spec.train.micro_batch_size})"
        key = "eval.paths" if spec.eval.paths else "eval.fraction"
        fix = (
            "add eval data, or lower train.micro_batch_size or data.seq_len"
            if spec.eval.paths
            else "raise eval.fraction or set eval.paths"
        )
    if lost and spec.packing == "pairs":  # pairs are never split: only a longer seq_len keeps them
        fix = f"raise data.seq_len ({lost:,} pairs left out: longer than seq_len, an answer cut off or 'drop')"
    elif lost:  # fewer samples would not help: the documents were left out for being longer than seq_len
        fix = f"set data.overlong = 'split' or raise data.seq_len ({lost:,} longer documents left out)"
    return (
        f"{key}: the {role} data gives {samples} samples of seq_len {spec.data.seq_len} ({spec.packing} packing), "
        f"fewer than {what} = {per_step}: {fix}"
    )


def held_out_pieces(spec: specmod.JobSpec, pieces: int, full: int) -> int:
    """How many of a dataset's `pieces` of seq_len + 1 tokens (`full` of them whole) a held-out
    split by windows takes: the fraction, at least one evaluation batch, whole pieces only."""
    return min(full, max(math.ceil(spec.eval.fraction * pieces), per_batch(spec, "eval")))


def eval_samples(spec: specmod.JobSpec, pieces: int) -> int:
    """The samples `pieces` whole pieces of seq_len + 1 tokens give."""
    return (
        pieces if spec.packing == "documents" else max(0, (pieces * (spec.data.seq_len + 1) - 1) // spec.data.seq_len)
    )


def holdout_note(spec: specmod.JobSpec, meta: dict[str, Any]) -> str | None:
    """What the log and `validate` say about an eval split held out of the training data by
    windows (index.py: the documents the fraction holds out give fewer than one evaluation
    batch, or leave fewer than one global batch to train on)."""
    if meta.get("holdout") != "windows":
        return None
    docs, held = int(meta.get("of_documents", 0)), meta.get("held_documents")
    if held is None:  # an index built before the count was recorded, or validate's bound of one document
        why = f"whole documents ({docs:,}) cannot make one evaluation batch and one global batch"
    elif meta.get("short") == "train":
        why = f"holding out {held:,} of the {docs:,} documents would leave fewer than one global batch to train on"
    else:
        why = f"the {held:,} of {docs:,} documents it holds out give fewer than one evaluation batch"
    return (
        f"eval.fraction = {spec.eval.fraction:g}: {why}, so {meta['documents']:,} windows of "
        f"{spec.data.seq_len + 1} tokens are held out instead; eval text comes from the same documents as the "
        "training text"
    )


def stats_line(role: str, meta: dict[str, Any]) -> str:
    """One line of an index's statistics for the log, `data prepare` and `validate`: samples,
    documents, tokens, what data.overlong did, padding, the trained fraction, document lengths."""
    what = f"pieces of {meta['seq_len'] + 1} tokens" if meta.get("holdout") == "windows" else "documents"
    parts = [
        f"{role} samples: {meta['samples']:,} of seq_len {meta['seq_len']} ({meta['packing']} packing)",
        f"{meta['documents']:,} {what}",
    ]
    if "desirable" in meta:  # unpaired examples (data/unpaired.py)
        parts.append(f"{meta['desirable']:,} desirable and {meta['undesirable']:,} undesirable examples")
    if "tokens" in meta:
        parts.append(f"{meta['tokens']:,} tokens")
    fit = meta.get("overlong")
    if fit and fit["overlong"]:
        done = ", ".join(f"{fit[k]:,} {k}" for k in ("split", "truncated", "dropped") if fit[k])
        parts.append(f"{fit['overlong']:,} longer than seq_len (data.overlong = {meta['policy']!r}: {done})")
    if meta["padding"]:
        parts.append(f"{100 * meta['padding']:.1f}% padding")
    if "trained" in meta:
        parts.append(f"{100 * meta['trained']:.1f}% of label positions trained on")
    if lengths := meta.get("lengths"):
        shown = "/".join(str(lengths[k]) for k in ("min", "median", "p95", "max"))
        parts.append(f"document tokens {shown} (min/median/p95/max)")
    return ", ".join(parts)


def least_windows_problem(spec: specmod.JobSpec, tokens: int, exact: bool) -> str | None:
    """An error line when `tokens` (an upper bound of the training data's tokens; `exact` when
    it is the count) cannot give one global batch plus, with eval.fraction, one evaluation batch
    of concat windows, however it is split. Cheap: validate and submit ask it before queueing."""
    if spec.packing != "concat":
        return None  # documents packing pads: its sample count has no bound from the tokens
    holdout = bool(spec.eval.fraction) and not spec.eval.paths
    need = per_batch(spec, "train") + (per_batch(spec, "eval") if holdout else 0)
    windows = max(0, (tokens - 1) // spec.data.seq_len)
    if windows >= need:
        return None
    wanted = "one global batch" + (" plus one evaluation batch (eval.fraction)" if holdout else "")
    return (
        f"data.paths: the training data holds {'' if exact else 'at most '}{tokens:,} tokens: {windows} windows of "
        f"seq_len {spec.data.seq_len}, fewer than {wanted} = {need} samples"
    )


def eval_batches_note(spec: specmod.JobSpec, samples: int) -> str | None:
    """What the log and `validate` say when the eval set is too small for eval.batches: each
    evaluation runs fewer batches (the ones every rank can fill)."""
    runs = samples // per_batch(spec, "eval")
    if not runs or runs >= spec.eval.batches:
        return None
    return (
        f"eval.batches = {spec.eval.batches}: the eval set gives {samples:,} samples, {runs} evaluation batch(es) of "
        f"{spec.world_size} ranks x {spec.train.micro_batch_size}: each evaluation runs {runs}"
    )


def total_steps(spec: specmod.JobSpec, samples: int, step: int = 0, consumed: int = 0) -> int:
    """The steps the run trains: train.steps, or with train.epochs the step at which
    epochs x `samples` (the training set's size) have been consumed, rounded up to a whole
    step. From a checkpoint at `step` having consumed `consumed` samples (the data position),
    the rest is divided by today's global batch: the same count when the global batch is
    unchanged; when it changed, the run still ends after the same number of passes."""
    if spec.train.epochs <= 0:
        return spec.train.steps
    left = max(0, round(spec.train.epochs * samples) - consumed)
    return max(step + -(-left // spec.global_batch), 1)


def epochs_note(spec: specmod.JobSpec, samples: int, steps: int) -> str | None:
    """What the log and `validate` say about the steps and the passes over the data: always with
    train.epochs; with train.steps only when the run trains more than one pass."""
    passes = steps * spec.global_batch / max(samples, 1)
    if spec.train.epochs <= 0 and passes <= 1:
        return None
    batch = (
        f"global batch {spec.global_batch} = {spec.world_size} ranks x {spec.train.micro_batch_size} x "
        f"{spec.train.grad_accum} accumulation"
    )
    if spec.train.epochs > 0:
        return (
            f"train.epochs = {spec.train.epochs:g}: {steps} steps ({samples:,} training samples, {batch}; "
            f"{passes:.2f} passes)"
        )
    return f"{steps} steps = {passes:.1f} passes over the data ({samples:,} training samples, {batch})"


def epoch(consumed: int, samples: int) -> float:
    """The fractional epoch at a data position: samples consumed / samples per epoch."""
    return consumed / max(samples, 1)
