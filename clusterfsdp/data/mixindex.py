"""The sample indexes of a mixture's sources, built by the process that prepares the data (the
numpy half: mixture.py is what validate imports)."""

from __future__ import annotations

from ..control import spec as specmod
from . import index
from .cache import DatasetRef
from .mixture import epoch_samples, part, share_lines


def ensure_indexes(refs: list[DatasetRef], spec: specmod.JobSpec, log) -> int:
    """Every source's training index (built if missing), its share said in the log; returns the
    samples of one epoch of the mixture."""
    parts = [part(spec, r, index.ensure(r, spec, "train", log)) for r in refs if r.part >= 0]
    for line in share_lines(parts):
        log(f"data: {line}")
    return epoch_samples(parts)
