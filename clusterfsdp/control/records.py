"""The typed records of the run folder contract (docs/run-folder.md): the run's state file with
its attempts, the events the workers append, and the states a run can be in.

Readers are tolerant: unknown keys are kept out (a newer writer may add some) and a missing
optional key takes its default, so an old run folder still reads. Writers only write what the
dataclasses declare, so docs/run-folder.md can list every key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from .procs import ProcessId


class RunState(StrEnum):
    """What `status` says of a run: Slurm's job states for a live or ended Slurm attempt, and ours."""

    PREPARED = "PREPARED"  # a dry run: the folder and sbatch.sh exist, nothing was queued
    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SIGNALING = "SIGNALING"
    SUSPENDED = "SUSPENDED"
    STOPPED = "STOPPED"
    RESIZING = "RESIZING"
    STAGE_OUT = "STAGE_OUT"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    REVOKED = "REVOKED"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    UNKNOWN = "UNKNOWN"  # the controller could not be asked and the folder does not tell

    @classmethod
    def parse(cls, text: str) -> RunState:
        """A state word as Slurm prints it ('CANCELLED by 0' -> CANCELLED); UNKNOWN if new to us."""
        word = text.split()[0] if text.split() else ""
        try:
            return cls(word)
        except ValueError:
            return cls.UNKNOWN

    @property
    def live(self) -> bool:
        """The attempt holds or waits for resources: a second attempt must not start beside it."""
        return self in _LIVE

    @property
    def final(self) -> bool:
        return self in _FINAL

    @property
    def bad(self) -> bool:
        """An end that means something went wrong (`status` exits 1)."""
        return self in _BAD


_LIVE = {
    RunState.PENDING, RunState.CONFIGURING, RunState.RUNNING, RunState.COMPLETING, RunState.SIGNALING,
    RunState.SUSPENDED, RunState.STOPPED, RunState.RESIZING, RunState.STAGE_OUT, RunState.REQUEUED,
    RunState.REQUEUE_HOLD, RunState.REQUEUE_FED, RunState.RESV_DEL_HOLD,
}  # fmt: skip
_BAD = {
    RunState.FAILED, RunState.TIMEOUT, RunState.NODE_FAIL, RunState.OUT_OF_MEMORY, RunState.BOOT_FAIL,
    RunState.DEADLINE, RunState.PREEMPTED, RunState.REVOKED, RunState.SPECIAL_EXIT,
}  # fmt: skip
_FINAL = _BAD | {RunState.COMPLETED, RunState.CANCELLED, RunState.PREPARED}


class Executor(StrEnum):
    """Who ran an attempt: a Slurm batch job, submitit's local executor, or a notebook's srun step."""

    SLURM = "slurm"
    LOCAL = "local"
    SRUN = "srun"


class EventKind(StrEnum):
    """What the workers append to events.jsonl (rank 0, or a failing rank for `failed`)."""

    START = "start"
    RESUMED = "resumed"
    CHECKPOINT_FALLBACK = "checkpoint_fallback"  # the newest checkpoint did not load; an older one did
    REQUEUED = "requeued"
    FOLLOW_UP = "follow_up"
    COMPLETED = "completed"
    STOPPED = "stopped"
    FAILED = "failed"

    @property
    def ends_attempt(self) -> bool:
        return self in (EventKind.REQUEUED, EventKind.COMPLETED, EventKind.STOPPED, EventKind.FAILED)


T = TypeVar("T")


def _from_dict(cls: type[T], data: dict[str, Any], **converted: Any) -> T:
    """Build a record from a JSON object: known keys only, `converted` overriding raw values."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{**{k: v for k, v in data.items() if k in names}, **converted})


def _to_dict(record: Any) -> dict[str, Any]:
    """JSON object of a record, without the optional keys that are unset (None or empty)."""
    out = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if isinstance(value, ProcessId):
            value = value.record()
        if value is None or value == {} or (value == "" and f.default == ""):
            continue
        out[f.name] = value
    return out


@dataclass
class Attempt:
    """One submission of a run: a Slurm job (which Slurm may requeue, keeping its id), a local
    executor job, or a notebook's srun step. Written by the control plane only."""

    attempt: int
    job_id: str
    executor: Executor
    submitted: float
    reason: str = ""
    resume_step: int | None = None
    leader: ProcessId | None = None  # local and notebook: the process group leader, with its identity
    cancelled: float | None = None  # when `cancel` was asked for
    ended: float | None = None  # notebook: when the launch returned
    world_size: int | None = None  # notebook
    allocation: str = ""  # notebook srun: the allocation and the step
    step_name: str = ""
    step: str = ""
    returncode: int | None = None
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    interrupt_to_gone_s: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        leader = ProcessId.from_record(data["leader"]) if isinstance(data.get("leader"), dict) else None
        return _from_dict(cls, data, job_id=str(data["job_id"]), executor=Executor(data["executor"]), leader=leader)

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)


@dataclass
class RunRecord:
    """state.json: who submitted what. Written by the control plane only, under the run lock."""

    run_id: str
    name: str
    executor: Executor
    created: float
    attempts: list[Attempt] = field(default_factory=list)
    dry_run: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        attempts = [Attempt.from_dict(a) for a in data.get("attempts", [])]
        return _from_dict(cls, data, executor=Executor(data.get("executor", "local")), attempts=attempts)

    def to_dict(self) -> dict[str, Any]:
        out = _to_dict(self)
        out["attempts"] = [a.to_dict() for a in self.attempts]
        return out

    @property
    def last(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def attempt(self, job_id: str) -> Attempt | None:
        return next((a for a in reversed(self.attempts) if a.job_id == job_id), None)


@dataclass
class Event:
    """One line of events.jsonl, written by the workers."""

    event: EventKind
    job_id: str
    restart: int
    rank: int
    host: str
    time: float
    step: int | None = None
    reason: str = ""
    checkpoint: str = ""
    world_size: int | None = None  # start
    nodes: int | None = None  # start
    restarts: int | None = None  # requeued: restarts so far in the whole run
    job_id_next: str = ""  # follow_up: the job that takes over

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event | None:
        """None for a line that is not an event we know (a newer writer's kind)."""
        try:
            return _from_dict(cls, data, event=EventKind(data["event"]), job_id=str(data["job_id"]))
        except (KeyError, ValueError, TypeError):
            return None

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)
