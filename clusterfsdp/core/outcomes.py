"""How an attempt ended, classified (docs/recovery.md). Pure functions over the run folder's
events and what Slurm says, shared by the worker (a SIGTERM: preemption or cancel?) and the
batch script's job steps (`control.jobstep`: a failed attempt: retry it, where, on how many
nodes?). Nothing here runs a command, so every rule is unit-tested with Slurm's real output.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable
from enum import StrEnum

from .records import Cause, Event, EventKind, preflight_failures, preflight_verdict
from .slurmcli import JobInfo
from .value import value


# ---------------------------------------------------------------- a stop signal
class StopAction(StrEnum):
    """What the ranks do after the collective save a stop signal triggered."""

    STOP = "stop"  # a cancel: stop; `clusterfsdp resume` continues
    REQUEUE = "requeue"  # time limit, or preempted within GraceTime: `scontrol requeue` (else a follow-up job)
    FOLLOW_UP = "follow_up"  # the job is already ending (PreemptMode=CANCEL, time limit): a new job takes over
    EXIT = "exit"  # Slurm already requeued the job: exit, the next incarnation resumes


@value(frozen=True)
class StopVerdict:
    action: StopAction
    cause: Cause
    reason: str


def classify_stop(signal_name: str, job: JobInfo | None, restart: int, cancel_asked: bool) -> StopVerdict:
    """Why the ranks were told to stop (`signal_name` SIGUSR2 or SIGTERM), from the job as
    `scontrol -o show job` gives it right after the save (None: Slurm could not say), this
    incarnation's restart count, and whether `clusterfsdp cancel` asked (state.json).

    SIGTERM is what a cancel and a preemption both send (docs/recovery.md, verified on the
    devcluster): within GraceTime a preempted job is still RUNNING with a PreemptTime; after
    GraceTime, PreemptMode=REQUEUE has already requeued it (its restart count went up) and
    PreemptMode=CANCEL leaves it COMPLETING with a PreemptTime; a plain scancel shows neither."""
    if cancel_asked:
        return StopVerdict(StopAction.STOP, Cause.CANCELLED, "cancelled (clusterfsdp cancel)")
    if signal_name == "SIGUSR2":
        if job is not None and job.preempt_time:
            return StopVerdict(StopAction.REQUEUE, Cause.PREEMPTED, f"preempted at {job.preempt_time} (SIGUSR2)")
        return StopVerdict(StopAction.REQUEUE, Cause.TIME_LIMIT, "SIGUSR2 ahead of the time limit")
    if job is None:
        return StopVerdict(
            StopAction.STOP, Cause.CANCELLED, "SIGTERM, and Slurm could not say why: stopped as for a cancel"
        )
    if job.restarts > restart:
        return StopVerdict(
            StopAction.EXIT, Cause.REQUEUED_BY_SLURM, "Slurm requeued the job (preemption after GraceTime, or an admin)"
        )
    if job.preempt_time:
        if job.state in ("COMPLETING", "PREEMPTED"):
            return StopVerdict(
                StopAction.FOLLOW_UP, Cause.PREEMPTED, f"preempted at {job.preempt_time} (PreemptMode=CANCEL)"
            )
        return StopVerdict(StopAction.REQUEUE, Cause.PREEMPTED, f"preempted at {job.preempt_time} (SIGTERM)")
    if job.reason == "TimeLimit":
        return StopVerdict(
            StopAction.FOLLOW_UP, Cause.TIME_LIMIT, "the time limit came before SIGUSR2 (raise slurm.signal_grace_s)"
        )
    return StopVerdict(StopAction.STOP, Cause.CANCELLED, "cancelled (scancel)")


# ---------------------------------------------------------------- the restart budget
_INTERRUPTIONS = (EventKind.REQUEUED, EventKind.SLURM_REQUEUED)
# srun's exit status when a task died of SIGUSR2 (128 + 12 = 140 on Linux): the time-limit (or
# preemption) signal reached a rank before it had installed its handler (a slow start-up).
SIGUSR2_EXIT = 128 + signal.SIGUSR2


def resumed_step(events: Iterable[Event], job_id: str, restart: int) -> int:
    """The step an incarnation (job id, restart) started from: its `resumed` event; 0 without one."""
    steps = [e.step or 0 for e in events if e.event is EventKind.RESUMED and (e.job_id, e.restart) == (job_id, restart)]
    return steps[-1] if steps else 0


def restarts_used(events: Iterable[Event]) -> int:
    """Restarts that count against slurm.max_restarts over the whole run: every automatic
    restart after a failure, and every interruption (time limit, preemption) of an incarnation
    that did not get past the checkpoint it started from. An interrupted incarnation that saved
    newer progress costs nothing, so a week-long run lives through any number of preemptions,
    while a loop that never advances still ends."""
    used = 0
    started: dict[tuple[str, int], int] = {}
    for e in events:
        key = (e.job_id, e.restart)
        if e.event is EventKind.RESUMED:
            started[key] = e.step or 0
        elif e.event is EventKind.AUTO_RESTART or (e.event in _INTERRUPTIONS and (e.step or 0) <= started.get(key, 0)):
            used += 1
    return used


@value(frozen=True)
class Charge:
    """What bringing an interrupted incarnation back costs: restarts used so far, and whether it
    got past the step it resumed from (then it costs nothing, see restarts_used)."""

    used: int
    progressed: bool

    def exhausted(self, max_restarts: int) -> bool:
        """No progress and no restart left: the run ends instead of coming back."""
        return not self.progressed and self.used >= max_restarts

    def after(self) -> int:
        """Restarts used once this comeback is counted."""
        return self.used + (not self.progressed)


def charge(events: list[Event], job_id: str, restart: int, step: int) -> Charge:
    """The cost of bringing back incarnation (job_id, restart), interrupted with `step` saved."""
    return Charge(restarts_used(events), step > resumed_step(events, job_id, restart))


# ---------------------------------------------------------------- a failed attempt
@value(frozen=True)
class Failure:
    """A failed incarnation, classified. `signature` (the error and the step it happened at)
    tells a deterministic error that happens again at the same step from a transient one."""

    cause: Cause
    detail: str
    signature: str = ""
    failed_nodes: tuple[str, ...] = ()


_RANK_PREFIX = r"^rank \d+ on \S+: "


def error_signature(event: Event) -> str:
    """'<exception>: <message head> @ step N' of a failed event (without the rank and host)."""
    text = re.sub(_RANK_PREFIX, "", event.reason)[:160]
    return f"{text} @ step {event.step if event.step is not None else '-'}"


def classify_failure(
    events: list[Event],
    *,
    world_size: int | None,
    down_nodes: Iterable[str],
    srun_rc: int,
    previous_signature: str = "",
) -> Failure:
    """Why one incarnation failed, from its own events (those of its job id and restart), the
    nodes of its allocation that Slurm declares unusable, and srun's exit status.

    In this order: a node Slurm took down; a node that failed its pre-flight checks (every rank
    raised `PreflightFailed` naming it: retried without it, like a failed node); a Python error on
    some rank (the other ranks' collective errors are its consequence): before the first optimizer
    step of the incarnation it is deterministic (a bad config, a missing file), after it it is
    retried once, unless it is the same error at the same step as the failure before; a hang a
    node watchdog recorded (it killed the ranks after dumping their stacks, so they record nothing
    themselves; the nodes the evidence points at are left out); ranks that died without recording
    an exception (SIGKILL, the OOM killer, a segfault, NCCL's watchdog abort), except a rank that
    SIGUSR2 killed (srun exit status SIGUSR2_EXIT): a time-limit stop, the job comes back as after
    a save (`Cause.interruption`); collective errors alone (a timeout, a lost peer)."""
    down = tuple(sorted(set(down_nodes)))
    if down:
        return Failure(Cause.NODE_FAILURE, f"Slurm declared {', '.join(down)} down", failed_nodes=down)
    failed = [e for e in events if e.event is EventKind.FAILED]
    preflight = preflight_failures(failed)
    if preflight:
        nodes = tuple(sorted({node for e in preflight for node in e.failed_nodes}))
        return Failure(Cause.PREFLIGHT, preflight_verdict(preflight[0]), failed_nodes=nodes)
    errors = sorted((e for e in failed if e.cause is Cause.ERROR), key=lambda e: (e.time, e.rank))
    if errors:
        first = errors[0]
        signature = error_signature(first)
        if not first.steps_done:
            return Failure(Cause.ERROR_BEFORE_FIRST_STEP, f"{first.reason} (before the first step)", signature)
        if signature == previous_signature:
            return Failure(Cause.REPEATED_ERROR, f"{first.reason} (again at step {first.step})", signature)
        return Failure(Cause.ERROR, first.reason, signature)
    hang = next((e for e in events if e.event is EventKind.HANG), None)
    if hang is not None:
        return Failure(Cause.HANG, hang.reason, failed_nodes=tuple(sorted(set(hang.failed_nodes))))
    if srun_rc == SIGUSR2_EXIT:
        return Failure(
            Cause.TIME_LIMIT,
            f"SIGUSR2 (the time-limit or preemption signal) killed a rank before it could catch it (srun exit "
            f"status {srun_rc})",
        )
    started = any(e.event is EventKind.START for e in events)
    if not started and not failed and 0 < srun_rc < 128:
        return Failure(
            Cause.ERROR_BEFORE_FIRST_STEP,
            f"the workers exited with status {srun_rc} before they started (see submitit/*_log.err)",
        )
    reported = {e.rank for e in failed}
    missing = [r for r in range(world_size or 0) if r not in reported]
    if missing or not failed:
        who = f"rank(s) {_ranges(missing)}" if missing else "the workers"
        return Failure(
            Cause.RANK_KILLED,
            f"{who} died without an exception (SIGKILL, the OOM killer or a crash; srun exit status {srun_rc})",
        )
    return Failure(Cause.COLLECTIVE, sorted(failed, key=lambda e: e.time)[0].reason)


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out: list[str] = []
    for r in ranks:
        if out and r == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ",".join(out)


# ---------------------------------------------------------------- fewer nodes
@value(frozen=True)
class NodePlan:
    nodes: int
    grad_accum: int

    def overrides(self) -> tuple[str, ...]:
        return (f"slurm.nodes={self.nodes}", f"train.grad_accum={self.grad_accum}")


def plan_nodes(nodes: int, grad_accum: int, usable: int) -> NodePlan | None:
    """The node count for a restart when the partition has only `usable` healthy nodes left
    (None: keep `nodes` and wait for them). Fewer nodes only with the same global batch
    (nodes x grad_accum unchanged, so the loss curve and the learning-rate schedule go on as
    before): the largest count <= usable that divides nodes x grad_accum."""
    if usable >= nodes or usable < 1:
        return None
    total = nodes * grad_accum
    fits = next(n for n in range(usable, 0, -1) if total % n == 0)
    return NodePlan(fits, total // fits)
