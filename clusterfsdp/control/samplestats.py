"""The statistics of the sample sets a run reads, as the job found them: each prepared index's
meta.json (samples, documents, tokens, what data.overlong did, padding, the trained-token
fraction, document lengths; data/index.py), copied by rank 0 into `<run>/data.json` once its
data is open, so `status` shows them without hashing the sources again, and after the cache
entry is gone. Torch-free: the worker and `status` share this one definition.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import fileio
from .fileio import atomic_write

_LEFT_OUT = ("files",)  # the index tables' seals: the cache's business, not the run's


def write(file: Path, metas: dict[str, dict[str, Any]]) -> None:
    """`metas`: role ('train', 'eval') -> the index meta of that sample set."""
    kept = {role: {k: v for k, v in meta.items() if k not in _LEFT_OUT} for role, meta in metas.items()}
    atomic_write(file, json.dumps(kept, sort_keys=True) + "\n")


def read(file: Path) -> dict[str, dict[str, Any]]:
    """The sample sets' metas; {} when the run has none yet (or the file is not one)."""
    try:
        found = fileio.load_json(file)
    except (OSError, ValueError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {role: meta for role, meta in found.items() if isinstance(meta, dict) and "samples" in meta}


def lines(file: Path) -> list[str]:
    """One line per sample set, as the job's log and `validate` write it."""
    metas = read(file)
    if not metas:
        return []
    # Only here, for a run that has them: `status` starts without the spec that samplesets imports.
    from ..data.samplesets import stats_line

    out = []
    for role, meta in metas.items():
        try:
            out.append(stats_line(role, meta))
        except (KeyError, TypeError, ValueError):
            out.append(f"{role}: data.json holds statistics this version cannot read")
    return out
