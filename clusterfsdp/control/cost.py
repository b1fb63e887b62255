"""What a run has cost, from Slurm's own accounting: GPU-hours and CPU-hours of every incarnation
of every attempt (`sacct -D -X`: a requeued job's earlier incarnations too), as Slurm charged them
(AllocTRES: `gres/gpu=N`, `cpu=N`, times ElapsedRaw), and the part lost to failures and
preemptions: the steps an incarnation trained past its last checkpoint, which the next one redid.

`slurm.max_gpu_hours` bounds a run: validate and submit refuse a job whose attempt plan (nodes x
GPUs per node x the time limit) passes it (`spec.checks.budget_refusal`), and `resume` one whose
plan passes what is left after the GPU-hours already used (`run_cost`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from . import fileio, slurmcli
from .records import Event, EventKind, Executor
from .runfolder import RunFolder

HOUR = 3600.0


@dataclass(frozen=True)
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


def incarnations(job_ids: Iterable[str]) -> dict[str, list[Usage]]:
    """{job id: the usage of each incarnation, in order} from one sacct call."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    out = slurmcli.run(["sacct", "-n", "-P", "-X", "-D", "-o", "JobID,AllocTRES,ElapsedRaw", "-j", ",".join(ids)])
    usage: dict[str, list[Usage]] = {}
    for line in out.splitlines():
        job_id, tres, elapsed = [*line.split("|"), "", "", ""][:3]
        counts = parse_tres(tres)
        try:
            seconds = float(elapsed)
        except ValueError:
            continue
        usage.setdefault(job_id, []).append(
            Usage(counts.get("gres/gpu", 0.0) * seconds, counts.get("cpu", 0.0) * seconds)
        )
    return usage


@dataclass(frozen=True)
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
    """The run's cost from sacct; None for a run with no Slurm attempt. SlurmError when sacct
    does not answer (accounting disabled)."""
    ids = [a.job_id for a in run.record().attempts if a.executor is Executor.SLURM]
    if not ids:
        return None
    usage = incarnations(ids)
    attempts = {j: sum(usage.get(j, []), Usage()) for j in ids}
    total = sum(attempts.values(), Usage())
    lost, steps = Usage(), 0
    events = run.events()
    for job_id, restart, count in redone(events):
        runs = usage.get(job_id, [])
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


# ---------------------------------------------------------------- the budget clock of an incarnation
BUDGET_FILE = "budget.json"


@dataclass(frozen=True)
class Budget:
    """What an incarnation may still use (`left_s` GPU-seconds) on its `gpus` GPUs, counted from
    `since`; written by the batch script's `before` step, read by the workers at start."""

    left_s: float
    gpus: float
    since: float
    limit_h: float

    def reached(self, now: float) -> bool:
        return self.gpus > 0 and (now - self.since) * self.gpus >= self.left_s

    def reason(self) -> str:
        return f"slurm.max_gpu_hours = {self.limit_h:g} used up ({self.gpus:g} GPU(s) of this attempt)"


def write_budget(run: RunFolder, job_id: str, limit_h: float, now: float) -> Budget:
    """The budget clock of the running incarnation of `job_id`: what the run used before it
    (sacct: every other incarnation) and the GPUs Slurm gave it (its AllocTRES)."""
    usage = incarnations([a.job_id for a in run.record().attempts if a.executor is Executor.SLURM] + [job_id])
    mine = usage.get(job_id, [])
    spent = sum((u for j, rows in usage.items() for u in (rows[:-1] if j == job_id else rows)), Usage())
    out = slurmcli.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "AllocTRES"]) if mine else ""
    gpus = parse_tres(out.strip().splitlines()[-1] if out.strip() else "").get("gres/gpu", 0.0)
    budget = Budget(limit_h * HOUR - spent.gpu_s, gpus, now, limit_h)
    fileio.atomic_write(run.path / BUDGET_FILE, json.dumps(budget.__dict__))
    return budget


def read_budget(run: RunFolder) -> Budget | None:
    try:
        data = json.loads((run.path / BUDGET_FILE).read_text())
        return Budget(float(data["left_s"]), float(data["gpus"]), float(data["since"]), float(data["limit_h"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
