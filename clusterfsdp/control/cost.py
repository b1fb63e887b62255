"""What a run has cost, from Slurm's own accounting: GPU-hours and CPU-hours of every incarnation
of every attempt (`sacct -D -X`: a requeued job's earlier incarnations too), as Slurm charged them
(AllocTRES: `gres/gpu=N`, `cpu=N`, times ElapsedRaw), and the part lost to failures and
preemptions: the steps an incarnation trained past its last checkpoint, which the next one redid.

`slurm.max_gpu_hours` bounds a run: validate and submit refuse a job whose attempt plan (nodes x
GPUs per node x the time limit) passes it (`spec.crossfield.budget_refusal`), and `resume` one whose
plan passes what is left after the GPU-hours already used (`run_cost`)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable
from dataclasses import field
from pathlib import Path

from ..core import fileio, ownership, runfolder, slurmcli
from ..core.budget import BUDGET_FILE, Budget
from ..core.records import Event, EventKind, Executor, RecordError
from ..core.runfolder import RunFolder
from ..core.sweeplayout import sweep_of
from ..core.value import value

HOUR = 3600.0


@value(frozen=True)
class Usage:
    """Resource-seconds of one or more incarnations."""

    gpu_s: float = 0.0
    cpu_s: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.gpu_s + other.gpu_s, self.cpu_s + other.cpu_s)

    @property
    def gpu_hours(self) -> float:
        return self.gpu_s / HOUR

    @property
    def cpu_hours(self) -> float:
        return self.cpu_s / HOUR

    def short(self) -> str:
        """'1.25 GPU-h', or '0.40 CPU-h' when no GPU was allocated ('0' when nothing was used)."""
        if self.gpu_s > 0:
            return f"{self.gpu_hours:.2f} GPU-h"
        return f"{self.cpu_hours:.2f} CPU-h" if self.cpu_s > 0 else "0"


def parse_tres(text: str) -> dict[str, float]:
    """'billing=4,cpu=4,gres/gpu=2,mem=8000M,node=2' -> {'cpu': 4.0, 'gres/gpu': 2.0, ...} (counts
    only: a value with a unit, like mem's, is left out)."""
    out: dict[str, float] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            continue
    return out


# sacct's last state of a job after which it never runs again under its id: its figures are
# final, and `costs` keeps them in the run folder (a PREEMPTED or NODE_FAIL incarnation may be
# requeued: it is not among them).
SETTLED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})


@value(frozen=True)
class Accounted:
    """One job as sacct accounts it: each incarnation's usage, in order, the state of the last,
    and what it asked for (GPUs in all, the time limit: what its incarnation may still use)."""

    rows: tuple[Usage, ...]
    state: str = ""
    gpus: float = 0.0  # its GPUs, every node's together: ReqTRES's gres/gpu, else its last AllocTRES's
    limit_s: float = 0.0  # TimelimitRaw; 0: none known

    @property
    def settled(self) -> bool:
        """It never runs again under its id: its figures are final."""
        return self.state in SETTLED


def accounting(job_ids: Iterable[str]) -> dict[str, Accounted]:
    """{job id: its incarnations} from ONE sacct call for all of them (SlurmError when sacct is
    missing or does not answer)."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    fields = "JobID,AllocTRES,ElapsedRaw,State,ReqTRES,TimelimitRaw"
    out = slurmcli.run(["sacct", "-n", "-P", "-X", "-D", "-o", fields, "-j", ",".join(ids)])
    usage: dict[str, list[Usage]] = {}
    last: dict[str, tuple[str, float, float]] = {}
    for line in out.splitlines():
        job_id, tres, elapsed, state, asked, limit = [*line.split("|"), "", "", "", "", "", ""][:6]
        counts = parse_tres(tres)
        try:
            seconds = float(elapsed)
        except ValueError:
            continue
        usage.setdefault(job_id, []).append(
            Usage(counts.get("gres/gpu", 0.0) * seconds, counts.get("cpu", 0.0) * seconds)
        )
        minutes = float(limit) if limit.isdigit() else 0.0  # (UNLIMITED, Partition_Limit: none known)
        # (Slurm 22.05's ReqTRES leaves the GPUs out, measured on the devcluster; AllocTRES has them once it ran)
        gpus = parse_tres(asked).get("gres/gpu", 0.0) or counts.get("gres/gpu", 0.0)
        last[job_id] = ((state.split() or [""])[0], gpus, minutes * 60)  # 'CANCELLED by 0' -> CANCELLED
    return {j: Accounted(tuple(rows), *last[j]) for j, rows in usage.items()}


def incarnations(job_ids: Iterable[str]) -> dict[str, list[Usage]]:
    """{job id: the usage of each incarnation, in order} from one sacct call."""
    return {j: list(a.rows) for j, a in accounting(job_ids).items()}


@value(frozen=True)
class RunCost:
    """A run's cost: in all, per attempt (job id), and what restarts redid."""

    total: Usage = Usage()
    attempts: dict[str, Usage] = field(default_factory=dict)
    lost: Usage = Usage()
    steps_redone: int = 0

    def line(self) -> str:
        """'1.25 GPU-h, 5.0 CPU-h (0.20 GPU-h lost to restarts: 30 steps redone)'."""
        text = f"{self.total.gpu_hours:.2f} GPU-h, {self.total.cpu_hours:.2f} CPU-h"
        if self.steps_redone:
            text += f" ({self.lost.gpu_hours:.2f} GPU-h lost to restarts: {self.steps_redone} steps redone)"
        return text

    def to_json(self) -> dict:
        return {
            "gpu_hours": round(self.total.gpu_hours, 6),
            "cpu_hours": round(self.total.cpu_hours, 6),
            "lost_gpu_hours": round(self.lost.gpu_hours, 6),
            "steps_redone": self.steps_redone,
            "attempts": {j: {"gpu_hours": round(u.gpu_hours, 6), "cpu_hours": round(u.cpu_hours, 6)}
                         for j, u in self.attempts.items()},
        }  # fmt: skip


def redone(events: list[Event]) -> list[tuple[str, int, int]]:
    """(job id, restart, steps redone) of each incarnation whose last steps the next one trained
    again: the furthest step its events name (a failure's step, a save) minus the step the next
    incarnation resumed from."""
    furthest: dict[tuple[str, int], int] = {}
    order: list[tuple[str, int]] = []
    out = []
    for e in events:
        key = (e.job_id, e.restart)
        if e.event is EventKind.START and key not in order:
            order.append(key)
        if e.event is EventKind.RESUMED and e.step is not None and len(order) >= 2 and order[-1] == key:
            before = order[-2]
            count = furthest.get(before, 0) - e.step
            if count > 0:
                out.append((before[0], before[1], count))
        if e.step is not None:
            furthest[key] = max(furthest.get(key, 0), e.step)
    return out


def run_cost(run: RunFolder) -> RunCost | None:
    """The run's cost from sacct (its settled attempts from the run folder's cache); None for a
    run with no Slurm attempt. SlurmError when sacct does not answer (accounting disabled)."""
    ids = [a.job_id for a in run.record().attempts if a.executor is Executor.SLURM]
    if not ids:
        return None
    found, error = costs([Listed(run, tuple(ids), run.events())])
    if error:
        raise slurmcli.SlurmError(error)
    return found[run.path]


def cost_of(ids: Iterable[str], usage: dict[str, tuple[Usage, ...]], events: list[Event]) -> RunCost:
    """A run's cost from its attempts' incarnations (`usage`, by job id) and its events (which
    say the steps each restart redid)."""
    ids = list(ids)
    attempts = {j: sum(usage.get(j, ()), Usage()) for j in ids}
    total = sum(attempts.values(), Usage())
    lost, steps = Usage(), 0
    for job_id, restart, count in redone(events):
        runs = usage.get(job_id, ())
        if restart < len(runs):
            done = max(1, _steps_of(events, job_id, restart))
            part = runs[restart]
            share = min(1.0, count / done)
            lost = lost + Usage(part.gpu_s * share, part.cpu_s * share)
        steps += count
    return RunCost(total, attempts, lost, steps)


def _steps_of(events: list[Event], job_id: str, restart: int) -> int:
    """Steps an incarnation trained: the furthest step its events name minus where it started."""
    mine = [e for e in events if e.job_id == job_id and e.restart == restart and e.step is not None]
    start = next((e.step for e in mine if e.event is EventKind.RESUMED), 0) or 0
    return max((e.step or 0 for e in mine), default=0) - start


def dumps(cost: RunCost) -> str:
    return json.dumps(cost.to_json(), sort_keys=True)


# ---------------------------------------------------------------- many runs: one sacct, settled attempts cached
CACHE_FILE = "cost.json"
MAX_CACHE_BYTES = 1 << 20  # a run's attempts' figures are a few hundred bytes


@value(frozen=True)
class Listed:
    """What `costs` needs of one run: its Slurm attempts' job ids, its events (the steps redone),
    and what its status says of its newest job: live (its cached figures, if any, may grow: asked
    again) and, for a job PENDING whose workers never started, `waiting` (it has used nothing
    yet: not asked)."""

    run: RunFolder
    job_ids: tuple[str, ...]
    events: list[Event]
    live: str = ""
    waiting: str = ""


Ask = Callable[[Iterable[str]], dict[str, Accounted]]  # `accounting`, or the TUI's test cluster's


def costs(runs: list[Listed], ask: Ask | None = None) -> tuple[dict[Path, RunCost], str]:
    """{run folder: its cost} for every run with a Slurm attempt, and sacct's error ('' if none).
    ONE sacct call for the attempts of all runs together, and none for an attempt that settled
    (its figures are kept in the run folder's cost.json when the folder is yours: `runs` over
    thousands of finished runs asks nothing), nor for a job still waiting that never ran. A run
    whose figures sacct could not give is left out: its cost is unknown (`?`)."""
    cached = {item.run.path: _read_cache(item.run) for item in runs if item.job_ids}
    asked: set[str] = set()
    for item in runs:
        have = cached.get(item.run.path, {})
        asked.update(j for j in item.job_ids if (j not in have or j == item.live) and j != item.waiting)
    error = ""
    found: dict[str, Accounted] = {}
    try:
        found = (ask or accounting)(asked) if asked else {}
    except slurmcli.SlurmError as e:
        error = str(e)
    out: dict[Path, RunCost] = {}
    for item in runs:
        if not item.job_ids:
            continue
        have = cached[item.run.path]
        usage: dict[str, tuple[Usage, ...]] = {}
        for j in item.job_ids:
            if j == item.waiting:
                usage[j] = ()
            elif j in asked:
                usage[j] = found[j].rows if j in found else ()
            else:
                usage[j] = have[j]
        if error and any(j in asked for j in item.job_ids):
            continue
        settled = {j: found[j].rows for j in item.job_ids if j in found and found[j].settled and j != item.live}
        if settled:
            _write_cache(item.run, {**have, **settled})
        out[item.run.path] = cost_of(item.job_ids, usage, item.events)
    return out, error


def _read_cache(run: RunFolder) -> dict[str, tuple[Usage, ...]]:
    """The run folder's cost.json, {job id: incarnations' (GPU-s, CPU-s)}, if only you (or the
    trusted group) could have written it (`ownership`: a planted figure is never shown) and it is
    a bounded regular file of the right shape; otherwise nothing (sacct is asked)."""
    path = run.path / CACHE_FILE
    try:
        if ownership.path_clause(path) is not None:
            return {}
        data = fileio.load_json(path, MAX_CACHE_BYTES)
        jobs = data["jobs"]
        return {str(j): tuple(Usage(float(g), float(c)) for g, c in rows) for j, rows in jobs.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _write_cache(run: RunFolder, jobs: dict[str, tuple[Usage, ...]]) -> None:
    """cost.json replaced whole, only in a run folder that is yours and no one else can write
    (`runfolder.untrusted`): another user's run is asked of sacct each time instead. A folder
    that cannot be written (read-only, full) is left as it is: the cache only saves a call."""
    if runfolder.untrusted(run.path) is not None:
        return
    doc = {"schema": 1, "jobs": {j: [[u.gpu_s, u.cpu_s] for u in rows] for j, rows in sorted(jobs.items())}}
    with contextlib.suppress(OSError):
        fileio.atomic_write(run.path / CACHE_FILE, json.dumps(doc, sort_keys=True) + "\n")


def cell(found: RunCost | None, slurm: bool) -> str:
    """A run's cost in a table's cell: '1.25 GPU-h' (CPU-h for a run without GPUs), '-' for a
    run with no Slurm attempt, '?' when sacct could not tell."""
    if not slurm:
        return "-"
    return found.total.short() if found is not None else "?"


# ---------------------------------------------------------------- the budget clock of an incarnation
def write_budget(
    run: RunFolder, job_id: str, limit_h: float, now: float, plan_s: float = 0.0, gpus_hint: float = 0.0
) -> Budget:
    """The budget clock of the running incarnation of `job_id`: what the run used before it
    (sacct: every other incarnation) and the GPUs Slurm gave it (its AllocTRES). A point of a
    sweep shares the budget with the other points (`slurm.max_gpu_hours` bounds the sweep): what
    they used, and what they may still use, is taken off too (`_held`; `plan_s`, this attempt's
    nodes x GPUs x time limit, for a point whose array task has not started). `gpus_hint`: the GPUs
    when accounting does not list the running job yet (slurmdbd records a job after the controller
    starts it: a clean-clone CI run saw 0 GPUs, a clock that never ran down)."""
    mine = [a.job_id for a in run.record().attempts if a.executor is Executor.SLURM] + [job_id]
    sweep, others = _other_points(run)
    usage = accounting(mine + [j for ids in others for j in ids])
    rows = usage.get(job_id, Accounted(())).rows
    spent = sum((u for j in set(mine) for u in (rows[:-1] if j == job_id else usage.get(j, Accounted(())).rows)),
                Usage()).gpu_s  # fmt: skip
    for ids in others:
        spent += sum(u.gpu_s for j in ids for u in usage.get(j, Accounted(())).rows)
        spent += _held(usage.get(ids[-1]) if ids else None, plan_s)
    out = slurmcli.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "AllocTRES"]) if rows else ""
    text = out.strip()
    gpus = parse_tres(text.splitlines()[-1]).get("gres/gpu", 0.0) if text else gpus_hint
    budget = Budget(limit_h * HOUR - spent, gpus, now, limit_h, sweep)
    fileio.atomic_write(run.path / BUDGET_FILE, json.dumps(budget.__dict__))
    return budget


_RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"}


def _held(job: Accounted | None, plan_s: float) -> float:
    """GPU-seconds another point's newest job may still use in its incarnation: none once it
    settled; its GPUs x time limit less what it used when running; the whole when it waits (or
    was preempted, and may be requeued); `plan_s` when sacct does not tell its GPUs and limit (a
    job that waits: Slurm 22.05's ReqTRES has no GPUs) or does not list it yet (an array task
    not started): the points of one array share their Slurm options."""
    if job is None:
        return plan_s
    if job.settled:
        return 0.0
    whole = job.gpus * job.limit_s if job.gpus > 0 and job.limit_s > 0 else plan_s
    return max(0.0, whole - job.rows[-1].gpu_s) if job.state in _RUNNING and job.rows else whole


def _other_points(run: RunFolder) -> tuple[str, list[list[str]]]:
    """(the sweep's id, each other point's Slurm job ids) for a point of a sweep; ('', []) else."""
    sweep = sweep_of(run)
    if sweep is None:
        return "", []
    try:
        points = sweep.record().points
    except RecordError:
        return "", []
    others = [sweep.run_folder(p) for p in points if p.run_id != run.id]
    return sweep.id, [[a.job_id for a in r.record().attempts if a.executor is Executor.SLURM] for r in others]
