"""The sample sets a job reads (training samples, evaluation samples) and what they must hold:
which prepared dataset each comes from, the name of its sample index, and whether it is big
enough for one step. Pure Python: `validate` answers from an index's meta.json, the job from
the index it builds (index.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from ..control import spec as specmod
from . import trust
from .cache import FORMAT_VERSION, DatasetRef, text_hash


def index_id(spec: specmod.JobSpec, role: str) -> str:
    """Names the sample index of one (seq_len, packing, split) of a prepared dataset."""
    holdout = spec.eval.fraction if not spec.eval.paths else 0.0
    payload = {
        "v": FORMAT_VERSION,
        "seq_len": spec.data.seq_len,
        "packing": spec.packing,
        "role": role,
        "holdout": holdout,
        "seed": spec.job.seed if holdout else 0,
    }
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


def batch_problem(spec: specmod.JobSpec, role: str, samples: int) -> str | None:
    """An error line when a sample set is smaller than what one step (or one evaluation) reads."""
    per_step = spec.global_batch if role == "train" else spec.world_size * spec.train.micro_batch_size
    if samples >= per_step:
        return None
    what = (
        f"one global batch ({spec.world_size} ranks x {spec.train.micro_batch_size} x {spec.train.grad_accum} "
        "accumulation)"
        if role == "train"
        else f"one evaluation batch ({spec.world_size} ranks x {spec.train.micro_batch_size})"
    )
    key = "data.paths" if role == "train" else ("eval.paths" if spec.eval.paths else "eval.fraction")
    return (
        f"{key}: the {role} data gives {samples} samples of seq_len {spec.data.seq_len} ({spec.packing} packing), "
        f"fewer than {what} = {per_step}"
    )
