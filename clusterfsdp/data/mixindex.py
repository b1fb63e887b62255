"""The sample indexes of a mixture's sources, built by the process that prepares the data (the
numpy half: mixture.py is what validate imports)."""

from __future__ import annotations

from ..core import spec as specmod
from . import index
from .cache import DatasetRef
from .mixture import epoch_samples, labels_problem, part, part_problem, share_lines
from .sources import DataError


def ensure_indexes(refs: list[DatasetRef], spec: specmod.JobSpec, log, role: str = "train") -> int:
    """Every source's index of `role` (built if missing): the training samples, their shares said
    in the log, or the held-out eval samples (eval.fraction); returns their number (training:
    one epoch of the mixture). DataError when a source gives none."""
    metas = [(r, index.ensure(r, spec, role, log)) for r in refs if r.part >= 0]
    for r, meta in metas:
        if problem := part_problem(spec, role, r.part, meta):
            raise DataError(problem)
    if role == "train" and (problem := labels_problem([meta for _, meta in metas])):
        raise DataError(problem)
    parts = [part(spec, r, meta) for r, meta in metas]
    if role == "train":
        for line in share_lines(parts):
            log(f"data: {line}")
    return epoch_samples(parts)
