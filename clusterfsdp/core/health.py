"""Per-rank health: the heartbeat files the ranks write, and the rules that read them (a hang, a
straggler, the timeouts). Torch-free: the ranks (`worker.heartbeat`) write the files, each
node's watchdog (`worker.watchdog`) decides from them, and `status` and the TUI's run screen
show them (docs/recovery.md, "Hangs and stragglers").

    <run>/health/<job id>.<restart>/rank<R>.json    one Beat, rewritten whole (temp + rename)

A rank's training thread only updates a few numbers in memory at each step and phase change; a
side thread of the rank writes them every BEAT_S seconds with the time it wrote them (`beat`).
So two ages tell two things apart: `progress` (since the rank last finished a step or changed
phase) stops growing old only when training moves, while `beat` stays fresh as long as the
process runs at all: a rank blocked in a collective keeps beating, a frozen process (SIGSTOP, a
dead node, a hung file system read holding the interpreter) does not.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from . import fileio
from .value import value

BEAT_S = 2.0  # how often a rank's side thread rewrites its heartbeat file
STALE_BEAT_S = 3 * BEAT_S  # a heartbeat older than this: the process stopped answering (frozen, dead)
MARKS = 8  # steps whose arrival times a heartbeat carries (the straggler rule compares them)
MIN_COMMON = 4  # steps all ranks must share in their heartbeats before any rank is called a straggler
MARGIN_S = 60.0  # the collective timeout waits this much longer than the watchdog, so the watchdog acts first


class Phase(StrEnum):
    """What a rank is doing, in the order an attempt goes through them (a step, an eval and a
    save repeat). The slow phases have their own floor for the hang timeout (`WatchdogSettings`)."""

    START_UP = "start-up"
    DATA_PREP = "data prep"
    MODEL_LOAD = "model load"  # build, fill, and the checkpoint restore
    STEP = "step"
    EVAL = "eval"
    SAVE = "checkpoint save"
    DONE = "done"  # the rank left training (completed, stopped, failed): not watched any more


@value(frozen=True)
class WatchdogSettings:
    """The numbers of `train.watchdog` the rules need (the spec's section maps onto it; kept
    here so that the rules do not depend on the spec)."""

    enabled: bool = True
    hang_min_s: float = 60.0
    hang_factor: float = 10.0
    startup_s: float = 900.0
    data_prep_s: float = 3600.0
    model_load_s: float = 1800.0
    eval_s: float = 900.0
    save_s: float = 900.0
    straggler_factor: float = 1.5
    straggler_checks: int = 5

    @classmethod
    def of(cls, section: Any) -> WatchdogSettings:
        """From the spec's `train.watchdog` (any object with these attributes)."""
        return cls(**{f.name: getattr(section, f.name) for f in fields(cls)})

    def floor(self, phase: Phase) -> float:
        return {
            Phase.START_UP: self.startup_s,
            Phase.DATA_PREP: self.data_prep_s,
            Phase.MODEL_LOAD: self.model_load_s,
            Phase.EVAL: self.eval_s,
            Phase.SAVE: self.save_s,
        }.get(phase, self.hang_min_s)


def hang_timeout_s(settings: WatchdogSettings, phase: Phase, slowest_step_s: float) -> float:
    """Seconds without progress after which a rank in `phase` counts as hung: the phase's floor,
    and in training steps max(hang_min_s, hang_factor x the slowest recent step); before any step
    was measured (the first steps compile and warm up) the start-up floor."""
    if phase is Phase.STEP:
        if slowest_step_s <= 0:
            return settings.startup_s
        return max(settings.hang_min_s, settings.hang_factor * slowest_step_s)
    return settings.floor(phase)


def collective_timeout_s(settings: WatchdogSettings, phase: Phase, slowest_step_s: float) -> float:
    """The process group's timeout: the same rule plus MARGIN_S, so that the watchdog (which
    dumps the stacks and names the rank) gets there first and the timeout is the backstop."""
    return hang_timeout_s(settings, phase, slowest_step_s) + MARGIN_S


@value
class Beat:
    """One rank's heartbeat file. Times are wall-clock (time.time()): ranks on different nodes
    compare them, so their clocks must agree to a few seconds (NTP does better)."""

    rank: int
    host: str
    pid: int
    job_id: str
    restart: int
    phase: Phase
    step: int  # optimizer steps done (the TrainState's step)
    progress: float  # when the rank last finished a step or changed phase
    beat: float  # when this file was written
    step_s: float = 0.0  # median of the recent step times (wall clock, about the same on every rank)
    slowest_s: float = 0.0  # the slowest recent step
    # the last MARKS steps: [step, when its batches were read, when it was done]: the points just
    # before the step's first collective and just after its last one
    marks: list[list[float]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "phase": self.phase.value}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Beat | None:
        """None for a file that is not a heartbeat (torn, foreign, a newer writer's phase)."""
        try:
            data = fileio.loads(text)
            known = {f.name for f in fields(cls)}
            beat = cls(**{k: v for k, v in data.items() if k in known})
            beat.phase = Phase(beat.phase)
            numbers = (beat.step_s, beat.slowest_s, beat.progress, beat.beat, *(n for m in beat.marks for n in m))
            if not all(isinstance(n, int | float) for n in numbers) or not isinstance(beat.rank, int):
                return None
            if not all(len(m) == 3 for m in beat.marks):
                return None
            return beat
        except (ValueError, TypeError):
            return None


def health_dir(run_path: Path, job_id: str, restart: int) -> Path:
    return run_path / "health" / f"{job_id}.{restart}"


def diagnostics_dir(run_path: Path, job_id: str, restart: int) -> Path:
    """Where a hang's stack dumps go (`rank<R>.txt`, what `doctor` reads) and the markers the
    node watchdogs agree through."""
    return run_path / "diagnostics" / f"{job_id}.{restart}"


def write_beat(folder: Path, beat: Beat) -> None:
    """Rewrite rank<R>.json whole: a reader never sees half a file."""
    path = folder / f"rank{beat.rank}.json"
    tmp = folder / f".rank{beat.rank}.json.tmp"
    tmp.write_text(beat.to_json())
    os.replace(tmp, path)


def read_beats(folder: Path) -> dict[int, Beat]:
    """Every rank's last heartbeat in one attempt's folder, by rank."""
    out: dict[int, Beat] = {}
    for path in folder.glob("rank*.json") if folder.is_dir() else []:
        try:
            beat = Beat.from_json(fileio.read_bytes(path, 16 << 10))
        except OSError:
            continue
        if beat is not None:
            out[beat.rank] = beat
    return out


def newest_attempt(run_path: Path) -> Path | None:
    """The health folder of the newest attempt that wrote heartbeats."""
    folders = [p for p in (run_path / "health").glob("*.*") if p.is_dir()] if (run_path / "health").is_dir() else []
    return max(folders, key=lambda p: p.stat().st_mtime, default=None)


# ---------------------------------------------------------------- the rules
@value(frozen=True)
class Hang:
    """The verdict that an attempt stopped making progress: who, where, and why those ranks."""

    ranks: tuple[int, ...]  # the ranks that stopped (all of them when it cannot tell)
    hosts: tuple[str, ...]
    reason: str


def find_hang(beats: dict[int, Beat], world_size: int, settings: WatchdogSettings, now: float) -> Hang | None:
    """The attempt is hung when no rank made progress for longer than the most lenient timeout of
    the phases the answering ranks are in (a rank still preparing data or saving holds the others
    in a collective on purpose; a frozen rank's last phase says nothing), or a rank never wrote
    a heartbeat within the start-up floor.

    Which ranks: those whose heartbeat went stale (the process stopped answering); else those
    behind the others (at a lower step, or an earlier phase of the same step: the others went on
    into the next collective and wait there); else all, said so."""
    live = [b for b in beats.values() if b.phase is not Phase.DONE]
    if not live:
        return None
    missing = [r for r in range(world_size) if r not in beats]
    started = min(b.progress for b in beats.values())
    if missing and now - started > settings.startup_s:
        return Hang(tuple(missing), (), f"rank(s) {_ranks(missing)} never reported (no heartbeat)")
    idle = min(now - b.progress for b in live)
    frozen = [b for b in live if now - b.beat > STALE_BEAT_S]
    # A frozen rank's phase is what it said before it stopped answering: a rank frozen just after
    # announcing a save must not lend the others the save's lenient timeout.
    answering = [b for b in live if b not in frozen] or live
    timeout = max(hang_timeout_s(settings, b.phase, b.slowest_s) for b in answering)
    if missing or idle <= timeout:
        return None
    order = list(Phase)
    last = max((b.step, order.index(b.phase)) for b in live)
    behind = [b for b in live if (b.step, order.index(b.phase)) < last]
    culprits, why = (
        (frozen, "stopped answering (no heartbeat for {age:.0f} s)") if frozen
        else (behind, "fell behind the others") if behind
        else (live, "all waited (the heartbeats cannot tell which rank holds the others)")
    )  # fmt: skip
    age = max((now - b.beat for b in frozen), default=0.0)
    where = ", ".join(f"rank {b.rank} on {b.host} ({_doing(b)})" for b in culprits)
    reason = f"no progress for {idle:.0f} s (timeout {timeout:.0f} s): {where} " + why.format(age=age)
    return Hang(tuple(sorted(b.rank for b in culprits)), tuple(sorted({b.host for b in culprits})), reason)


def lags(beats: dict[int, Beat]) -> dict[int, float]:
    """How far behind the first rank each rank reaches the step's sync points, in seconds (the
    later of its two points), on average over the steps every stepping rank's heartbeat still
    carries (at least MIN_COMMON). Two points per step: when its batches are read (a slow data
    read shows there, before the step's first collective absorbs it) and when it is done (a
    slow optimizer step, or anything after the last collective). Slowness inside forward and
    backward is absorbed by FSDP's own collectives and shows as every rank's step time instead.
    Wall clocks: across nodes they must agree to well under a step (NTP)."""
    stepping = [b for b in beats.values() if b.phase is Phase.STEP and b.marks]
    if len(stepping) < 2:
        return {}
    common = set.intersection(*({int(m[0]) for m in b.marks} for b in stepping))
    if len(common) < MIN_COMMON:
        return {}
    at = {b.rank: {int(m[0]): (m[1], m[2]) for m in b.marks} for b in stepping}
    total = {r: 0.0 for r in at}
    for step in common:
        firsts = [min(at[r][step][point] for r in at) for point in (0, 1)]
        for r in at:
            total[r] += max(at[r][step][point] - firsts[point] for point in (0, 1))
    return {r: t / len(common) for r, t in total.items()}


def stragglers(beats: dict[int, Beat], settings: WatchdogSettings) -> dict[int, float]:
    """Ranks that reach the sync points more than (straggler_factor - 1) x the median step time
    after the first rank (with the default 1.5: half a step late, on average over the recent
    steps), with their lag. The caller asks for it straggler_checks times in a row."""
    if settings.straggler_factor <= 0:
        return {}
    late = lags(beats)
    if not late:
        return {}
    step_s = _median([b.step_s for b in beats.values() if b.rank in late])
    return {r: lag for r, lag in sorted(late.items()) if lag > (settings.straggler_factor - 1) * step_s > 0}


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2] if values else 0.0


def _doing(b: Beat) -> str:
    return f"{b.step} steps done" if b.phase is Phase.STEP else f"{b.phase}, {b.step} steps done"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


# ---------------------------------------------------------------- what status and the TUI show
@value(frozen=True)
class RankHealth:
    """One rank's row: its heartbeat's ages, step and step time, and what the events say of it."""

    rank: int
    host: str
    phase: Phase
    step: int
    step_s: float
    lag_s: float  # how late it reaches the step's sync points (lags)
    beat_age_s: float
    progress_age_s: float
    hung: bool = False
    straggler: bool = False

    @property
    def mark(self) -> str:
        return "HUNG" if self.hung else "straggler" if self.straggler else "stale" if self.stale else "ok"

    @property
    def stale(self) -> bool:
        return self.phase is not Phase.DONE and self.beat_age_s > STALE_BEAT_S


def rank_health(run_path: Path, events: list[Any], now: float) -> list[RankHealth]:
    """The rows of the newest attempt with heartbeats; `events` (records.Event) mark the ranks a
    `hang` or `straggler` event of that attempt named."""
    folder = newest_attempt(run_path)
    if folder is None:
        return []
    beats = read_beats(folder)
    key = folder.name
    hung: set[int] = set()
    slow: set[int] = set()
    for e in events:
        if f"{e.job_id}.{e.restart}" != key:
            continue
        named = set(getattr(e, "ranks", []) or [e.rank])
        if e.event == "hang":
            hung |= named
        elif e.event == "straggler":
            slow |= named
    late = lags(beats)
    return [
        RankHealth(
            b.rank,
            b.host,
            b.phase,
            b.step,
            b.step_s,
            late.get(b.rank, 0.0),
            max(0.0, now - b.beat),
            max(0.0, now - b.progress),
            b.rank in hung,
            b.rank in slow,
        )
        for b in sorted(beats.values(), key=lambda b: b.rank)
    ]
