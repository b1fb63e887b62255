"""What a prepare in progress leaves in the cache, and how far it got: the files several prepare
processes (the tasks of a Slurm job array, a local `data prepare`, a job's rank 0) share in a
dataset's partial folder, and the progress `data status`, `data prepare --follow` and `status`
read from them. Pure Python (the control plane imports it).

    <cache>/.<key>.partial/plan.json           the cut (format version, unit bytes): the same for all
    <cache>/.<key>.partial/units.json          how many units the plan has (once one process counted them)
    <cache>/.<key>.partial/started.json        when the first process started (the manifest's `seconds`)
    <cache>/.<key>.partial/claims/NNNNN.lock   a unit being tokenized (core/lock.py, with a heartbeat)
    <cache>/.<key>.partial/failed.json         bad input: the error line; every task of the array stops
    <cache>/.<key>.partial/shards/NNNNN.json   a complete unit (shards.py): never tokenized again
    <cache>/<key>.array.json                   the Slurm job array last queued to prepare it
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import trust
from .cache import DatasetRef


class PreparePhase(enum.StrEnum):
    PREPARED = "prepared"
    PREPARING = "preparing"  # a partial folder exists (maybe interrupted: a rerun continues it)
    FAILED = "failed"  # bad input: the partial folder holds the error
    MISSING = "not prepared"


def units_file(ref: DatasetRef) -> Path:
    return ref.partial / "units.json"


def started_file(ref: DatasetRef) -> Path:
    return ref.partial / "started.json"


def failed_file(ref: DatasetRef) -> Path:
    return ref.partial / "failed.json"


def claims_dir(ref: DatasetRef) -> Path:
    return ref.partial / "claims"


def array_file(ref: DatasetRef) -> Path:
    return ref.root / f"{ref.key}.array.json"


def read_json(path: Path) -> dict[str, Any] | None:
    """A small JSON file of the cache, None when absent or unreadable; DataError when it is not one
    to trust (trust.py)."""
    trust.require(path)
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def record_array(ref: DatasetRef, job_id: str, tasks: int, run: str = "") -> None:
    """Remember the job array queued to prepare `ref` (for `data status`)."""
    trust.mkdirs(ref.root)
    trust.write(array_file(ref), json.dumps({"job_id": job_id, "tasks": tasks, "submitted": time.time(), "run": run}))


@dataclass(frozen=True)
class PrepareProgress:
    """How far the preparation of one dataset got."""

    role: str
    phase: PreparePhase
    done_bytes: int = 0  # source bytes whose unit is complete
    total_bytes: int = 0
    shards: int = 0  # complete units
    units: int | None = None  # units of the plan (None until a process counted them)
    tokens: int = 0
    error: str = ""
    array: dict[str, Any] | None = None  # array_file's record

    def line(self) -> str:
        """'train: preparing, 12 of 40 units (30%, 120 of 400 MB) tokenized; array job 17 (4 tasks)'."""
        job = f"; array job {self.array['job_id']} ({self.array['tasks']} tasks)" if self.array else ""
        if self.phase is PreparePhase.PREPARED:
            return f"{self.role}: prepared, {self.tokens:,} tokens in {self.shards} shards"
        if self.phase is PreparePhase.FAILED:
            return f"{self.role}: failed: {self.error}{job}"
        if self.phase is PreparePhase.MISSING:
            return f"{self.role}: not prepared{job}"
        share = 100 * self.done_bytes / max(1, self.total_bytes)
        of = f" of {self.units}" if self.units is not None else ""
        mb = f"{self.done_bytes / 1e6:,.1f} of {self.total_bytes / 1e6:,.1f} MB"
        return f"{self.role}: preparing, {self.shards}{of} units ({share:.0f}%, {mb}) tokenized{job}"


def progress(ref: DatasetRef, total: int | None = None) -> PrepareProgress:
    """Read from the cache alone (a few small files per unit): no Slurm query, no tokenizer.
    `total`: the sources' bytes, when `ref` was rebuilt from a record without its sources."""
    array = read_json(array_file(ref)) if ref.key else None
    manifest = ref.manifest()
    if manifest is not None:
        return PrepareProgress(
            ref.role, PreparePhase.PREPARED, shards=len(manifest["shards"]), tokens=int(manifest["tokens"])
        )
    total = sum(s.size() for s in ref.sources) if total is None else total
    if ref.key is None or not ref.partial.is_dir():
        return PrepareProgress(ref.role, PreparePhase.MISSING, total_bytes=total, array=array)
    trust.require(ref.partial)
    failed = read_json(failed_file(ref))
    if failed is not None:
        error = str(failed.get("error", ""))
        return PrepareProgress(ref.role, PreparePhase.FAILED, total_bytes=total, error=error, array=array)
    stats = [json.loads(p.read_text()) for p in (ref.partial / "shards").glob("[0-9]*.json")]
    counted = read_json(units_file(ref))
    return PrepareProgress(
        ref.role,
        PreparePhase.PREPARING,
        done_bytes=sum(int(s["weight"]) for s in stats),
        total_bytes=total,
        shards=len(stats),
        units=int(counted["units"]) if counted else None,
        tokens=sum(int(s["tokens"]) for s in stats),
        array=array,
    )
