"""How an attempt ended, classified (core/outcomes.py), and how often the ranks agree on a stop
signal (worker/stopflags.py): pure rules, checked against `scontrol -o show job` lines captured on
the devcluster (tests/golden/scontrol/: Slurm 22.05, PreemptMode=REQUEUE and CANCEL, GraceTime=30)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterfsdp.core import outcomes, records
from clusterfsdp.core.outcomes import StopAction
from clusterfsdp.core.records import Cause, Event, EventKind, RunState
from clusterfsdp.core.slurmcli import JobInfo
from clusterfsdp.worker import stopflags

GOLDEN = Path(__file__).parent / "golden" / "scontrol"


def job(name: str) -> JobInfo:
    return JobInfo.parse((GOLDEN / f"{name}.txt").read_text().strip())


def test_scontrol_lines_parse() -> None:
    grace = job("preempted_in_grace")
    assert (grace.state, grace.restarts, grace.preempt_time, grace.requeue) == (
        "RUNNING", 0, "2026-11-23T18:02:38", True,
    )  # fmt: skip
    gone = job("preempted_requeued_by_slurm")  # Slurm hides PreemptTime once the base state is PENDING
    assert (gone.state, gone.restarts, gone.preempt_time) == ("COMPLETING", 1, "")


@pytest.mark.parametrize(
    "name,restart,action,cause",
    [
        ("preempted_in_grace", 0, StopAction.REQUEUE, Cause.PREEMPTED),
        ("preempted_requeued_by_slurm", 0, StopAction.EXIT, Cause.REQUEUED_BY_SLURM),
        ("preempted_cancel_mode_after_grace", 0, StopAction.FOLLOW_UP, Cause.PREEMPTED),
        ("scancel", 0, StopAction.STOP, Cause.CANCELLED),
        # the second incarnation of a requeued job, cancelled: Restarts=1 is its own baseline
        ("scancel_after_a_requeue", 1, StopAction.STOP, Cause.CANCELLED),
    ],
)
def test_sigterm_preemption_or_cancel(name: str, restart: int, action: StopAction, cause: Cause) -> None:
    verdict = outcomes.classify_stop("SIGTERM", job(name), restart, cancel_asked=False)
    assert (verdict.action, verdict.cause) == (action, cause), verdict


def test_clusterfsdp_cancel_wins_and_an_unanswered_controller_means_stop() -> None:
    grace = job("preempted_in_grace")
    assert outcomes.classify_stop("SIGTERM", grace, 0, cancel_asked=True).action is StopAction.STOP
    unknown = outcomes.classify_stop("SIGTERM", None, 0, cancel_asked=False)
    assert unknown.action is StopAction.STOP and "could not say" in unknown.reason


def test_sigusr2_is_a_time_limit_unless_slurm_preempted_the_job() -> None:
    scancel = job("scancel")
    assert outcomes.classify_stop("SIGUSR2", scancel, 0, False).cause is Cause.TIME_LIMIT
    assert outcomes.classify_stop("SIGUSR2", job("preempted_in_grace"), 0, False).cause is Cause.PREEMPTED


def ev(kind: EventKind, job_id: str = "1", restart: int = 0, rank: int = 0, **fields) -> Event:
    return Event(kind, job_id, restart, rank, "node1", fields.pop("time", 0.0), **fields)


def test_interruptions_with_progress_cost_no_restart() -> None:
    events = [
        ev(EventKind.START),
        ev(EventKind.REQUEUED, step=100, cause=Cause.PREEMPTED),  # from scratch to 100: progress
        ev(EventKind.RESUMED, restart=1, step=100),
        ev(EventKind.REQUEUED, restart=1, step=100, cause=Cause.TIME_LIMIT),  # no progress: counts
        ev(EventKind.RESUMED, restart=2, step=100),
        ev(EventKind.SLURM_REQUEUED, restart=2, step=150, cause=Cause.NODE_FAILURE),  # progress
        ev(EventKind.START, job_id="2"),
        ev(EventKind.AUTO_RESTART, job_id="2", cause=Cause.RANK_KILLED),  # failures always count
    ]
    assert outcomes.restarts_used(events) == 2
    assert outcomes.restarts_used([ev(EventKind.REQUEUED, step=0)]) == 1  # a save at step 0 of a fresh run


def test_the_charge_of_a_comeback_is_what_the_worker_and_the_job_step_both_decide_on() -> None:
    events = [ev(EventKind.START), ev(EventKind.REQUEUED, step=0), ev(EventKind.RESUMED, restart=1, step=40)]
    ahead = outcomes.charge(events, "1", 1, 60)  # incarnation 1 resumed at 40 and saved 60: free
    assert (ahead.used, ahead.progressed, ahead.after(), ahead.exhausted(1)) == (1, True, 1, False)
    stuck = outcomes.charge(events, "1", 1, 40)  # saved where it resumed: one more restart
    assert (stuck.progressed, stuck.after(), stuck.exhausted(2), stuck.exhausted(1)) == (False, 2, False, True)


def failed(rank: int, reason: str, cause: Cause, step: int | None, done: int, time: float = 1.0) -> Event:
    return ev(EventKind.FAILED, rank=rank, reason=f"rank {rank} on node1: {reason}", cause=cause, step=step,
              steps_done=done, time=time)  # fmt: skip


PEER = "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.213.0.11]:13546"


def classify(events: list[Event], **kw) -> outcomes.Failure:
    return outcomes.classify_failure(
        [ev(EventKind.START), *events], world_size=kw.pop("world_size", 2), down_nodes=kw.pop("down", ()),
        srun_rc=kw.pop("rc", 1), **kw,
    )  # fmt: skip


def test_a_python_error_weighs_more_than_its_peers_collective_errors() -> None:
    events = [
        failed(0, PEER, Cause.COLLECTIVE, 12, 12, time=2.0),
        failed(1, "ValueError: bad batch", Cause.ERROR, 12, 12),
    ]
    first = classify(events)
    assert first.cause is Cause.ERROR and first.cause.retryable and first.signature == "ValueError: bad batch @ step 12"
    again = classify(events, previous_signature=first.signature)
    assert again.cause is Cause.REPEATED_ERROR and not again.cause.retryable
    elsewhere = classify([failed(1, "ValueError: bad batch", Cause.ERROR, 30, 30)], previous_signature=first.signature)
    assert elsewhere.cause is Cause.ERROR  # the same error at another step: retried once more


def test_deterministic_failures_are_not_retried() -> None:
    missing = classify([failed(0, "FileNotFoundError: /data/x.jsonl", Cause.ERROR, 0, 0)])
    assert missing.cause is Cause.ERROR_BEFORE_FIRST_STEP and not missing.cause.retryable
    never_started = outcomes.classify_failure([], world_size=None, down_nodes=(), srun_rc=1)
    assert never_started.cause is Cause.ERROR_BEFORE_FIRST_STEP and "status 1" in never_started.detail


def test_infrastructure_failures() -> None:
    killed = classify([failed(0, PEER, Cause.COLLECTIVE, 50, 50)], rc=137)
    assert killed.cause is Cause.RANK_KILLED and "rank(s) 1 died" in killed.detail and killed.cause.retryable
    silent = classify([], world_size=4, rc=137)  # srun killed every rank at once
    assert silent.cause is Cause.RANK_KILLED and "0-3" in silent.detail
    node = classify([failed(0, PEER, Cause.COLLECTIVE, 50, 50)], down=["node2"])
    assert node.cause is Cause.NODE_FAILURE and node.failed_nodes == ("node2",)
    timeout = classify([failed(r, "DistBackendError: Timed out", Cause.COLLECTIVE, 9, 9) for r in (0, 1)])
    assert timeout.cause is Cause.COLLECTIVE and timeout.cause.retryable


def test_a_rank_killed_by_the_time_limit_signal_is_a_time_limit_stop() -> None:
    """srun exit status 140 (128 + SIGUSR2): the signal reached a rank before it had installed its
    handler (a slow start-up under load). Not a crash to retry as a new job: the job step brings
    the job back as rank 0 would have after a save (Cause.interruption: requeued)."""
    assert outcomes.SIGUSR2_EXIT == 140
    peers = classify([failed(0, PEER, Cause.COLLECTIVE, 7, 7)], world_size=4, rc=140)  # the others lost it
    assert peers.cause is Cause.TIME_LIMIT and peers.cause.interruption and not peers.cause.retryable
    assert "SIGUSR2" in peers.detail and "140" in peers.detail
    before_start = outcomes.classify_failure([], world_size=None, down_nodes=(), srun_rc=140)
    assert before_start.cause is Cause.TIME_LIMIT  # not a deterministic error before the first step
    assert classify([], world_size=4, rc=137).cause is Cause.RANK_KILLED  # SIGKILL stays a killed rank
    error = classify([failed(1, "ValueError: bad batch", Cause.ERROR, 12, 12)], rc=140)
    assert error.cause is Cause.ERROR  # a recorded Python error still weighs more
    assert classify([], down=["node2"], rc=140).cause is Cause.NODE_FAILURE


def test_resumed_step_is_the_incarnations_own() -> None:
    events = [ev(EventKind.RESUMED, step=40), ev(EventKind.RESUMED, restart=1, step=90), ev(EventKind.START, "2")]
    assert [outcomes.resumed_step(events, j, r) for j, r in (("1", 0), ("1", 1), ("2", 0))] == [40, 90, 0]


@pytest.mark.parametrize(
    "nodes,accum,usable,expected",
    [
        (2, 1, 1, (1, 2)),  # HSDP on 2 nodes -> 1 node, twice the accumulation: the same global batch
        (4, 1, 3, (2, 2)),  # 3 healthy nodes cannot keep 4 x 1 samples per step: 2 can
        (4, 3, 3, (3, 4)),
        (2, 1, 2, None),  # enough nodes: keep the size, only leave the failed node out
        (2, 1, 0, None),  # no healthy node at all: wait for one
    ],
)
def test_fewer_nodes_only_with_the_same_global_batch(nodes, accum, usable, expected) -> None:
    plan = outcomes.plan_nodes(nodes, accum, usable)
    assert (None if plan is None else (plan.nodes, plan.grad_accum)) == expected
    if plan is not None:
        assert plan.nodes * plan.grad_accum == nodes * accum


def test_agreement_interval_keeps_a_signal_within_its_budget() -> None:
    """Every `every` steps; the slowest recent step, doubled, times `every` fits the budget."""
    budget = stopflags.latency_budget_s(120)
    assert budget == stopflags.MAX_LATENCY_S and stopflags.latency_budget_s(10) == 0.5
    for steps in ([0.01] * 8, [0.01] * 7 + [0.2], [0.3], [5.0]):
        every = stopflags.agreement_interval(steps, budget)
        assert every == 1 or every * max(steps) * stopflags.SAFETY <= budget, (steps, every)
    assert stopflags.agreement_interval([], budget) == 1  # before any step is timed: every step
    assert stopflags.agreement_interval([1e-5], budget) == stopflags.MAX_EVERY


def test_every_end_of_an_attempt_has_one_word_on_each_level() -> None:
    """records.ENDS is the one map between the enums that say 'completed' (issue 35): every
    record that ends an attempt has its run state, the records a rank ends with map one to one
    onto RankOutcome, and each run state it gives is a final or a live one (status's verdict)."""
    assert {end.event for end in records.ENDS} == {kind for kind in EventKind if kind.ends_attempt}
    assert len({end.event for end in records.ENDS}) == len(records.ENDS)
    assert sorted(records.RANK_END.values()) == sorted(records.RankOutcome)  # each rank end once
    assert records.RUN_STATE[EventKind.COMPLETED] is RunState.COMPLETED
    assert records.RANK_END[EventKind.COMPLETED] is records.RankOutcome.COMPLETED
    assert all(state.final or state is RunState.REQUEUED for state in records.RUN_STATE.values())
