"""The `--json` output of `runs`, `status`, `submit` and `resume`: the run service's typed records
(`RunStatus`, `Attempt`, `Event`, `TrackerIds`, `Submission`) as JSON, through one function, so
every command and every script sees the same keys (docs/json.md lists them).

Versioned: every document carries `"schema": SCHEMA`. Keys are only ever added within a version;
removing or changing the meaning of a key raises it. Optional record keys that are unset are left
out, as in the run folder's own files (records.py)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.benchresults import rows as bench_rows
from ..core.records import Attempt, Event, TrackerIds
from ..core.runfolder import RunFolder
from .status import RunStatus
from .strictjson import dumps

if TYPE_CHECKING:
    from .run import Submission

SCHEMA = 1


def to_json(value: Any) -> Any:
    """JSON data for a record, a list of records or a plain value. A `Run` and a `Submission` are
    told by their shape (a run folder; a dataclass with the run first), so that this module does
    not import the run service: `status --json` and `runs --json` read run folders only."""
    if isinstance(value, RunStatus):
        return _status(value)
    if isinstance(value, (Attempt, Event, TrackerIds)):
        return value.to_dict()
    if isinstance(value, RunFolder):
        return {"run_id": value.id, "name": value.name, "folder": str(value.path)}
    if isinstance(getattr(value, "folder", None), RunFolder):  # a Run: its folder's keys
        return to_json(value.folder)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a Submission: run's keys, what was queued
        fields = {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name != "run"}
        return {**to_json(getattr(value, "run", {})), **fields}
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value


def _status(st: RunStatus) -> dict[str, Any]:
    return {
        **to_json(st.run),
        "state": st.state.value,
        "live": st.state.live,
        "bad": st.state.bad,
        "reason": st.reason,
        "job_id": st.job_id,
        "executor": str(st.executor),
        "created": st.created,
        "step": st.step,
        "steps": st.steps,
        "loss": st.loss,
        "epoch": st.epoch,
        "eval_step": st.eval_step,
        "eval_loss": st.eval_loss,
        "eval_ppl": st.eval_ppl,
        "reward_accuracy": st.reward_accuracy,
        "eval_reward_accuracy": st.eval_reward_accuracy,
        "reward_margin": st.reward_margin,
        "kl": st.kl,
        "checkpoints": st.checkpoints,
        "attempts": to_json(st.attempts),
        "events": to_json(st.events),
        "notes": st.notes,
        "trackers": to_json(st.trackers),
        "cost": st.cost.to_json() if st.cost is not None else None,
        "cost_error": st.cost_error,
        "benchmarks": bench_rows(st.run),
    }


def document(value: RunStatus | Submission | dict[str, Any]) -> str:
    """One JSON document: the schema version first, then the record's keys."""
    return dumps({"schema": SCHEMA, **to_json(value)})


def listing(rows: Iterable[RunStatus], slurm_error: str, by_user: dict[str, Any] | None = None) -> Iterator[str]:
    """`runs --json`, the same document as `document({"runs": rows, "slurm_error": ...,
    "cost_by_user": ...})`, in pieces of one run each: 10,000 runs are never one structure in memory."""
    yield f'{{\n  "schema": {SCHEMA},\n  "runs": ['
    for i, row in enumerate(rows):
        yield ("," if i else "") + "\n" + _indented(dumps(to_json(row)), "    ")
    users = _indented(dumps(by_user or {}, sort_keys=True), "  ").lstrip()
    yield f'\n  ],\n  "slurm_error": {json.dumps(slurm_error)},\n  "cost_by_user": {users}\n}}\n'


def _indented(document: str, prefix: str) -> str:
    """`document` (indented JSON: no blank line) nested one level deeper. (textwrap.indent, less the
    0.7 ms its import adds to every `status` and `runs`.)"""
    return "\n".join(prefix + line for line in document.split("\n"))
