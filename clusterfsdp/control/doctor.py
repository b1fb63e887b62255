"""`clusterfsdp doctor RUN`: why a run failed, from its run folder alone (docs/recovery.md,
"Asking the doctor"), and the one verdict on each failed incarnation that every front-end shows.

The evidence is what the workers and the batch script's job steps already leave: events.jsonl
(every rank that raised recorded a `failed` event with its time, host and exception; the job
steps recorded what Slurm did and how they classified it), the rank logs
(`logs/<job>.<restart>/rank<R>.log`, with the traceback each failing rank printed), submitit's
task logs (a worker that died before it opened its own log) and the exit status of each local
task (`localctl`), and stack dumps (`diagnostics/`; core/evidence.py reads them, bounded). From
these it names the first error across ranks in time order, the rank and host it came from, the
classified cause (`Finding`, control/findings.py with what each advises), the few log lines that
show it and what to do next.

Root causes before consequences: when one rank raises, the others then lose their peer and
record collective errors later; a rank that died without a record (SIGKILL, the OOM killer) or
stopped answering (a hang) is found by its absence among the ranks that reported (the same rule
as `control.outcomes.classify_failure`, which the batch script uses to decide on a restart).

One verdict: `Diagnosis.headline` (the cause first, then the rank and step) is what `status`'s
state and attempt lines, `--follow`'s last line and the TUI's queue show for a failed
incarnation (`verdict`, without reading logs), so they never blame another rank than `doctor`.
Pure Python, no torch.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import asdict, field
from typing import Any

from ..core import ckptfolder, evidence, fileio, outcomes
from ..core.records import Cause, Event, EventKind, RunState, preflight_failures, preflight_verdict
from ..core.runfolder import RunFolder
from ..core.value import value
from . import prepjob, refjob
from .findings import Context, Finding, Numbers, next_steps

__all__ = ["Diagnosis", "Finding", "diagnose", "verdict"]

MAX_EARLIER = 5  # earlier incarnations summed up in one line each
FRAME_BYTES = 32 << 10  # of a failing rank's log, for its traceback's innermost frame alone (`verdict`)


@value
class Diagnosis:
    """The doctor's answer for one run: its newest incarnation (job id, Slurm restart) that did not
    complete. `lines` are the log lines that show the cause, from `source` (relative to the run
    folder); `others` the later reports of the other ranks (consequences, in time order)."""

    run_id: str
    finding: Finding
    summary: str
    job_id: str = ""
    restart: int | None = None
    rank: int | None = None
    host: str = ""
    time: float | None = None
    step: int | None = None
    source: str = ""
    lines: list[str] = field(default_factory=list)
    stuck_frame: str = ""  # a hang: the innermost frame of the stuck rank's main thread
    frame: str = ""  # an exception: its innermost frame ('clusterfsdp/data/samples.py:212 in index_of')
    numbers: str = ""  # numerical: the step, lr and precision (findings.Numbers)
    repeats: int = 1  # incarnations that failed with this error at this step
    others: list[str] = field(default_factory=list)
    earlier: list[str] = field(default_factory=list)  # how the incarnations before this one ended (newest last)
    next_steps: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "finding": self.finding.value, "headline": self.headline()}

    def where(self) -> str:
        """'rank 1 on node2, job 41.0, last step 3'."""
        parts = [f"rank {self.rank}" + (f" on {self.host}" if self.host else "")] if self.rank is not None else []
        if not parts and self.host:
            parts.append(self.host)
        if self.job_id:
            parts.append(f"job {self.job_id}" + (f".{self.restart}" if self.restart is not None else ""))
        if self.step is not None:
            parts.append(f"last step {self.step}")
        return ", ".join(parts)

    def headline(self) -> str:
        """The verdict in one line, the cause first ('ZeroDivisionError: float division by zero
        (rank 1 on node1, step 3)'): `status`'s state and attempt lines, `--follow`'s end line and
        the TUI's queue (cut at its width) show it."""
        who = f"rank {self.rank}" if self.rank is not None else ""
        if who and self.summary.startswith((f"{who} ", "ranks ")):
            who = ""  # the summary names the rank(s) already
        who = f"{who} on {self.host}".strip() if self.host else who
        where = ", ".join(p for p in (who, f"step {self.step}" if self.step is not None else "") if p)
        return f"{self.summary} ({where})" if where else self.summary

    def render(self, short: bool = False) -> list[str]:
        """The text `doctor` prints; `short`: the block under `status` (fewer lines)."""
        out = [f"cause      {self.finding}: {self.summary}"]
        if self.where():
            out.append(f"where      {self.where()}")
        if self.numbers:
            out.append(f"numbers    {self.numbers}")
        if self.frame and self.finding is Finding.BUG:
            out.append(f"raised in  {self.frame}")
        if self.stuck_frame:
            out.append(f"stuck in   {self.stuck_frame}")
        elif self.finding is Finding.HANG and not short:
            out.append("stuck in   (no stack dump in the run folder)")
        shown = self.lines[-3:] if short else self.lines
        if shown:
            out.append(f"log        {self.source}")
            out += [f"  | {line}" for line in shown]
        if not short:
            out += [f"then       {other}" for other in self.others]
            out += [f"earlier    {line}" for line in self.earlier]
        out += [f"next       {step}" for step in (self.next_steps[:1] if short else self.next_steps)]
        return out


# ---------------------------------------------------------------- classifying an error text
_OOM = ("out of memory", "outofmemoryerror", "cuda error: out of memory", "cudaerrormemoryallocation",
        "cublas_status_alloc_failed", "std::bad_alloc", "cannot allocate memory")  # fmt: skip
_DATA = ("dataerror", "data.paths", "data.tokenizer", "not valid json", "prepared data")
NUMERICAL_ERROR = "NumericalError"  # worker/numguard.py's exception: bad steps in a row and no way back


def finding_of(reason: str, steps_done: int | None, cause: Cause | None) -> Finding:
    """The class of one rank's recorded exception ('rank 1 on n1: OutOfMemoryError: CUDA out of memory')."""
    text = reason.lower()
    if any(word in text for word in _OOM):
        return Finding.OOM
    if NUMERICAL_ERROR.lower() in text:
        return Finding.NUMERICAL
    if any(word in text for word in _DATA):
        return Finding.DATA_ERROR
    if cause is Cause.COLLECTIVE:
        return Finding.COLLECTIVE
    return Finding.PYTHON_ERROR if steps_done else Finding.BAD_CONFIG


# ---------------------------------------------------------------- the diagnosis
_FROM_CAUSE = {
    Cause.NODE_FAILURE: Finding.NODE_FAILURE,
    Cause.PREEMPTED: Finding.PREEMPTED,
    Cause.REQUEUED_BY_SLURM: Finding.PREEMPTED,
    Cause.TIME_LIMIT: Finding.TIME_LIMIT,
    Cause.CANCELLED: Finding.CANCELLED,
    Cause.BUDGET: Finding.CANCELLED,  # stopped on purpose, with a checkpoint
    Cause.GROW: Finding.NONE,  # a node range requeued itself onto more nodes, with a checkpoint: nothing failed
}
_TIMEOUT = ("timed out", "timeout")


@value
class _Incarnation:
    job_id: str
    restart: int
    events: list[Event]
    hangs: list[Event]  # a node watchdog's records (EventKind.HANG): the ranks that stopped making progress

    def first_error(self) -> Event | None:
        """The first rank's own error (not a lost peer, not the restart budget), in time order."""
        errors = [e for e in self.events if e.event is EventKind.FAILED and e.rank >= 0 and e.cause is Cause.ERROR]
        return min(errors, key=lambda e: (e.time, e.rank), default=None)


def _incarnations(run: RunFolder, events: list[Event]) -> list[_Incarnation]:
    """Every incarnation with events or logs, in the order they started."""
    found: dict[tuple[str, int], _Incarnation] = {}
    for e in events:
        inc = found.setdefault((e.job_id, e.restart), _Incarnation(e.job_id, e.restart, [], []))
        (inc.hangs if e.event is EventKind.HANG else inc.events).append(e)
    for folder in sorted(run.logs_dir.glob("*.*"), key=lambda p: p.stat().st_mtime) if run.logs_dir.is_dir() else []:
        job_id, _, restart = folder.name.rpartition(".")
        if restart.isdigit():
            found.setdefault((job_id, int(restart)), _Incarnation(job_id, int(restart), [], []))
    return list(found.values())


def diagnose(
    run: RunFolder,
    events: list[Event] | None = None,
    live: bool = False,
    state: RunState | None = None,
    reason: str = "",
) -> Diagnosis:
    """Why the run's newest incarnation that did not complete ended; Finding.NONE when the newest
    one completed, or (`live`: the attempt still runs) when nothing has ended and no rank hung.
    `state` and `reason` are what `status` says of the run (Slurm's word on an attempt that
    never started: cancelled, and by whom)."""
    events = run.events() if events is None else events
    incarnations = _incarnations(run, events)
    if not incarnations:
        return _never_started(run, live, state, reason)
    newest = incarnations[-1]
    found = None
    if any(e.event is EventKind.COMPLETED for e in newest.events):
        found = Diagnosis(run.id, Finding.NONE, "the run completed", newest.job_id, newest.restart)
    elif live and not newest.hangs and not any(e.event.ends_attempt for e in newest.events):
        found = Diagnosis(run.id, Finding.NONE, "the attempt is running", newest.job_id, newest.restart)
    else:
        # the job step refusing to start (restarts used up) says nothing of the failure: the one before does
        while len(incarnations) > 1 and _refusal(incarnations[-1]):
            incarnations.pop()
        found = _diagnose(run, incarnations[-1], full=True, repeats=_repeats(incarnations))
    found.earlier = [_one_line(_diagnose(run, inc, full=False)) for inc in incarnations[:-1][-MAX_EARLIER:]]
    return found


# The findings a verdict adds to an incarnation's records: which rank failed first, and how. (A node
# failure, a preemption, a time limit, a cancel or a failed pre-flight is named by its record itself.)
JUDGED = {
    Finding.OOM, Finding.COLLECTIVE, Finding.HANG, Finding.DATA_ERROR, Finding.NUMERICAL, Finding.BAD_CONFIG,
    Finding.PYTHON_ERROR, Finding.BUG, Finding.RANK_KILLED,
}  # fmt: skip


def verdict(run: RunFolder, events: list[Event], job_id: str, restart: int) -> Diagnosis | None:
    """The doctor's verdict on one failed incarnation, from its records and the innermost frame of
    the failing rank's traceback (a short tail of its log): what `status` shows for it
    (`Diagnosis.headline`). None when its records name the cause themselves (`JUDGED`) or say nothing."""
    incarnations = _incarnations(run, events)
    mine = [i for i, inc in enumerate(incarnations) if (inc.job_id, inc.restart) == (job_id, restart)]
    if not mine:
        return None
    found = _diagnose(run, incarnations[mine[0]], full=False, repeats=_repeats(incarnations[: mine[0] + 1]))
    return found if found.finding in JUDGED else None


def _repeats(incarnations: list[_Incarnation]) -> int:
    """How many of these incarnations failed with the newest one's first error at the same step
    (the error and step as the restart policy compares them: outcomes.error_signature)."""
    first = incarnations[-1].first_error()
    if first is None:
        return 1
    signature = outcomes.error_signature(first)
    return sum(1 for inc in incarnations if (e := inc.first_error()) and outcomes.error_signature(e) == signature)


def _refusal(inc: _Incarnation) -> bool:
    return bool(inc.events) and all(e.rank < 0 and e.cause is Cause.RESTARTS_EXHAUSTED for e in inc.events)


def _one_line(d: Diagnosis) -> str:
    """'job 41.0: time_limit: SIGUSR2 ahead of the time limit; saved step 16' (`earlier`)."""
    text = f"job {d.job_id}.{d.restart}: {d.finding}: {d.summary}"
    return text if len(text) <= 200 else text[:197] + "..."


def _diagnose(run: RunFolder, inc: _Incarnation, full: bool, repeats: int = 1) -> Diagnosis:
    """The verdict on one incarnation and its advice; `full`: also the log lines, the stuck
    frame and a numerical finding's numbers (the doctor's view; `status` needs the verdict)."""
    base = Diagnosis(run.id, Finding.UNKNOWN, "", inc.job_id, inc.restart, repeats=repeats)
    found = _classify(run, inc, base, full)
    numbers = _numbers(run, inc, found) if full and found.finding is Finding.NUMERICAL else None
    found.numbers = numbers.describe() if numbers else ""
    context = Context(run.id, found.host, found.repeats, found.frame, str(run.path), numbers)
    found.next_steps = found.next_steps or next_steps(found.finding, context)
    return found


def _classify(run: RunFolder, inc: _Incarnation, base: Diagnosis, full: bool) -> Diagnosis:
    ranks = [e for e in inc.events if e.event is EventKind.FAILED and e.rank >= 0]
    failed = sorted((e for e in ranks if e.cause is not Cause.RESTARTS_EXHAUSTED), key=lambda e: e.time)
    exhausted = next((e for e in inc.events if e.cause is Cause.RESTARTS_EXHAUSTED), None)
    start = next((e for e in inc.events if e.event is EventKind.START), None)
    world = start.world_size if start else None
    # what Slurm did (job steps, or rank 0 after a save): a node, a preemption, the time limit
    told = [e for e in inc.events if e.cause in _FROM_CAUSE and e.event is not EventKind.FAILED]
    if inc.hangs:
        return _hang(run, inc, base, failed, world, inc.hangs, full)
    preflight = preflight_failures(failed)
    if preflight:
        return _preflight(base, preflight[0])
    if told:
        first = told[0]
        base.finding = _FROM_CAUSE[first.cause] if first.cause else Finding.UNKNOWN
        base.summary, base.time, base.step = first.reason, first.time, first.step
        base.host = ",".join(next((e.failed_nodes for e in inc.events if e.failed_nodes), []))
        return base
    if exhausted is not None and not failed:
        return _exhausted(run, base, exhausted)
    errors = [e for e in failed if e.cause is not Cause.COLLECTIVE]
    if errors:
        return _error(run, inc, base, errors[0], failed, full)
    silent = _silent_ranks(failed, world)
    if failed and silent and any(word in e.reason.lower() for e in failed for word in _TIMEOUT):
        return _hang(run, inc, base, failed, world, [], full)
    if silent:  # the rule of control.outcomes.classify_failure: a rank that never reported died
        return _killed(run, inc, base, silent, failed, full)
    if failed:
        return _error(run, inc, base, failed[0], failed, full)
    gave_up = [e for e in inc.events if e.event in (EventKind.GAVE_UP, EventKind.AUTO_RESTART)]
    if gave_up:
        base.summary, base.time = gave_up[0].reason, gave_up[0].time
        base.finding = Finding.RANK_KILLED if gave_up[0].cause is Cause.RANK_KILLED else Finding.UNKNOWN
    elif start is not None:
        base.summary = "the workers ended without a record (killed?)"
    else:
        return _submitit_only(run, base)
    return base


def _exhausted(run: RunFolder, base: Diagnosis, record: Event) -> Diagnosis:
    """Rank 0 stopped after a time limit or a preemption that saved nothing newer, with
    slurm.max_restarts used up (a loop that never advances): the interruption is the cause."""
    text = record.reason.lower()
    base.finding = (
        Finding.PREEMPTED if "preempt" in text
        else Finding.TIME_LIMIT if "time limit" in text or "sigusr2" in text
        else Finding.UNKNOWN
    )  # fmt: skip
    base.rank, base.host, base.time, base.step, base.summary = (
        record.rank,
        record.host,
        record.time,
        record.step,
        record.reason,
    )
    base.next_steps = [
        "the run stopped: it was interrupted again before it saved anything newer, and slurm.max_restarts ran out",
        f"clusterfsdp resume {run.id} --set slurm.time=MINUTES  (or a larger slurm.signal_grace_s, so a save fits)",
    ]
    return base


def _preflight(base: Diagnosis, first: Event) -> Diagnosis:
    """A node failed its pre-flight (worker.preflight): every rank raised the same line naming it."""
    base.finding, base.host, base.time = Finding.PREFLIGHT, ",".join(first.failed_nodes), first.time
    base.summary = preflight_verdict(first)
    return base


def _silent_ranks(failed: list[Event], world: int | None) -> list[int]:
    reported = {e.rank for e in failed}
    return [r for r in range(world or 0) if r not in reported]


def _others(failed: list[Event], first: Event | None) -> list[str]:
    return [f"{e.reason[:200]}" for e in failed if e is not first]


def _error(
    run: RunFolder, inc: _Incarnation, base: Diagnosis, first: Event, failed: list[Event], full: bool
) -> Diagnosis:
    """A rank that raised: the first one in time order (a Python error before the others' collective
    errors). Its traceback's innermost frame tells a clusterfsdp bug (our own code failed, not on
    purpose) from an error in the model or user code."""
    base.finding = finding_of(first.reason, first.steps_done, first.cause)
    base.rank, base.host, base.time, base.step = first.rank, first.host, first.time, first.step
    reason = re.sub(r"^rank \d+ on \S+: ", "", first.reason)
    base.summary = reason if len(reason) <= 240 else reason[:237] + "..."
    base.others = _others(failed, first)
    # the traceback is the last thing a failing rank writes: `status` reads a short tail for the frame
    log = run.log_path(inc.job_id, inc.restart, first.rank)
    lines = evidence.traceback_lines(evidence.tail_lines(log, evidence.TAIL_BYTES if full else FRAME_BYTES))
    source = evidence.relative(run, log)
    if not lines:
        lines, source = evidence.submitit_traceback(run, inc.job_id, first.rank)
    if full:
        base.lines, base.source = lines, source
    frame = evidence.Frame.innermost(lines)
    if frame is not None:
        base.frame = frame.describe()
        ours = frame.own() and (not frame.raised_on_purpose() or lines[-1].startswith("AssertionError"))
        if ours and base.finding in (Finding.PYTHON_ERROR, Finding.BAD_CONFIG):
            base.finding = Finding.BUG
    return base


def _numbers(run: RunFolder, inc: _Incarnation, d: Diagnosis) -> Numbers:
    """The step, the first bad step of the streak before it, its lr (metrics.jsonl), the
    precision (job.toml) and the newest checkpoint before the streak."""
    bad = sorted(e.step for e in inc.events if e.event is EventKind.BAD_STEP and e.step is not None)
    first = bad[-1] if bad else d.step
    while first is not None and first - 1 in bad:
        first -= 1
    lr = None
    for row in run.metrics():
        step, value = row.get("step"), row.get("lr")
        if isinstance(value, (int, float)) and isinstance(step, int) and step <= (d.step or 0):
            lr = float(value)
    try:
        job = tomllib.loads(fileio.read_text(run.job_toml, 1 << 20))  # (bounded, never a FIFO)
    except (OSError, ValueError):
        job = {}
    fsdp, model, ckpt = job.get("fsdp", {}), job.get("model", {}), job.get("checkpoint", {})
    peak = job.get("train", {}).get("lr")
    train_lr = float(peak) if isinstance(peak, (int, float)) else None
    try:
        steps = [c.step for c in ckptfolder.list_checkpoints(run.checkpoints_in(str(ckpt.get("dir", ""))))]
    except (OSError, ValueError):
        steps = []
    before = [s for s in steps if first is None or s < first]
    return Numbers(d.step, first, lr, train_lr, str(fsdp.get("mixed_precision", "")), str(model.get("dtype", "")),
                   before[-1] if before else None)  # fmt: skip


def _killed(
    run: RunFolder, inc: _Incarnation, base: Diagnosis, silent: list[int], failed: list[Event], full: bool
) -> Diagnosis:
    """Ranks that died without an exception: the first silent rank, with the signal that ended it
    when its exit status was recorded, and its last log lines (what it was doing)."""
    rank = silent[0]
    base.finding, base.rank = Finding.RANK_KILLED, rank
    base.host = _host_of(run, inc, rank)
    how = _how_it_died(run, inc, rank)
    who = f"rank {rank}" if len(silent) == 1 else f"ranks {', '.join(map(str, silent))}"
    base.summary = f"{who} died without an exception ({how or 'SIGKILL, the OOM killer, a segfault'})"
    if failed:
        base.summary += "; the other ranks then lost their peer"
    base.time = failed[0].time if failed else None
    base.step = failed[0].step if failed else None
    base.others = _others(failed, None)
    if full:
        log = run.log_path(inc.job_id, inc.restart, rank)
        base.lines = [line for line in evidence.tail_lines(log)[-3:] if line.strip()]  # what it was doing
        base.source = evidence.relative(run, log) if base.lines else ""
    return base


def _how_it_died(run: RunFolder, inc: _Incarnation, rank: int) -> str:
    """'signal 9 (SIGKILL)': the local controller's record of the rank's exit status (localctl),
    or the exit status of srun the batch script's job step recorded; '' when neither says."""
    code = evidence.local_exit_code(run, inc.job_id, inc.restart, rank)
    if code is not None and (name := evidence.signal_name(code)):
        return f"{name}: kill -9, or the OOM killer" if code == -9 else name
    srun = next((e.exit_code for e in inc.events if e.exit_code is not None), None)
    name = evidence.signal_name(srun)
    return f"srun exit status {srun}: {name}" if name else ""


def _hang(
    run: RunFolder,
    inc: _Incarnation,
    base: Diagnosis,
    failed: list[Event],
    world: int | None,
    hangs: list[Event],
    full: bool,
) -> Diagnosis:
    """A rank stopped making progress: named by a watchdog's `hang` record, else the rank that
    never reported while the others timed out in a collective; its stack from a dump, if any."""
    if hangs:
        first = hangs[0]
        rank = first.rank if first.rank >= 0 else None
        base.host, base.time, base.summary, base.step = first.host, first.time, first.reason, first.step
    else:
        silent = _silent_ranks(failed, world)
        rank = silent[0]
        base.time = failed[0].time
        base.summary = (f"rank(s) {', '.join(map(str, silent))} stopped making progress; the other ranks timed out "
                        "waiting for them in a collective")  # fmt: skip
    base.finding, base.rank = Finding.HANG, rank
    base.host = base.host or (_host_of(run, inc, rank) if rank is not None else "")
    base.others = _others(failed, None)
    if full:
        base.stuck_frame, base.lines, base.source = evidence.stack(run, f"{inc.job_id}.{inc.restart}", rank)
    return base


def _host_of(run: RunFolder, inc: _Incarnation, rank: int) -> str:
    """The host of a rank that left no event: the node record (nodes/<job>.<restart>/<host>.json,
    written by each node's first rank) whose ranks include it."""
    folder = run.nodes_dir / f"{inc.job_id}.{inc.restart}"
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            dist = fileio.loads(fileio.read_bytes(path, 64 << 10)).get("dist", {})
            first, count = int(dist["rank"]), int(dist["local_world_size"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if first <= rank < first + count:
            return path.stem
    return ""


def _never_started(run: RunFolder, live: bool, state: RunState | None, reason: str) -> Diagnosis:
    """No worker record at all: the data prepare array the job waited for failed (its own
    record names the file and line), the job was cancelled before it started, or a worker failed
    before it set up its log (then only submitit's task logs say why)."""
    last = run.record().last
    base = Diagnosis(run.id, Finding.NONE, "nothing ran yet", last.job_id if last else "")
    if last is None:
        return base
    if (run.path / "prepare.json").is_file():  # (control/prepjob.py: imported only for such a run)
        note = prepjob.note(run.path, live)
        if note and not live:  # bad input (the file and line), or a task of the array that died
            base.finding = Finding.DATA_ERROR if " failed: " in note else Finding.CANCELLED
            base.summary, base.next_steps = note, next_steps(base.finding, Context(run.id))
            return base
    if (run.path / "reference.json").is_file():  # (control/refjob.py: imported only for such a run)
        note = refjob.note(run.path, live)
        if note and not live:  # the reference pass failed: its rank 0's error, if it had one
            base.finding = Finding.BAD_CONFIG if " FAILED" in note else Finding.CANCELLED
            base.summary, base.next_steps = note, next_steps(base.finding, Context(run.id))
            return base
    if state is RunState.CANCELLED or (not live and last.cancelled is not None):
        base.finding = Finding.CANCELLED
        base.summary = reason or "cancelled before it started (clusterfsdp cancel)"
        base.next_steps = next_steps(Finding.CANCELLED, Context(run.id))
        return base
    found = _submitit_only(run, base)
    found.next_steps = next_steps(found.finding, Context(run.id))
    return found


def _submitit_only(run: RunFolder, base: Diagnosis) -> Diagnosis:
    """A worker that failed before it set up its log (an import error, a container that did not
    start) leaves only submitit's task logs."""
    last = run.record().last
    if last is None:
        return base
    base.job_id = base.job_id or last.job_id
    lines, source = evidence.submitit_traceback(run, last.job_id, 0)
    if lines:
        base.finding, base.lines, base.source, base.rank = Finding.BAD_CONFIG, lines, source, 0
        base.summary = f"the workers failed before they started: {lines[-1]}"
    return base
