"""The statistics of the sample sets a run reads, as the job found them: each prepared index's
meta.json (samples, documents, tokens, what data.overlong did, padding, the trained-token
fraction, document lengths; data/index.py), copied by rank 0 into `<run>/data.json` once its
data is open, so `status` shows them without hashing the sources again, and after the cache
entry is gone. A mixture (`[[data.sources]]`) has no index of its own: each source's index
meta is kept under `sources`, with its label and weight. `steps` is the number of steps the
run trains as rank 0 counted it (train.epochs: from the training set's size), so the TUI and
`status` know it before the first metrics row. Torch-free: the worker and `status` share this
one definition.

    {"train": META, "eval": META, "sources": {"train": [{"label", "weight", "meta": META}]}, "steps": N}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core import fileio
from ..core.fileio import atomic_write

_LEFT_OUT = ("files",)  # the index tables' seals: the cache's business, not the run's


def _kept(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if k not in _LEFT_OUT}


def write(
    file: Path,
    metas: dict[str, dict[str, Any]],
    sources: dict[str, list[dict[str, Any]]] | None = None,
    steps: int | None = None,
) -> None:
    """`metas`: role ('train', 'eval') -> the index meta of that sample set; `sources`: role ->
    a mixture's sources, each {label, weight, meta}; `steps`: the steps the run trains."""
    found: dict[str, Any] = {role: _kept(meta) for role, meta in metas.items()}
    if sources:
        found["sources"] = {role: [{**s, "meta": _kept(s["meta"])} for s in parts] for role, parts in sources.items()}
    if steps is not None:
        found["steps"] = steps
    atomic_write(file, json.dumps(found, sort_keys=True) + "\n")


def _document(file: Path) -> dict[str, Any]:
    try:
        found = fileio.load_json(file)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def read(file: Path) -> dict[str, dict[str, Any]]:
    """The sample sets' metas; {} when the run has none yet (or the file is not one)."""
    found = _document(file)
    return {role: meta for role, meta in found.items() if isinstance(meta, dict) and "samples" in meta}


def sources(file: Path) -> dict[str, list[dict[str, Any]]]:
    """A mixture's sources per role, each {label, weight, meta}; {} for one dataset."""
    found = _document(file).get("sources")
    if not isinstance(found, dict):
        return {}
    return {
        role: [s for s in parts if isinstance(s, dict) and isinstance(s.get("meta"), dict)]
        for role, parts in found.items()
        if isinstance(parts, list)
    }


def steps(file: Path) -> int | None:
    """The steps the run trains, as rank 0 counted them (None: not recorded yet)."""
    value = _document(file).get("steps")
    return value if type(value) is int and value > 0 else None


def lines(file: Path) -> list[str]:
    """One line per sample set, as the job's log and `validate` write it; for a mixture one per
    source and set, then each training source's share."""
    metas, mixed = read(file), sources(file)
    if not metas and not mixed:
        return []
    # Only here, for a run that has them: `status` starts without the spec that samplesets imports.
    from .mixture import Part, share_lines
    from .samplesets import stats_line

    out = []
    try:
        out += [stats_line(role, meta) for role, meta in metas.items()]
        for role, parts in mixed.items():
            out += [f"{stats_line(role, s['meta'])} ({s['label']})" for s in parts]
        shares = [Part(s["label"], float(s["weight"]), int(s["meta"]["samples"]), float(s["meta"].get("trained", 1.0)))
                  for s in mixed.get("train", [])]  # fmt: skip
        out += [f"train: {line}" for line in share_lines(shares)] if shares else []
    except (KeyError, TypeError, ValueError):
        out.append("data.json holds statistics this version cannot read")
    return out
