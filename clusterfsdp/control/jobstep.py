"""The control plane's steps in a Slurm attempt's batch script (submitit's), around its `srun`
line (launch.job_steps: the last `setup` line and the `teardown`):

    python -m clusterfsdp.control.jobstep before RUN_DIR      # then srun ... submitit.core._submit
    python -m clusterfsdp.control.jobstep after RUN_DIR RC    # RC: srun's exit status

and rank 0's one call into the run service, across a process boundary (the worker stands below
the service: it never imports it):

    python -m clusterfsdp.control.jobstep come-back RUN_DIR JOB_ID RESTART CAUSE requeue|follow-up

They run on the batch host, where a failed attempt is still alive to speak for itself (the
worker's ranks cannot: the failed one is dead, and the others may be too):

- `before` records what Slurm did to the previous incarnation of this job when it left no
  record (Slurm requeued it: a preemption after GraceTime, a failed batch host, an admin) and
  refuses to start when the run used up slurm.max_restarts; for the script of `submit --dry-run`
  submitted by hand, it puts the pickled call where submitit's `_submit` looks for it;
- `after` classifies a failed attempt (control.outcomes: a node Slurm declared down, a rank
  that died, a collective that lost its peer, or a Python error) and, for the infrastructure
  causes, submits the next attempt through the run service: after this job ends, without the
  failed nodes, and on fewer nodes (with the same global batch) when the partition has too few
  healthy ones left. A deterministic failure is recorded and not retried.

The batch script has `--no-kill`, so a failed node shrinks the allocation instead of ending the
job, and this step still runs (docs/recovery.md says who acts in each case). Nothing here
imports torch.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from ..core import ckptfolder, outcomes, retrynotes, runfolder, slurmcli
from ..core import spec as specmod
from ..core.errors import UserError
from ..core.records import Cause, Event, EventKind, RunState
from ..core.value import value
from . import cost, launch, noderecord
from .run import Run, RunError

JOBSTEP_RANK = -1  # the `rank` of events this step writes: not a worker rank
ACCOUNTING_WAIT_S = 60.0  # how long a requeued job's step waits for sacct to record the previous end
ACCOUNTING_POLL_S = 2.0
# how an incarnation Slurm requeued ends: live as the job's state (RunState.live), that incarnation over
REQUEUES = frozenset({RunState.REQUEUED, RunState.REQUEUE_HOLD, RunState.REQUEUE_FED})


@value(frozen=True)
class SlurmJob:
    """This batch job, as its environment tells."""

    job_id: str
    restart: int
    nodelist: str

    @classmethod
    def from_environ(cls) -> SlurmJob:
        return cls(
            slurmcli.batch_job_id(os.environ),
            int(os.environ.get("SLURM_RESTART_COUNT") or 0),
            os.environ.get("SLURM_JOB_NODELIST", ""),
        )


def _event(run: runfolder.RunFolder, job: SlurmJob, kind: EventKind, restart: int | None = None, **fields) -> Event:
    event = Event(kind, job.job_id, job.restart if restart is None else restart, JOBSTEP_RANK, socket.gethostname(),
                  time.time(), **fields)  # fmt: skip
    run.append_event(event)
    print(f"clusterfsdp jobstep: {kind}: {fields.get('reason', '')}", flush=True)
    return event


def before(run: runfolder.RunFolder, job: SlurmJob) -> int:
    """0: start the workers; 1: do not (slurm.max_restarts used up)."""
    record = run.record()
    if record.dry_run and record.attempt(job.job_id) is None:
        launch.write_call(run, job.job_id)  # submitted by hand: no executor pickled the call
    if job.restart > 0:
        previous = [e for e in run.events(job.job_id) if e.restart == job.restart - 1]
        if not any(e.event.ends_attempt for e in previous):
            cause, reason = _requeued_by_slurm(job)
            newest = ckptfolder.find(run.checkpoints_dir())
            _event(run, job, EventKind.SLURM_REQUEUED, job.restart - 1, cause=cause, reason=reason,
                   step=newest.step if newest else 0)  # fmt: skip
    spec = run.spec()
    used = outcomes.restarts_used(run.events())
    if used > spec.slurm.max_restarts:
        reason = (f"{used} restarts used (slurm.max_restarts = {spec.slurm.max_restarts}): not starting again; "
                  "`clusterfsdp resume` continues from the newest checkpoint")  # fmt: skip
        _event(run, job, EventKind.GAVE_UP, cause=Cause.RESTARTS_EXHAUSTED, reason=reason)
        return 1
    if spec.slurm.max_gpu_hours > 0:  # the workers' budget clock (budget.Budget)
        try:
            gpus = spec.node_range.high * spec.slurm.gpus_per_node  # (a range: its largest)
            plan_s = gpus * spec.time_minutes * 60.0
            nodes_now = slurmcli.allocation_nodes()  # (this allocation's; None outside one)
            hint = nodes_now * spec.slurm.gpus_per_node if nodes_now else gpus
            budget = cost.write_budget(run, job.job_id, spec.slurm.max_gpu_hours, time.time(), plan_s, hint)
        except (OSError, slurmcli.SlurmError) as e:
            print(f"clusterfsdp jobstep: slurm.max_gpu_hours not enforced in this attempt: {e}", file=sys.stderr)
        else:
            if budget.left_s <= 0:
                _event(run, job, EventKind.GAVE_UP, cause=Cause.BUDGET, reason=budget.reason())
                return 1
    return 0


def _ended(state: str) -> bool:
    """Whether sacct's row of an earlier incarnation records its end: a state that is not live
    (the one list, `RunState.live`), or one of Slurm's requeues; no row yet is no end."""
    parsed = RunState.parse(state)
    return bool(state) and (not parsed.live or parsed in REQUEUES)


def _requeued_by_slurm(job: SlurmJob, wait_s: float | None = None) -> tuple[Cause, str]:
    """Why Slurm requeued the previous incarnation: its row in `sacct --duplicates`. slurmdbd may
    record that incarnation's end after the next one has started (seen on a loaded devcluster: no
    row at all, and a node failure was reported as a plain requeue), so this waits up to
    `ACCOUNTING_WAIT_S` for a row that has ended, then says what it has."""
    deadline = time.monotonic() + (ACCOUNTING_WAIT_S if wait_s is None else wait_s)
    while True:
        try:  # (slurmcli retries a failing query; one that still fails is not waited for again)
            out = slurmcli.run(["sacct", "-n", "-X", "-P", "-D", "-j", job.job_id, "-o", "State,NodeList"])
        except slurmcli.SlurmError as e:
            return Cause.REQUEUED_BY_SLURM, f"requeued by Slurm before the workers recorded anything (sacct: {e})"
        rows = [line.split("|") for line in out.splitlines() if "|" in line]
        state, nodes = rows[job.restart - 1][:2] if len(rows) >= job.restart else ("", "")
        if _ended(state) or time.monotonic() >= deadline:
            break
        time.sleep(ACCOUNTING_POLL_S)
    if state.startswith("NODE_FAIL"):
        return Cause.NODE_FAILURE, f"a node of {nodes} failed; Slurm requeued the job"
    if state.startswith("PREEMPTED"):
        return Cause.PREEMPTED, "preempted; Slurm requeued the job before the workers saved (GraceTime too short?)"
    return Cause.REQUEUED_BY_SLURM, f"requeued by Slurm ({state or 'state unknown'}) before the workers recorded it"


def after(run: runfolder.RunFolder, job: SlurmJob, rc: int) -> int:
    """Classify a failed attempt and submit the next one when it is worth it; returns `rc`."""
    if rc == 0:
        return rc
    mine = [e for e in run.events(job.job_id) if e.restart == job.restart]
    handled = any(
        (e.event.ends_attempt and e.event is not EventKind.FAILED) or e.cause is Cause.RESTARTS_EXHAUSTED for e in mine
    )
    last = run.record().last
    if handled or last is None or last.job_id != job.job_id or last.cancelled is not None:
        return rc  # the workers decided (requeue, stop), or this is no longer the run's attempt
    failure = _classify(run, job, mine, rc)
    spec = run.spec()
    _quarantine(run, spec, failure)
    if failure.cause.interruption:
        _come_back(run, job, spec, failure)
        return rc
    if not failure.cause.retryable:
        _event(run, job, EventKind.GAVE_UP, cause=failure.cause, reason=f"{failure.detail}; not retried",
               signature=failure.signature, exit_code=rc)  # fmt: skip
        return rc
    used = outcomes.restarts_used(run.events())
    if used >= spec.slurm.max_restarts:
        reason = f"{failure.detail}; {used} restarts used (slurm.max_restarts = {spec.slurm.max_restarts})"
        _event(run, job, EventKind.GAVE_UP, cause=Cause.RESTARTS_EXHAUSTED, reason=reason,
               signature=failure.signature, failed_nodes=list(failure.failed_nodes), exit_code=rc)  # fmt: skip
        return rc
    exclude = tuple(sorted(set(last.exclude) | set(failure.failed_nodes)))
    plan = _fewer_nodes(spec, exclude) if failure.failed_nodes else None
    reason = f"automatic restart after {failure.cause}: {failure.detail}"
    if exclude:
        reason += f"; without {','.join(exclude)}"
    if plan is not None:
        reason += f"; on {plan.nodes} node(s) with train.grad_accum = {plan.grad_accum} (same global batch)"
    try:
        sub = Run(run).follow_up(spec, reason, job.job_id, cause=failure.cause, exclude=exclude,
                                 overrides=plan.overrides() if plan else ())  # fmt: skip
    except (launch.SubmitError, RunError, specmod.SpecError) as e:
        _event(run, job, EventKind.GAVE_UP, cause=failure.cause, reason=f"{failure.detail}; the restart failed: {e}",
               signature=failure.signature, exit_code=rc)  # fmt: skip
        return rc
    _event(run, job, EventKind.AUTO_RESTART, cause=failure.cause, reason=reason, job_id_next=sub.job_id,
           signature=failure.signature, failed_nodes=list(failure.failed_nodes), restarts=used + 1,
           exit_code=rc)  # fmt: skip
    return rc


def _quarantine(run: runfolder.RunFolder, spec: specmod.JobSpec, failure: outcomes.Failure) -> None:
    """Record the nodes this failure names (pre-flight, hang, node failure) in the cluster's node
    record, so later submits of every user leave them out (noderecord). A record that cannot be
    written is said in the batch log; it never stops the restart."""
    if not failure.failed_nodes or spec.slurm.quarantine_hours <= 0:
        return
    try:
        path = noderecord.for_job(spec, slurmcli.cluster_name())
        noderecord.mark(path, failure.failed_nodes, reason=failure.detail, cause=str(failure.cause), run=run.id)
    except (OSError, UserError) as e:
        print(f"clusterfsdp: node record not written: {e}", file=sys.stderr)


def _come_back(run: runfolder.RunFolder, job: SlurmJob, spec: specmod.JobSpec, failure: outcomes.Failure) -> None:
    """A rank died of the stop signal before it could catch it: what its rank 0 would have done
    after a save (worker.main), from the newest checkpoint. Requeued, with a `requeued` event that
    uses a restart of slurm.max_restarts only when the incarnation got no further than it started
    (outcomes.restarts_used); a follow-up job where Slurm refuses the requeue."""
    try:
        info = slurmcli.show_job(job.job_id)
    except slurmcli.SlurmError:
        info = None
    verdict = outcomes.classify_stop("SIGUSR2", info, job.restart, cancel_asked=False)
    newest = ckptfolder.find(run.checkpoints_dir(spec))
    step = newest.step if newest else 0
    cost = outcomes.charge(run.events(), job.job_id, job.restart, step)
    reason = f"{failure.detail}; {verdict.reason}; back from step {step}"
    if cost.exhausted(spec.slurm.max_restarts):
        limit = spec.slurm.max_restarts
        reason += f": no progress, {cost.used} restarts used (slurm.max_restarts = {limit})"
        _event(run, job, EventKind.GAVE_UP, cause=Cause.RESTARTS_EXHAUSTED, step=step, reason=reason)
        return
    _event(run, job, EventKind.REQUEUED, cause=verdict.cause, step=step, checkpoint=str(newest.path) if newest else "",
           reason=reason, restarts=cost.after())  # fmt: skip
    followed = Run(run).come_back(spec, job.job_id, job.restart, verdict.cause)
    if followed is not None:
        sub, why = followed
        _event(run, job, EventKind.FOLLOW_UP, job_id_next=sub.job_id, reason=why, cause=verdict.cause)


def _classify(run: runfolder.RunFolder, job: SlurmJob, mine: list[Event], rc: int) -> outcomes.Failure:
    hosts = slurmcli.hostnames(job.nodelist) if job.nodelist else []
    states = slurmcli.node_states(hosts)
    down = [h for h in hosts if not slurmcli.usable(states.get(h, ""))]
    start = next((e for e in mine if e.event is EventKind.START), None)
    previous = [e for e in run.events() if e.event in (EventKind.AUTO_RESTART, EventKind.GAVE_UP) and e.signature]
    return outcomes.classify_failure(
        mine,
        world_size=start.world_size if start else None,
        down_nodes=down,
        srun_rc=rc,
        previous_signature=previous[-1].signature if previous else "",
    )


def _fewer_nodes(spec: specmod.JobSpec, exclude: tuple[str, ...]) -> outcomes.NodePlan | None:
    """Fewer nodes when the partition lacks healthy ones (outcomes.plan_nodes); a node range
    keeps its range while the healthy nodes can hold its least size."""
    nodes = slurmcli.partition_nodes(spec.slurm.partition)
    healthy = sum(1 for name, state in nodes.items() if name not in exclude and slurmcli.usable(state))
    if healthy >= spec.node_range.low:
        return None
    return outcomes.plan_nodes(spec.node_range.high, spec.train.grad_accum, healthy)


def come_back(run: runfolder.RunFolder, job_id: str, restart: int, cause: Cause, *, requeue: bool) -> int:
    """Rank 0 of an interrupted Slurm job brings it back (Run.come_back: requeued, or a follow-up
    job); prints `{"job_id_next": ..., "why": ...}` for a follow-up, nothing for a requeue. A
    controller that does not answer: its error on stderr, exit status 1."""
    try:
        followed = Run(run).come_back(specmod.load(run.job_toml), job_id, restart, cause, requeue=requeue)
    except (UserError, slurmcli.SlurmError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if followed is not None:
        sub, why = followed
        print(json.dumps({"job_id_next": sub.job_id, "why": why}), flush=True)
    return 0


USAGE = (
    "usage: python -m clusterfsdp.control.jobstep before RUN_DIR | after RUN_DIR RC\n"
    "       | come-back RUN_DIR JOB_ID RESTART CAUSE requeue|follow-up"
)


def main(argv: list[str]) -> int:
    if argv[:1] == ["come-back"] and len(argv) == 6 and argv[5] in ("requeue", "follow-up"):
        run = runfolder.RunFolder(Path(argv[1]))
        return come_back(run, argv[2], int(argv[3]), Cause(argv[4]), requeue=argv[5] == "requeue")
    if len(argv) < 2 or argv[0] not in ("before", "after") or (argv[0] == "after" and len(argv) != 3):
        print(USAGE, file=sys.stderr)
        return 2
    run, job = runfolder.RunFolder(Path(argv[1])), SlurmJob.from_environ()
    retrynotes.report_retries(retrynotes.say_on_stderr)
    if argv[0] == "before":
        return before(run, job)
    rc = int(argv[2])
    try:
        return after(run, job, rc)
    except Exception as e:  # the job's last words: never a traceback instead of its exit status
        print(f"clusterfsdp jobstep: could not handle the failure: {type(e).__name__}: {e}", file=sys.stderr)
        return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
