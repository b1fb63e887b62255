"""The typed records of the run folder contract (docs/run-folder.md): the run's state file with
its attempts, the events the workers append, and the states a run can be in.

Readers are tolerant of age, strict about shape: unknown keys are kept out (a newer writer may
add some) and a missing optional key takes its default, so an old run folder still reads; a value
of the wrong type (a hand edit, a torn or foreign file) raises `RecordError` naming the key, so
`status`, `runs` and the TUI can list the run as unreadable with the reason instead of failing
later on a string where a number belongs. Writers only write what the dataclasses declare, so
docs/run-folder.md can list every key.

Over 500 lines on purpose: the run folder's contract is one document, and its records, their
shared tolerant reader and the state and cause enums stay together so that docs/run-folder.md maps
to one module.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from . import fileio
from .procs import ProcessId, group_alive
from .value import value


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
    UNREADABLE = "UNREADABLE"  # state.json cannot be read (the reason says why): nothing is known of it

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
    RunState.DEADLINE, RunState.PREEMPTED, RunState.REVOKED, RunState.SPECIAL_EXIT, RunState.UNREADABLE,
}  # fmt: skip
_FINAL = _BAD | {RunState.COMPLETED, RunState.CANCELLED, RunState.PREPARED}


class Executor(StrEnum):
    """Who ran an attempt: a Slurm batch job, submitit's local executor, or a notebook's srun step."""

    SLURM = "slurm"
    LOCAL = "local"
    SRUN = "srun"


class EventKind(StrEnum):
    """What events.jsonl records: the workers (rank 0, or a failing rank for `failed`) and the
    batch script's steps around `srun` (`clusterfsdp.control.jobstep`: the last four)."""

    START = "start"
    RESUMED = "resumed"
    CHECKPOINT_FALLBACK = "checkpoint_fallback"  # the newest checkpoint did not load; an older one did
    REQUEUED = "requeued"
    FOLLOW_UP = "follow_up"
    COMPLETED = "completed"
    STOPPED = "stopped"
    FAILED = "failed"
    WARNING = "warning"  # e.g. a save too slow for the time a signal leaves (slurm.signal_grace_s)
    BAD_STEP = "bad_step"  # the numerical guard skipped a step (NaN/Inf or a spike; worker/numguard.py)
    ROLLBACK = "rollback"  # bad steps in a row: back to `checkpoint` (at `step`), their samples skipped for good
    HANG = "hang"  # a node watchdog: the attempt stopped making progress (`ranks`; suspect nodes in failed_nodes)
    STRAGGLER = "straggler"  # the watchdog on rank 0's node: one rank keeps the others waiting (no restart)
    SLURM_REQUEUED = "slurm_requeued"  # the previous incarnation was requeued by Slurm itself, unrecorded
    AUTO_RESTART = "auto_restart"  # an infrastructure failure: a new attempt was submitted (job_id_next)
    GAVE_UP = "gave_up"  # a failure that is not retried (deterministic, or restarts used up)

    @property
    def ends_attempt(self) -> bool:
        return self in _ENDS


# ---------------------------------------------------------------- one end, on each level
class RankOutcome(StrEnum):
    """How a rank's part of an attempt ended (what `worker.main.run` returns, and what the
    experiment trackers are closed with)."""

    COMPLETED = "completed"  # trained to train.steps and saved
    PREEMPTED = "preempted"  # saved and comes back (requeue, follow-up job, local restart)
    STOPPED = "stopped"  # saved and stops (a cancel); `clusterfsdp resume` continues
    FAILED = "failed"  # an exception, or restarts used up


@value(frozen=True)
class End:
    """One way an attempt ends, in the words of each level that names it: the record written
    (by rank 0, or by the batch script's step after srun), what a rank's `worker.main.run`
    returns and closes its trackers with (None: not a rank's own end, the batch script's, or
    a note after the rank's REQUEUED), and what `status` then says of the run. The Trainer's
    `LoopEnd.COMPLETED` is the first row (its cause `Cause.COMPLETED`); `LoopEnd.INTERRUPTED`
    becomes a row by the stop signal's verdict (`StopAction`: STOP -> STOPPED, REQUEUE and
    FOLLOW_UP -> REQUEUED, restarts used up -> FAILED)."""

    event: EventKind
    rank: RankOutcome | None
    state: RunState


ENDS = (
    End(EventKind.COMPLETED, RankOutcome.COMPLETED, RunState.COMPLETED),
    End(EventKind.STOPPED, RankOutcome.STOPPED, RunState.CANCELLED),
    End(EventKind.REQUEUED, RankOutcome.PREEMPTED, RunState.REQUEUED),
    End(EventKind.FAILED, RankOutcome.FAILED, RunState.FAILED),
    End(EventKind.FOLLOW_UP, None, RunState.REQUEUED),  # rank 0 queued the next job (after its REQUEUED)
    End(EventKind.SLURM_REQUEUED, None, RunState.REQUEUED),  # the batch script: Slurm requeued unrecorded
    End(EventKind.AUTO_RESTART, None, RunState.REQUEUED),  # the batch script: a new attempt for a failure
    End(EventKind.GAVE_UP, None, RunState.FAILED),  # the batch script: a failure not retried
)
RUN_STATE = {end.event: end.state for end in ENDS}  # an attempt's final record -> the run state it means
RANK_END = {end.event: end.rank for end in ENDS if end.rank is not None}  # the record rank 0 writes -> its end
_ENDS = frozenset(end.event for end in ENDS)  # EventKind.ends_attempt: the rows of ENDS


class Cause(StrEnum):
    """Why an incarnation of an attempt ended, as classified (`status` shows it per attempt).
    The infrastructure causes are retried automatically (slurm.max_restarts); the deterministic
    ones are not; the interruptions (time limit, preemption) requeue after a collective save."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"  # `clusterfsdp cancel` or a plain scancel: save and stop
    TIME_LIMIT = "time_limit"  # SIGUSR2 ahead of the time limit
    PREEMPTED = "preempted"  # Slurm preemption (SIGTERM in GraceTime, or the --signal with preempt_send_user_signal)
    REQUEUED_BY_SLURM = "requeued_by_slurm"  # Slurm requeued the job before it could save (GraceTime over, admin)
    NODE_FAILURE = "node_failure"  # Slurm declared a node of the job down
    RANK_KILLED = "rank_killed"  # a rank died without a Python exception (SIGKILL, OOM killer, segfault, abort)
    COLLECTIVE = "collective"  # a collective timed out or lost its peer (gloo/NCCL), no rank raised otherwise
    HANG = "hang"  # the watchdog found no progress, dumped the stacks and killed the attempt
    ERROR = "error"  # a Python error after the first step of the incarnation: retried once
    ERROR_BEFORE_FIRST_STEP = "error_before_first_step"  # config, missing file, bad model: not retried
    REPEATED_ERROR = "repeated_error"  # the same error at the same step as the previous failure: not retried
    PREFLIGHT = "preflight"  # a node failed the pre-flight checks (worker.preflight): retried without it
    RESTARTS_EXHAUSTED = "restarts_exhausted"  # slurm.max_restarts reached
    BUDGET = "budget"  # slurm.max_gpu_hours used up: the workers saved and stopped
    GROW = "grow"  # a node range: more nodes came free; saved and requeued to start on more (worker/elastic.py)
    UNKNOWN = "unknown"

    @classmethod
    def parse(cls, text: object) -> Cause | None:
        """A recorded cause; None when none was recorded, UNKNOWN when a newer writer's."""
        if not text:
            return None
        try:
            return cls(str(text))
        except ValueError:
            return cls.UNKNOWN

    @property
    def retryable(self) -> bool:
        """A new attempt is likely to get further: the machines failed (a node, a rank, a
        collective, a node's pre-flight), or a Python error happened once after training had started (it may be
        transient: an ECC error, a file system hiccup); the same error at the same step twice is not."""
        return self in (
            Cause.NODE_FAILURE,
            Cause.RANK_KILLED,
            Cause.COLLECTIVE,
            Cause.HANG,
            Cause.ERROR,
            Cause.PREFLIGHT,
        )

    @property
    def interruption(self) -> bool:
        """The job was asked to make room and saved first: it comes back without using a restart
        of slurm.max_restarts, as long as it got past the checkpoint it started from."""
        return self in (Cause.TIME_LIMIT, Cause.PREEMPTED, Cause.REQUEUED_BY_SLURM)


T = TypeVar("T")


def _short_reason(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class RecordError(ValueError):
    """A record that does not have the shape its dataclass declares; the message names the key."""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


# Every float of a record is a time (seconds since the epoch) or a duration in seconds: finite and
# within this bound (the year 2286), so that formatting it as a date never overflows; every int
# (a step, a rank, an exit code) fits in 64 bits. A value beyond is damage, not data.
MAX_SECONDS = 1e10
_INT64 = 1 << 63


def _matches(value: Any, hint: Any, bounded: bool = True) -> bool:
    """`value`, read from JSON, has the declared type (an int is a float; a bool is no number),
    and with `bounded` a number is within the range above."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a, bounded) for a in args)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and all(_matches(v, args[0], bounded) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_matches(v, args[1], bounded) for v in value.values())
    if isinstance(value, bool):
        return hint is bool
    if hint is float:
        return isinstance(value, (int, float)) and (not bounded or -MAX_SECONDS <= value <= MAX_SECONDS)
    if hint is int:
        return isinstance(value, int) and (not bounded or -_INT64 <= value < _INT64)
    if issubclass(hint, StrEnum):
        return isinstance(value, str)
    return isinstance(value, hint)


def _from_dict(cls: type[T], data: Any, **converted: Any) -> T:
    """Build a record from a JSON object: known keys only, `converted` overriding raw values;
    RecordError for a value of the wrong type."""
    if not isinstance(data, dict):
        raise RecordError(f"{cls.__name__}: expected a JSON object, found {type(data).__name__}")
    hints = _hints(cls)
    kept = {k: v for k, v in data.items() if k in hints and k not in converted}
    for key, found in kept.items():
        if not _matches(found, hints[key]):
            if _matches(found, hints[key], bounded=False):
                raise RecordError(f"{key}: {_short(found)} is out of range")
            raise RecordError(f"{key}: expected {hints[key]}, found {type(found).__name__} {_short(found)}")
    try:
        return cls(**{**kept, **converted})
    except TypeError as e:  # a required key missing
        raise RecordError(f"{cls.__name__}: {e}") from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _required(data: Any, key: str, kind: type[T] | tuple[type, ...]) -> Any:
    """A key the record cannot do without, of its type (JSON's int job ids are read as text)."""
    if not isinstance(data, dict):
        raise RecordError(f"expected a JSON object, found {type(data).__name__}")
    if key not in data:
        raise RecordError(f"{key}: missing")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise RecordError(f"{key}: found {type(value).__name__} {_short(value)}")
    return value


def _enum(kind: type[StrEnum], data: Any, key: str, default: str | None = None) -> Any:
    value = _required(data, key, str) if default is None or key in data else default
    try:
        return kind(value)
    except ValueError:
        raise RecordError(f"{key}: unknown {kind.__name__} {_short(value)}") from None


def _list_of(read: Callable[[Any], T], data: Any, key: str) -> list[T]:
    """The list of records under `key` (absent: empty), each read by `read`; an error names the
    item (`attempts[2].job_id: ...`)."""
    listed = data.get(key, []) if isinstance(data, dict) else None
    if not isinstance(listed, list):
        raise RecordError(f"{key}: expected a list, found {type(listed).__name__}")
    out = []
    for i, item in enumerate(listed):
        try:
            out.append(read(item))
        except RecordError as e:
            raise RecordError(f"{key}[{i}].{e}") from None
    return out


def _to_dict(record: Any) -> dict[str, Any]:
    """JSON object of a record, without the optional keys that are unset (None or empty)."""
    out = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if isinstance(value, ProcessId):
            value = value.record()
        if value is None or value == {} or value == [] or (value == "" and f.default == ""):
            continue
        out[f.name] = value
    return out


def _read(cls: Any, path: Path) -> Any:
    """`cls.from_dict` of a JSON file; RecordError starting with the file's name if it cannot be read."""
    try:
        return cls.from_dict(fileio.load_json(path))
    except (OSError, ValueError) as e:  # RecordError, JSON and UTF-8 errors are ValueErrors
        reason = (e.strerror or str(e)) if isinstance(e, OSError) else str(e)
        raise RecordError(f"{path.name}: {_short_reason(reason)}") from None


@value
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
    cause: Cause | None = None  # automatic restarts: the failure this attempt recovers from
    exclude: list[str] = field(default_factory=list)  # nodes kept out of this attempt (--exclude)

    def group_alive(self) -> bool:
        """A local or notebook attempt whose recorded process group still runs (its leader's
        identity checked, so a recycled pid is not taken for it). Slurm's attempts are asked
        of Slurm (`control.backends`; `status` asks for all runs at once)."""
        return self.leader is not None and group_alive(self.leader)

    @classmethod
    def from_dict(cls, data: Any) -> Attempt:
        job_id = str(_required(data, "job_id", (str, int)))
        leader = None
        if data.get("leader") is not None:  # a process the control plane may signal: never guessed at
            leader = ProcessId.from_record(data["leader"]) if isinstance(data["leader"], dict) else None
            if leader is None:
                raise RecordError(f"leader: not a process record: {_short(data['leader'])}")
        return _from_dict(
            cls,
            data,
            job_id=job_id,
            executor=_enum(Executor, data, "executor"),
            leader=leader,
            cause=Cause.parse(data.get("cause")),
        )

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)


@value
class RunRecord:
    """state.json: who submitted what. Written by the control plane only, under the run lock."""

    run_id: str
    name: str
    executor: Executor
    created: float
    attempts: list[Attempt] = field(default_factory=list)
    dry_run: bool = False

    @classmethod
    def from_dict(cls, data: Any) -> RunRecord:
        attempts = _list_of(Attempt.from_dict, data, "attempts")
        return _from_dict(cls, data, executor=_enum(Executor, data, "executor", "local"), attempts=attempts)

    @classmethod
    def read(cls, path: Path) -> RunRecord:
        """state.json; RecordError (its message starts with the file's name) if it cannot be read."""
        return _read(cls, path)

    def to_dict(self) -> dict[str, Any]:
        out = _to_dict(self)
        out["attempts"] = [a.to_dict() for a in self.attempts]
        return out

    @property
    def last(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def attempt(self, job_id: str) -> Attempt | None:
        return next((a for a in reversed(self.attempts) if a.job_id == job_id), None)


@value
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
    attempt: int | None = None  # start: the how-manieth start of training in the run (metrics rows carry it)
    restarts: int | None = None  # requeued, auto_restart: restarts of slurm.max_restarts used so far
    job_id_next: str = ""  # follow_up, auto_restart: the job that takes over
    cause: Cause | None = None  # requeued, stopped, failed (the rank's own view), warning-free jobstep kinds
    steps_done: int | None = None  # failed: optimizer steps this incarnation completed before it failed
    # auto_restart, gave_up: nodes Slurm declared down; hang: the nodes the evidence points at;
    # failed (cause preflight): the nodes that failed the pre-flight
    failed_nodes: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)  # hang, straggler: the ranks named
    signature: str = ""  # auto_restart, gave_up: the error and its step (the same twice: not retried)
    exit_code: int | None = None  # auto_restart, gave_up (a job step's): srun's exit status (128 + N: signal N)

    @classmethod
    def from_dict(cls, data: Any) -> Event | None:
        """None for a line that is not an event we know (a newer writer's kind, a damaged line)."""
        try:
            return _from_dict(
                cls,
                data,
                event=_enum(EventKind, data, "event"),
                job_id=str(_required(data, "job_id", (str, int))),
                cause=Cause.parse(data.get("cause")),
            )
        except RecordError:
            return None

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)


PREFLIGHT_ERROR = "PreflightFailed"  # worker.preflight's exception, named in its `failed` events' reason


def preflight_failures(events: Iterable[Event]) -> list[Event]:
    """The first `failed` event of cause preflight of each incarnation, in time order (every rank
    records the same verdict: one is enough)."""
    first: dict[tuple[str, int], Event] = {}
    for e in sorted(events, key=lambda e: (e.time, e.rank)):
        if e.event is EventKind.FAILED and e.cause is Cause.PREFLIGHT:
            first.setdefault((e.job_id, e.restart), e)
    return list(first.values())


def preflight_verdict(event: Event) -> str:
    """'pre-flight failed on node2: checkpoint space: ...': the line without the rank, host and exception name."""
    return event.reason.partition(f"{PREFLIGHT_ERROR}: ")[2] or event.reason


@value
class TrackerIds:
    """trackers.json: the experiment trackers' run ids, so that every attempt of a run (requeue,
    resume, another world size) logs into the same tracker run. Written by rank 0 only."""

    wandb_run_id: str = ""
    mlflow_run_id: str = ""
    mlflow_experiment_id: str = ""

    @classmethod
    def from_dict(cls, data: Any) -> TrackerIds:
        if not isinstance(data, dict):
            raise RecordError(f"TrackerIds: expected a JSON object, found {type(data).__name__}")
        return _from_dict(cls, {k: str(v) for k, v in data.items()})

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)


@value
class SweepPoint:
    """One point of a sweep: its index (the Slurm array task id), its run and the values it sets."""

    index: int
    run_id: str
    values: dict[str, Any]

    @classmethod
    def from_dict(cls, data: Any) -> SweepPoint:
        return _from_dict(cls, data)


@value
class SweepRecord:
    """sweep.json, in the sweep folder beside its points' run folders: what was swept and where
    each point runs. Written by the control plane only (control.sweep)."""

    sweep_id: str
    name: str  # the job's name; the sweep folder is <run_root>/<name>-<sweep id>
    executor: Executor
    created: float
    keys: list[str]
    points: list[SweepPoint]
    max_parallel: int = 0
    job_id: str = ""  # Slurm: the job array's id (point i is job <job_id>_<i>)
    cancelled: float | None = None  # `cancel SWEEP`: no point starts after this

    @classmethod
    def from_dict(cls, data: Any) -> SweepRecord:
        points = _list_of(SweepPoint.from_dict, data, "points")
        return _from_dict(cls, data, executor=_enum(Executor, data, "executor"), points=points)

    @classmethod
    def read(cls, path: Path) -> SweepRecord:
        """sweep.json; RecordError (its message starts with the file's name) if it cannot be read."""
        return _read(cls, path)

    def to_dict(self) -> dict[str, Any]:
        out = _to_dict(self)
        out["points"] = [_to_dict(p) for p in self.points]
        return out


def attempt_sizes(events: Iterable[Event]) -> dict[tuple[str, int], str]:
    """{(job id, restart): '1 node(s) x 2 = 2 ranks'} of every incarnation that started
    training (its `start` event), for `status`."""
    out: dict[tuple[str, int], str] = {}
    for e in events:
        if e.event is EventKind.START and e.nodes and e.world_size:
            per = f"{e.world_size // e.nodes}" if e.world_size % e.nodes == 0 else "?"
            out[(e.job_id, e.restart)] = f"{e.nodes} node(s) x {per} = {e.world_size} ranks"
    return out
