"""A run's state, joined from the run folder (the attempts the control plane recorded, the events
the workers wrote) and the executor (squeue/sacct for Slurm, the recorded process group for local
runs and notebook launches). Used by `status`, `runs`, the TUI's queue and the run service;
Slurm is asked once per refresh for all runs together."""

from __future__ import annotations

import math
import tomllib
from dataclasses import field

from ..core import ckptfolder, fileio, procs, records, slurmcli
from ..core.records import Attempt, Cause, Event, EventKind, Executor, RecordError, RunRecord, RunState, TrackerIds
from ..core.runfolder import RunFolder, owner
from ..core.sweeplayout import sweep_of
from ..core.value import value
from ..data import samplestats
from . import cost, jsonltail, pending
from .cost import RunCost

# Ends after which the job does not run training again under its id: while Slurm still says
# RUNNING, the batch script's `after` step is classifying the end (and may queue the next job).
# A requeue is not among them: the next incarnation runs under the same id.
_WRAPPING_UP = {
    EventKind.COMPLETED, EventKind.STOPPED, EventKind.FAILED, EventKind.GAVE_UP, EventKind.AUTO_RESTART,
    EventKind.FOLLOW_UP,
}  # fmt: skip
# Which record says how an incarnation ended, most telling first: the batch script's verdict on
# a failure, Slurm's own requeue, the workers' decision, then the first rank that failed.
_END_ORDER = (
    EventKind.GAVE_UP, EventKind.AUTO_RESTART, EventKind.SLURM_REQUEUED, EventKind.REQUEUED, EventKind.FOLLOW_UP,
    EventKind.COMPLETED, EventKind.STOPPED, EventKind.FAILED,
)  # fmt: skip


@value(frozen=True)
class AttemptEnd:
    """How one incarnation of an attempt (a job id and Slurm's restart count) ended: the record
    that says it, with its classified cause (`status` and the TUI show one line per incarnation).
    A failure's `reason` and `finding` are the doctor's verdict (`judged_ends`)."""

    job_id: str
    restart: int
    event: EventKind
    cause: Cause | None
    reason: str
    finding: str = ""  # a failure: the doctor's Finding

    @property
    def label(self) -> str:
        """'requeued (preempted)', 'failed (rank_killed)': the record and its cause (the TUI's attempts line)."""
        cause = self.finding or self.cause
        return f"{self.event} ({cause})" if cause and cause != self.event else str(self.event)

    def describe(self) -> str:
        """'requeued (preempted): preempted at 2026-11-23T17:57:53 (SIGTERM); saved step 10'."""
        return f"{self.label}: {self.reason}" if self.reason else self.label


def _end_records(events: list[Event]) -> list[Event]:
    """The record that says how each incarnation ended, in the order they started."""
    ends: dict[tuple[str, int], list[Event]] = {}
    for e in events:
        if e.event in _END_ORDER:
            ends.setdefault((e.job_id, e.restart), []).append(e)
    return [min(found, key=lambda e: (_END_ORDER.index(e.event), e.time)) for found in ends.values()]


def attempt_ends(events: list[Event]) -> list[AttemptEnd]:
    """One AttemptEnd per incarnation that ended, in the order they started, as its records say."""
    return [AttemptEnd(e.job_id, e.restart, e.event, e.cause, e.reason) for e in _end_records(events)]


_FAILURES = (EventKind.FAILED, EventKind.GAVE_UP, EventKind.AUTO_RESTART)
_NOT_RETRIED = {
    Cause.RESTARTS_EXHAUSTED: "not restarted: slurm.max_restarts used up",
    Cause.ERROR_BEFORE_FIRST_STEP: "not retried: an error before the first step",
    Cause.REPEATED_ERROR: "not retried: the same error at the same step as the attempt before",
}


def judged_ends(run: RunFolder, events: list[Event]) -> list[AttemptEnd]:
    """`attempt_ends`, each failure told by the doctor's verdict on it (`doctor.verdict`: the
    rank that died or raised first, not a survivor's lost peer, the cause first), followed by
    what the batch script's job step then did (an automatic restart, or why none). So `status`,
    `--follow`, the TUI and `doctor` all name the same first cause."""
    ends = _end_records(events)
    if not any(e.event in _FAILURES for e in ends):
        return [AttemptEnd(e.job_id, e.restart, e.event, e.cause, e.reason) for e in ends]
    from . import doctor  # (only for a run with a failure: `status` and `runs` of the others stay light)

    out = []
    for e in ends:
        found = doctor.verdict(run, events, e.job_id, e.restart) if e.event in _FAILURES else None
        if found is None:
            out.append(AttemptEnd(e.job_id, e.restart, e.event, e.cause, e.reason))
            continue
        reason = found.headline()
        if e.event is EventKind.AUTO_RESTART:
            reason += f"; automatic restart: job {e.job_id_next}" if e.job_id_next else "; automatic restart"
        elif e.event is EventKind.GAVE_UP:
            failed = e.reason.partition("; the restart failed: ")[2]
            why = _NOT_RETRIED.get(e.cause, "not retried") if e.cause is not None else "not retried"
            reason += f"; the restart failed: {failed}" if failed else f"; {why}"
        out.append(AttemptEnd(e.job_id, e.restart, e.event, e.cause, reason, str(found.finding)))
    return out


def guard_note(events: list[Event]) -> str:
    """'numerical guard: 3 step(s) skipped, 1 rollback(s) (latest: ...)', or '' when none. A
    rollback the guard refused is no rollback: the run failed (worker/numguard.py)."""
    bad = sum(e.event is EventKind.BAD_STEP for e in events)
    rollbacks = [e for e in events if e.event is EventKind.ROLLBACK]
    if not bad and not rollbacks:
        return ""
    latest = f", {len(rollbacks)} rollback(s) (latest: {rollbacks[-1].reason})" if rollbacks else ""
    return f"numerical guard: {bad} step(s) skipped{latest}"


@value
class RunStatus:
    run: RunFolder
    state: RunState
    reason: str = ""
    job_id: str = ""
    executor: str = ""
    created: float | None = None  # when the run folder was made (state.json)
    step: int | None = None
    steps: int | None = None
    loss: float | None = None
    attempts: list[Attempt] = field(default_factory=list)
    ends: list[AttemptEnd] = field(default_factory=list)  # how each incarnation of each attempt ended
    notes: list[str] = field(default_factory=list)  # e.g. a checkpoint set aside, a save too slow for the grace
    events: list[Event] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)  # steps of the complete checkpoints
    trackers: TrackerIds = field(default_factory=TrackerIds)
    eval_loss: float | None = None
    eval_step: int | None = None
    eval_ppl: float | None = None
    epoch: float | None = None  # samples consumed / training samples, at the newest metrics row
    reward_accuracy: float | None = None  # preference training: at the newest training row
    eval_reward_accuracy: float | None = None  # and at the newest evaluation
    reward_margin: float | None = None  # preference training (dpo... and kto): at the newest training row
    kl: float | None = None  # kto: its KL estimate at the newest training row
    cost: RunCost | None = None  # Slurm's accounting (`with_costs`); None: no Slurm attempt, or unknown
    cost_error: str = ""  # why the cost of a run with a Slurm attempt is unknown (sacct missing or failing)

    @property
    def on_slurm(self) -> bool:
        """It has a Slurm attempt, so a cost (GPU- and CPU-hours) from Slurm's accounting."""
        return any(a.executor is Executor.SLURM for a in self.attempts)


@value(frozen=True)
class LastLogged:
    """The newest training row of metrics.jsonl (step, loss) and the newest evaluation."""

    step: int | None = None
    loss: float | None = None
    eval_step: int | None = None
    eval_loss: float | None = None
    eval_ppl: float | None = None
    epoch: float | None = None
    total_steps: int | None = None  # the steps the run trains, as the worker counted them (train.epochs)
    reward_accuracy: float | None = None  # preference training (worker/preference.py)
    eval_reward_accuracy: float | None = None
    reward_margin: float | None = None
    kl: float | None = None  # kto (worker/kto.py)


def _perplexity(evaluated: dict | None, eval_loss: float | None) -> float | None:
    """The row's eval_ppl, or exp(eval_loss) for rows written before it was logged; none for a
    preference objective's evaluation (its rows carry rewards, kto's a KL estimate: exp of a
    pair or KTO loss means nothing)."""
    logged = _number(evaluated, "eval_ppl")
    if (
        logged
        or evaluated is None
        or eval_loss is None
        or any(_has(evaluated, k) for k in ("eval_reward_accuracy", "eval_kl"))
    ):
        return logged
    return math.exp(min(eval_loss, 700))


def _number(row: dict | None, key: str) -> float | None:
    value = (row or {}).get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:  # an int beyond any float: damage, read as absent
        return None


def _int(value: object) -> bool:
    """A step count as a worker writes it: an int of 64 bits (a longer one is damage)."""
    return type(value) is int and -(1 << 63) <= value < 1 << 63


def _step(row: dict) -> bool:
    return _int(row.get("step"))


def _has(row: dict, key: str) -> bool:
    return _step(row) and _number(row, key) is not None


def last_logged(run: RunFolder) -> LastLogged:
    """The newest row with a step, the newest with a loss and the newest with an eval_loss, read from the end of
    metrics.jsonl (a bounded read: `runs` over thousands of long runs reads only their tails).
    Values of the wrong type (a damaged or foreign row) read as absent."""
    last, trained, evaluated = jsonltail.newest(
        run.metrics_file, [_step, lambda r: _has(r, "loss"), lambda r: _has(r, "eval_loss")]
    )
    eval_loss = _number(evaluated, "eval_loss")
    return LastLogged(
        last["step"] if last else None,
        _number(trained, "loss"),
        evaluated["step"] if evaluated else None,
        eval_loss,
        _perplexity(evaluated, eval_loss),
        _number(last, "epoch"),
        last["total_steps"] if last and _int(last.get("total_steps")) else None,
        _number(trained, "reward_accuracy"),
        _number(evaluated, "eval_reward_accuracy"),
        _number(trained, "reward_margin"),
        _number(trained, "kl"),
    )


@value(frozen=True)
class ListedJob:
    """The two keys of a run's job.toml that its status needs: train.steps and checkpoint.dir.
    Read with tomllib alone, not through the spec: the run folder's job.toml is a complete dump
    of the spec (spec.dumps writes every key), and loading and checking the whole spec for each
    listed run cost most of `runs` and made `status` import the schema (bench/startup_bench.py).
    A damaged or hand-edited job.toml gives None and '' (listing goes on)."""

    steps: int | None = None
    checkpoint_dir: str = ""

    @classmethod
    def read(cls, run: RunFolder) -> ListedJob:
        try:
            data = fileio.read_bytes(run.job_toml, fileio.MAX_JOB_FILE_BYTES + 1)
            if len(data) > fileio.MAX_JOB_FILE_BYTES:
                return cls()
            tables = _tables(data.decode(), ("train", "checkpoint"))
        except (OSError, ValueError, RecursionError):  # tomllib recurses on nested arrays and tables
            return cls()
        steps, folder = tables["train"].get("steps"), tables["checkpoint"].get("dir", "")
        return cls(steps if type(steps) is int else None, folder if isinstance(folder, str) else "")


def _tables(text: str, names: tuple[str, ...]) -> dict[str, dict]:
    """The top-level tables `names` of a TOML document as tomli_w writes it (a table starts with
    its `[name]` line), each parsed on its own: parsing all of job.toml for two keys was most of
    the time `runs` spent per run. ValueError if one does not parse."""
    chunks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("["):
            current = chunks.setdefault(line.strip()[1:-1], []) if line.strip()[1:-1] in names else None
        elif current is not None:
            current.append(line)
    return {name: tomllib.loads("\n".join(chunks.get(name, []))) for name in names}


def planned_steps(run: RunFolder) -> int | None:
    """The steps a train.epochs run trains, as rank 0 counted them: the newest metrics row's
    `total_steps`, else data.json's (written when its data opened, before the first row)."""
    return last_logged(run).total_steps or _data_steps(run)


def _data_steps(run: RunFolder) -> int | None:
    return samplestats.steps(run.data_file)


def _checkpoint_steps(run: RunFolder, job: ListedJob) -> list[int]:
    try:
        return [c.step for c in ckptfolder.list_checkpoints(run.checkpoints_in(job.checkpoint_dir))]
    except (OSError, ValueError):  # an unreadable folder or metadata file must not break listing
        return []


def _read_record(run: RunFolder) -> RunRecord | RecordError:
    try:
        return RunRecord.read(run.state_file)
    except RecordError as e:
        return e


def _unstarted(run: RunFolder) -> tuple[RunState, str]:
    """A run with no attempt: a point of a sweep its local driver has not started yet (PENDING,
    not final: waiting for it ends when it has run), one it never will, or a dry run."""
    sweep = sweep_of(run)
    if sweep is None:
        return RunState.PREPARED, f"not submitted (dry run): sbatch {run.sbatch_script}"
    try:
        cancelled = sweep.record().cancelled is not None
    except RecordError as e:
        return RunState.PREPARED, f"not started, and its sweep cannot be read: {e}"
    if cancelled:
        return RunState.CANCELLED, f"not started: sweep {sweep.id} was cancelled first"
    driver = sweep.driver()  # None: being started (it records itself once detached)
    if driver is None or procs.group_alive(driver):
        return RunState.PENDING, f"waiting for its turn: sweep {sweep.id}'s local driver starts its points in order"
    return RunState.PREPARED, f"not started: sweep {sweep.id}'s driver is gone (`clusterfsdp resume {sweep.id}`)"


def run_status(
    run: RunFolder, queue: dict[str, slurmcli.JobRow] | None = None, record: RunRecord | RecordError | None = None
) -> RunStatus:
    """State of one run. `queue` is a pre-fetched {job id: row}, `record` its state.json as read
    already (see `statuses`). A run whose state.json cannot be read is UNREADABLE, with the
    reason: listing goes on past it."""
    record = _read_record(run) if record is None else record
    if isinstance(record, RecordError):
        return RunStatus(run, RunState.UNREADABLE, str(record))
    progress = last_logged(run)
    job = ListedJob.read(run)
    st = RunStatus(
        run,
        RunState.PREPARED,
        executor=record.executor,
        created=record.created,
        step=progress.step,
        steps=job.steps or progress.total_steps or _data_steps(run),
        loss=progress.loss,
        attempts=record.attempts,
        eval_loss=progress.eval_loss,
        eval_step=progress.eval_step,
        eval_ppl=progress.eval_ppl,
        epoch=progress.epoch,
        reward_accuracy=progress.reward_accuracy,
        eval_reward_accuracy=progress.eval_reward_accuracy,
        reward_margin=progress.reward_margin,
        kl=progress.kl,
    )
    events = run.events()
    st.events, st.checkpoints, st.trackers = events, _checkpoint_steps(run, job), run.tracker_ids()
    st.notes = [f"step {e.step}: {e.reason}" for e in events if e.event is EventKind.CHECKPOINT_FALLBACK and e.reason]
    warnings: dict[str, Event] = {}  # the newest warning of each kind: a save too slow, a loss rising, ...
    for e in events:
        if e.event is EventKind.WARNING:
            warnings[" ".join(e.reason.split()[:3])] = e  # (its first words say which check wrote it)
    st.notes += [f"warning (step {e.step}): {e.reason}" for e in sorted(warnings.values(), key=lambda e: e.time)]
    if note := guard_note(events):
        st.notes.append(note)
    st.notes += [records.preflight_verdict(e) for e in records.preflight_failures(events)]
    st.notes += [f"{e.event} ({e.job_id}.{e.restart}): {e.reason}" for e in events
                 if e.event in (EventKind.STRAGGLER, EventKind.HANG)]  # fmt: skip
    st.ends = judged_ends(run, events)
    last = record.last
    if last is None:
        st.state, st.reason = _unstarted(run)
        return st
    st.job_id, st.executor = last.job_id, last.executor
    mine = [e for e in events if e.job_id == last.job_id]
    latest = max((e.restart for e in mine), default=0)  # an earlier incarnation's end says nothing of this one
    end = next((e for e in st.ends if e.job_id == last.job_id and e.restart == latest), None)
    started = any(e.event is EventKind.START for e in mine)
    if last.executor is Executor.SLURM:
        row = (queue or {}).get(last.job_id)
        if queue is None:
            try:
                row = slurmcli.job_states([last.job_id]).get(last.job_id)
            except slurmcli.SlurmError as e:
                st.reason = str(e)
        if row is not None:
            slurm_state = RunState.parse(row.state)
            if slurm_state is RunState.RUNNING and end is not None and end.event in _WRAPPING_UP:
                st.state = RunState.COMPLETING
                st.reason = f"the workers ended ({end.describe()}); the batch script's last step is running"
                return st
            if slurm_state.live:
                st.state, st.reason = slurm_state, ("" if row.reason in ("None", "") else row.reason)
                if slurm_state is RunState.PENDING:  # (Slurm's reason is None until it scheduled the dependency)
                    st.reason = _prepare_note(run, live=True) or pending.words(st.reason)
                return st
            if slurm_state is not RunState.COMPLETED and not (end and end.event is EventKind.COMPLETED):
                silent = _unrecorded_end(run, events, last.job_id, latest) if started and end is None else ""
                st.state, st.reason = slurm_state, _reason(end, row, slurm_state, silent)
                if not started:
                    st.reason = _prepare_note(run, live=False) or _before_start(last, row, slurm_state, st.reason)
                return st
    elif last.group_alive():
        st.state = RunState.RUNNING if started else RunState.PENDING
        return st
    if end is not None:
        st.state, st.reason = records.RUN_STATE[end.event], end.reason
    elif last.cancelled:
        st.state = RunState.CANCELLED
        st.reason = "cancelled (clusterfsdp cancel)" + ("" if started else " before it started")
    elif last.leader is not None and last.leader.problem:  # corrupt or planted: never PENDING forever
        st.state, st.reason = RunState.UNKNOWN, f"state.json: invalid leader record ({last.leader.problem})"
    elif started:
        st.state = RunState.FAILED
        st.reason = _unrecorded_end(run, events, last.job_id, latest) or (
            "workers exited without a final record (killed?); see `clusterfsdp logs`"
        )
    elif last.executor is Executor.SLURM:
        st.state = RunState.UNKNOWN
    else:
        st.state, st.reason = RunState.FAILED, "never started; see the submitit logs"
    return st


def _prepare_note(run: RunFolder, live: bool) -> str | None:
    """The job a training job waits for (or was cancelled for): the data prepare array
    (control/prepjob.py), then the reference job (control/refjob.py), each imported only for a
    run that has one (their RECORD files): `status` stays light."""
    note = None
    if (run.path / "prepare.json").is_file():
        # a run with a prepare array only: prepjob brings launch and data/ (start-up of `status`)
        from . import prepjob

        note = prepjob.note(run.path, live)
    if note is None and (run.path / "reference.json").is_file():
        # a run with a reference job only: refjob brings launch (start-up of `status`)
        from . import refjob

        note = refjob.note(run.path, live)
    return note


def _unrecorded_end(run: RunFolder, events: list[Event], job_id: str, restart: int) -> str:
    """The doctor's verdict on an incarnation that started and ended without an end record
    (every rank killed at once, no job step after them); '' when it has none."""
    # an attempt that ended unrecorded only: the doctor's rules (start-up of `status`, `runs`)
    from . import doctor

    found = doctor.verdict(run, events, job_id, restart)
    return found.headline() if found is not None else ""


def _before_start(last: Attempt, row: slurmcli.JobRow, state: RunState, reason: str) -> str:
    """Why a Slurm job that never started training ended: who cancelled it (`clusterfsdp cancel`,
    or sacct's `CANCELLED by UID`) and, unless it was `clusterfsdp cancel`, what it waited for
    (Slurm's reason: a dependency that can never be met, a begin time)."""
    if state is not RunState.CANCELLED:
        return reason
    if last.cancelled is not None:
        return "cancelled before it started (by clusterfsdp cancel)"
    said = [f"by {slurmcli.describe_uid(row.by)}"] if row.by else []
    if row.reason not in ("", "None"):
        said.append(f"while it waited: {row.reason}")
    return f"cancelled before it started ({', '.join(said) or 'scancel, or Slurm'})"


def _reason(end: AttemptEnd | None, row: slurmcli.JobRow, state: RunState, silent: str = "") -> str:
    parts = [silent] if silent else []
    if end is not None and end.reason:
        parts.append(end.reason)
    if row.exit_code and row.exit_code != "0:0":
        parts.append(f"exit code {row.exit_code}")
    if row.reason and row.reason not in ("None", "") and not parts:  # a pending reason Slurm kept (BeginTime)
        parts.append(row.reason)
    if state is RunState.NODE_FAIL:
        parts.append(f"a node failed ({row.nodes})")
    return "; ".join(parts)


def with_costs(rows: list[RunStatus], ask: cost.Ask | None = None) -> str:
    """Each row's cost, from ONE sacct call for all rows (`cost.costs`: none for attempts whose
    figures the run folder keeps, nor for a job that waits and never ran); sacct's error or ''."""
    items = []
    for st in rows:
        slurm = st.executor == Executor.SLURM and st.job_id
        ran = any(e.job_id == st.job_id for e in st.events)
        items.append(cost.Listed(
            st.run, tuple(a.job_id for a in st.attempts if a.executor is Executor.SLURM), st.events,
            live=st.job_id if slurm and st.state.live else "",
            waiting=st.job_id if slurm and st.state is RunState.PENDING and not ran else "",
        ))  # fmt: skip
    found, error = cost.costs(items, ask)
    for st in rows:
        st.cost = found.get(st.run.path)
        st.cost_error = error if st.cost is None and st.on_slurm else ""
    return error


@value(frozen=True)
class UserCost:
    """What one user's runs (the run folders they own) cost, of those listed."""

    used: cost.Usage
    runs: int  # runs with a Slurm attempt
    unknown: int  # of those, runs whose cost sacct could not tell

    def line(self) -> str:
        said = f"{self.used.gpu_hours:.2f} GPU-h, {self.used.cpu_hours:.2f} CPU-h ({self.runs} run(s)"
        return said + (f", {self.unknown} unknown)" if self.unknown else ")")

    def to_json(self) -> dict:
        return {"gpu_hours": round(self.used.gpu_hours, 6), "cpu_hours": round(self.used.cpu_hours, 6),
                "runs": self.runs, "unknown": self.unknown}  # fmt: skip


def cost_by_user(rows: list[RunStatus]) -> dict[str, UserCost]:
    """The rows' cost summed per user, the owner of each run folder (a shared run root holds
    several users' runs), for the rows that ran on Slurm; the users in name order."""
    out: dict[str, UserCost] = {}
    for st in rows:
        if not st.on_slurm:
            continue
        user = owner(st.run)
        was = out.get(user, UserCost(cost.Usage(), 0, 0))
        used = was.used + st.cost.total if st.cost is not None else was.used
        out[user] = UserCost(used, was.runs + 1, was.unknown + (st.cost is None))
    return dict(sorted(out.items()))


def statuses(run_list: list[RunFolder], costs: bool = False) -> tuple[list[RunStatus], str]:
    """Status of many runs with one squeue (+ one sacct) call, and with `costs` their cost (one
    sacct more, at most: `with_costs`); returns (rows, Slurm error or '')."""
    records = [_read_record(r) for r in run_list]
    lasts = [r.last for r in records if isinstance(r, RunRecord)]
    ids = [a.job_id for a in lasts if a is not None and a.executor is Executor.SLURM]
    queue: dict[str, slurmcli.JobRow] = {}
    error = ""
    if ids:
        try:
            queue = slurmcli.job_states(ids)
        except slurmcli.SlurmError as e:
            error = str(e)
    rows = [run_status(r, queue, record) for r, record in zip(run_list, records, strict=True)]
    if costs:
        with_costs(rows)  # (its error is each row's cost_error: the states are known)
    return rows, error
