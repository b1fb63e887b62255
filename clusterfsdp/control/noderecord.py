"""Nodes that stay bad: one shared record per cluster of the nodes a run found faulty, so that the
next submit of any user leaves them out instead of burning an allocation on them again.

A node is *marked* when an attempt names it as the cause of its failure: it failed the
pre-flight, a hang's evidence points at it, or Slurm took it down mid-run (jobstep's `after`,
from `outcomes.classify_failure`'s `failed_nodes`). Every later Slurm submit, resume and follow-up
adds `--exclude` for the nodes still quarantined (marked less than `slurm.quarantine_hours`
ago and not cleared), says so in one line, and never excludes so many that the job could not fit
on the partition's usable nodes (the newest marks win). `clusterfsdp nodes` lists the record and
`nodes clear NODE` ends a quarantine.

The record is JSON lines (`<run_root>/.nodes/<cluster>.jsonl`, or `$CLUSTERFSDP_NODE_RECORD`):
each mark or clear is one appended line, under the record's lock file, so two writers never
interleave and a torn last line (a writer killed mid-write) is skipped by the reader. The folder
and file carry `$CLUSTERFSDP_TRUSTED_GROUP` and are group-writable (2775 / 0664) so a team shares
one record; a record another user could have written is not used (`ownership`): one line says so.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path

from ..core import fileio, ownership, slurmcli
from ..core import spec as specmod
from ..core.lock import held
from ..core.runfolder import job_folder
from ..core.value import value

ENV_RECORD = "CLUSTERFSDP_NODE_RECORD"
BAD, CLEAR = "bad", "clear"


@value(frozen=True)
class Mark:
    """One line of the record: a node marked bad (with why, when, by which run and user) or cleared."""

    node: str
    action: str  # BAD or CLEAR
    time: float
    reason: str = ""
    cause: str = ""  # outcomes.Cause value: preflight, hang, node_failure
    run: str = ""
    user: str = ""

    @classmethod
    def parse(cls, row: Mapping[str, object]) -> Mark | None:
        node, action, when = row.get("node"), row.get("action"), row.get("time")
        if not isinstance(node, str) or not node or action not in (BAD, CLEAR):
            return None
        if not isinstance(when, int | float) or isinstance(when, bool) or not 0 <= when < 1e11:
            return None
        text = {k: str(row.get(k, ""))[:300] for k in ("reason", "cause", "run", "user")}
        return cls(node, str(action), float(when), **text)


def record_path(run_root: Path, cluster: str) -> Path:
    """Where the record of `cluster` lives: $CLUSTERFSDP_NODE_RECORD, or under the run root."""
    configured = os.environ.get(ENV_RECORD, "").strip()
    if configured:
        return Path(configured).expanduser()
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in cluster) or "cluster"
    return run_root.expanduser() / ".nodes" / f"{name}.jsonl"


def read(path: Path) -> tuple[list[Mark], str]:
    """(the marks, oldest first; a note when the record is not used). A record another user could
    have written (not yours nor the trusted group's, or writable by others) is not used."""
    found = ownership.path_clause(path) or ownership.path_clause(path.parent)
    if found:
        return [], f"nodes: {found[1]}: its quarantines are not used"
    return [m for row in fileio.read_jsonl(path) if (m := Mark.parse(row))], ""


def quarantined(marks: Iterable[Mark], now: float, hours: float) -> dict[str, Mark]:
    """The nodes whose last line is a mark less than `hours` old, with that mark."""
    last: dict[str, Mark] = {}
    for mark in marks:
        last[mark.node] = mark
    return {n: m for n, m in last.items() if m.action == BAD and hours > 0 and now - m.time < hours * 3600}


def _append(path: Path, marks: list[Mark]) -> None:
    """Append under the record's lock; the folder and file get the team's modes when new. A
    record (or a link in its place) another user could have written is refused, never appended
    through."""
    group = ownership.trusted_group()
    new_dir = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    if new_dir:
        _share(path.parent, group, 0o2775 if group is not None else 0o755)
    found = ownership.path_clause(path.parent) or ownership.path_clause(path)
    if found:
        raise ownership.Refused(f"{found[1]}: refusing to write the node record there")
    with held(path.with_suffix(".lock"), "node record", timeout_s=30):
        new = not path.exists()
        for mark in marks:
            fileio.append_jsonl(path, asdict(mark))
        if new:
            _share(path, group, 0o664 if group is not None else 0o644)


def _share(path: Path, group: int | None, mode: int) -> None:
    if group is not None:
        try:
            os.chown(path, -1, group)
        except PermissionError:
            mode &= ~0o020  # not a member: not writable by a group it does not carry
    os.chmod(path, mode)


def mark(path: Path, nodes: Iterable[str], *, reason: str, cause: str, run: str) -> list[Mark]:
    """Record `nodes` as bad (one line each); returns what was written."""
    now, user = time.time(), ownership.user_name(os.geteuid())
    marks = [Mark(n, BAD, now, reason[:300], cause, run, user) for n in sorted(set(nodes)) if n]
    if marks:
        _append(path, marks)
    return marks


def clear(path: Path, nodes: Iterable[str]) -> list[Mark]:
    """End the quarantine of `nodes` (one line each)."""
    now, user = time.time(), ownership.user_name(os.geteuid())
    marks = [Mark(n, CLEAR, now, user=user) for n in sorted(set(nodes)) if n]
    if marks:
        _append(path, marks)
    return marks


def exclusions(
    bad: Mapping[str, Mark], partition: Mapping[str, str], needed: int, already: Iterable[str] = ()
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(nodes to exclude, quarantined nodes left in because the job would not fit without them).
    `partition`: node -> Slurm state of the partition's nodes (a node not in it is excluded
    freely: it cannot be picked anyway); `needed`: the job's node count; `already`: nodes excluded
    for other reasons. The newest marks are kept first."""
    out = set(already)
    usable = {n for n, state in partition.items() if slurmcli.usable(state)} - out
    kept: list[str] = []
    for node in sorted(bad, key=lambda n: bad[n].time, reverse=True):
        if node in out:
            continue
        if node in usable and len(usable) - 1 < needed:
            kept.append(node)
            continue
        usable.discard(node)
        out.add(node)
    return tuple(sorted(out - set(already))), tuple(sorted(kept))


def describe(mark: Mark, now: float) -> str:
    """'node2 (failed pre-flight ..., run X by alice, 2 h ago)'."""
    age = max(0.0, now - mark.time)
    ago = f"{age / 3600:.1f} h" if age >= 3600 else f"{age / 60:.0f} min"
    who = f"run {mark.run} by {mark.user}" if mark.run else mark.user
    return f"{mark.node} ({mark.cause or 'marked'}: {mark.reason or 'no reason given'}; {who}, {ago} ago)"


def to_json(marks: list[Mark], bad: Mapping[str, Mark], path: Path) -> str:
    """`nodes --json`: the record's path, the quarantined nodes and every line."""
    doc = {
        "schema": 1,
        "record": str(path),
        "quarantined": [asdict(bad[n]) for n in sorted(bad)],
        "history": [asdict(m) for m in marks],
    }
    return json.dumps(doc, indent=2)


def for_job(spec: specmod.JobSpec, cluster: str) -> Path:
    """The record a job of `spec` on `cluster` reads and writes."""
    return record_path(job_folder(spec).parent, cluster)


def plan(spec: specmod.JobSpec, already: Iterable[str] = ()) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(nodes to add to `--exclude`, the one-line notes that say so) for a Slurm job of `spec`:
    the quarantined nodes of its cluster's record, as many as the partition can spare."""
    if spec.slurm.quarantine_hours <= 0:
        return (), ()
    try:
        path = for_job(spec, slurmcli.cluster_name())
        marks, note = read(path)
        now = time.time()
        bad = quarantined(marks, now, spec.slurm.quarantine_hours)
        if not bad:
            return (), (note,) if note else ()
        partition = slurmcli.partition_nodes(spec.slurm.partition)
    except slurmcli.SlurmError as e:  # (no quarantine beats no job: the submit goes on)
        return (), (f"nodes: the node record was not applied: {e}",)
    excluded, kept = exclusions(bad, partition, spec.node_range.low, already)  # (a range: the least it starts on)
    notes = [note] if note else []
    if excluded:
        said = "; ".join(describe(bad[n], now) for n in excluded)
        notes.append(
            f"nodes: excluding {','.join(excluded)}, quarantined in {path}: {said} "
            f"(`clusterfsdp nodes clear {' '.join(excluded)}` ends it)"
        )
    if kept:
        notes.append(
            f"nodes: {','.join(kept)} quarantined but not excluded: the job needs {spec.node_range.low} of the "
            "partition's usable nodes"
        )
    return excluded, tuple(notes)
