"""The hang and straggler watchdog (core/health.py, worker/heartbeat.py, worker/watchdog.py)
and the per-rank health the TUI's run screen shows (tui/rank_health.py).

The rules are unit-tested on heartbeat records. The watchdog itself runs for real, in one run of
two gloo worker processes (tests/procs.py, tests/faulty_worker.py, a module-scoped fixture):
rank 1 sleeps 3x its own step (at least 0.8 s) in every step from its 3rd on (a straggler: one event, training goes on),
then SIGSTOPs itself in its 24th step: the node watchdog, its own process, must notice, dump
both ranks' stacks with py-spy (the stopped one included), record a `hang` naming rank 1 and
kill both ranks. The restart after a hang is the batch script's (Slurm only):
tests/test_slurm_e2e.py covers it, and a run that completes with a straggler.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from procs import launch, make_run, tiny_job_toml, wait
from tui_helpers import FakeSlurm, run_app, settle, until
from tui_helpers import make_run as make_tui_run

from clusterfsdp.control import doctor, status
from clusterfsdp.control.doctor import Finding
from clusterfsdp.core import health, outcomes
from clusterfsdp.core import spec as S
from clusterfsdp.core.health import Beat, Phase, WatchdogSettings
from clusterfsdp.core.records import Cause, Event, EventKind
from clusterfsdp.core.spec import SpecError
from clusterfsdp.tui.app import ClusterApp
from clusterfsdp.tui.rank_health import RankHealthTable
from clusterfsdp.tui.run_screen import RunScreen
from clusterfsdp.worker import distenv, watchdog

FAULTY = str(Path(__file__).parent / "faulty_worker.py")
FAST = WatchdogSettings(hang_min_s=10, hang_factor=2, startup_s=120, straggler_checks=2)
WATCHDOG = """[train.watchdog]
hang_min_s = 10
hang_factor = 2
startup_s = 120
straggler_checks = 2
"""


def beat(rank: int, step: int, progress: float, at: float, phase: Phase = Phase.STEP, host: str = "n1",
         late: float = 0.0) -> Beat:  # fmt: skip
    """A heartbeat of steps of 0.1 s; `late`: the rank reaches both sync points of its last
    MARKS steps this much after the others."""
    marks = [[s, 10.0 + s * 0.1 + late, 10.05 + s * 0.1 + late] for s in range(max(0, step - health.MARKS), step)]
    return Beat(rank, host, 1000 + rank, "7", 0, phase, step, progress, at, 0.1, 0.1, marks)


# ---------------------------------------------------------------- the rules
def test_the_timeout_follows_the_slowest_step_with_floors_per_phase():
    s = WatchdogSettings()
    assert health.hang_timeout_s(s, Phase.STEP, 0.2) == 60  # the floor
    assert health.hang_timeout_s(s, Phase.STEP, 30.0) == 300  # 10 x the slowest recent step
    assert health.hang_timeout_s(s, Phase.STEP, 0.0) == s.startup_s  # no step measured yet
    assert health.hang_timeout_s(s, Phase.SAVE, 0.2) == s.save_s
    assert health.hang_timeout_s(s, Phase.DATA_PREP, 0.2) == s.data_prep_s
    assert health.collective_timeout_s(s, Phase.STEP, 30.0) == 300 + health.MARGIN_S


def test_a_frozen_rank_is_named_and_a_slow_phase_is_not_a_hang():
    now = 1000.0
    frozen = {0: beat(0, 5, now - 30, now - 1), 1: beat(1, 4, now - 31, now - 29, host="n2")}
    found = health.find_hang(frozen, 2, FAST, now)
    assert found is not None and found.ranks == (1,) and found.hosts == ("n2",), found
    assert "stopped answering" in found.reason and "rank 1 on n2" in found.reason
    # every rank beats, one is a step behind: it holds the others
    behind = {0: beat(0, 5, now - 30, now - 1), 1: beat(1, 4, now - 31, now - 1)}
    assert health.find_hang(behind, 2, FAST, now).ranks == (1,)  # type: ignore[union-attr]
    # the same silence while a rank saves a checkpoint is within the save's floor
    saving = {0: beat(0, 5, now - 30, now - 1, Phase.SAVE), 1: beat(1, 5, now - 30, now - 1)}
    assert health.find_hang(saving, 2, FAST, now) is None
    # a rank that froze right after announcing a save lends the others no save floor: the others
    # still answer and are past it (the Slurm e2e test met this: gloo's timeout fired first)
    froze_saving = {0: beat(0, 5, now - 30, now - 1), 1: beat(1, 5, now - 30, now - 29, Phase.SAVE, host="n2")}
    found = health.find_hang(froze_saving, 2, FAST, now)
    assert found is not None and found.ranks == (1,) and "timeout 10 s" in found.reason, found
    # every rank frozen (a whole node stopped): their last phases are all there is to go by
    all_frozen = {r: beat(r, 5, now - 30, now - 29, Phase.SAVE) for r in (0, 1)}
    assert health.find_hang(all_frozen, 2, FAST, now) is None
    assert health.find_hang(frozen, 2, FAST, now - 25) is None  # 5 s without progress: not yet
    assert health.find_hang({0: beat(0, 0, now - 200, now - 1)}, 2, FAST, now).ranks == (1,)  # type: ignore[union-attr]


def test_a_straggler_is_the_rank_whose_own_step_time_stands_out():
    beats = {r: beat(r, 9, 0, 0, late=0.01 * r) for r in range(4)}  # jitter of 10 ms
    assert health.stragglers(beats, FAST) == {}
    beats[2] = beat(2, 9, 0, 0, late=0.08)  # 80 ms late on steps of 100 ms
    assert health.stragglers(beats, FAST) == {2: pytest.approx(0.08)}
    assert health.stragglers(beats, WatchdogSettings(straggler_factor=0)) == {}
    beats[3] = beat(3, 2, 0, 0)  # its heartbeat shares too few steps with the others yet
    assert health.stragglers(beats, FAST) == {}


def test_a_heartbeat_file_round_trips_and_a_foreign_one_is_skipped(tmp_path):
    health.write_beat(tmp_path, beat(0, 3, 1.0, 2.0))
    (tmp_path / "rank1.json").write_text('{"rank": "one"}')
    (tmp_path / "rank2.json").write_text("not json")
    assert health.read_beats(tmp_path) == {0: beat(0, 3, 1.0, 2.0)}


def test_a_hang_event_restarts_the_attempt_without_the_suspect_node():
    hang = Event(EventKind.HANG, "7", 0, 1, "n2", 1.0, reason="no progress", ranks=[1], failed_nodes=["n2"])
    killed = Event(EventKind.FAILED, "7", 0, 0, "n1", 2.0, reason="lost peer", cause=Cause.COLLECTIVE)
    failure = outcomes.classify_failure([hang, killed], world_size=2, down_nodes=[], srun_rc=137)
    assert failure.cause is Cause.HANG and failure.cause.retryable and failure.failed_nodes == ("n2",)
    # a Python error before it is the root cause: the hang was its consequence
    error = Event(EventKind.FAILED, "7", 0, 1, "n2", 0.5, reason="ValueError", cause=Cause.ERROR, steps_done=3, step=3)
    assert outcomes.classify_failure([error, hang], world_size=2, down_nodes=[], srun_rc=137).cause is Cause.ERROR


def test_the_nccl_flight_recorder_dumps_into_the_attempts_diagnostics(tmp_path):
    """The variables only (no GPU here: NCCL never reads them in this suite); [env] still wins."""
    single = distenv.from_environ({})
    chosen, _ = distenv.network_env(single, {"TORCH_FR_BUFFER_SIZE": "0"}, environ={}, diagnostics=tmp_path / "7.0")
    assert chosen["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / "7.0" / "nccl_trace_rank_")
    assert chosen["TORCH_NCCL_TRACE_BUFFER_SIZE"] == distenv.FR_BUFFER and chosen["TORCH_FR_BUFFER_SIZE"] == "0"
    assert "TORCH_FR_BUFFER_SIZE" not in distenv.network_env(single, {}, environ={})[0]


# ---------------------------------------------------------------- real ranks
@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    root = tmp_path_factory.mktemp("watchdog")
    run = make_run(tiny_job_toml("watchdog", 0, 60, tail=WATCHDOG), root)
    procs = launch([FAULTY, str(run.path)], 2, "w", {"CLUSTERFSDP_TEST_FAULT": "slow@3:1,stop@24:1"})
    try:
        out = wait(procs, timeout=240)
    finally:
        for p in procs:
            p.kill()
    return run, out


def test_a_slow_rank_is_a_straggler_and_training_goes_on(watched):
    run, _ = watched
    events = run.events()
    (slow,) = [e for e in events if e.event is EventKind.STRAGGLER]
    assert slow.ranks == [1] and "is a straggler" in slow.reason and slow.step is not None, slow
    (hang,) = [e for e in events if e.event is EventKind.HANG]
    assert slow.time < hang.time and slow.step < 23  # noticed while it trained on (it stopped in step 24)
    assert "[watchdog] warning: rank 1 on" in (run.path / "logs" / "w.0" / "rank0.log").read_text()
    assert any(n.startswith("straggler (w.0): rank 1 on") for n in status.run_status(run).notes)
    rows = health.rank_health(run.path, events, time.time())
    assert [(r.rank, r.straggler, r.hung) for r in rows] == [(0, False, False), (1, True, True)]


def test_a_stopped_rank_is_named_dumped_and_killed(watched):
    run, out = watched
    assert [code for code, _ in out] == [-9, -9], [text[-2000:] for _, text in out]
    (hang,) = [e for e in run.events() if e.event is EventKind.HANG]
    assert hang.ranks == [1] and hang.rank == 1 and "stopped answering" in hang.reason, hang
    assert "stopped (SIGSTOP)" in hang.reason and not hang.failed_nodes  # one process, not the node
    diag = run.path / "diagnostics" / "w.0"
    stopped, waiting = (diag / "rank1.txt").read_text(), (diag / "rank0.txt").read_text()
    assert '"MainThread"' in stopped and "faulty_step (" in stopped, stopped  # py-spy read the stopped rank
    assert '"MainThread"' in waiting and "clusterfsdp-heartbeat" in waiting, waiting
    d = doctor.diagnose(run)
    assert d.finding is Finding.HANG and d.rank == 1 and d.source == "diagnostics/w.0/rank1.txt", d
    assert d.stuck_frame.startswith("_fault (") and "faulty_worker.py:" in d.stuck_frame
    beats = health.read_beats(run.path / "health" / "w.0")
    assert beats[1].step < beats[0].step == 24  # rank 1 stopped inside its 24th step (its file may lag 2 s)


# ---------------------------------------------------------------- the TUI
def test_the_run_screen_marks_the_hung_rank_and_the_straggler(tmp_path, monkeypatch):
    """Heartbeats of a running 4-rank attempt (rank 3 frozen 40 s ago, rank 2 half a step late)
    and the watchdog's events: the run screen's health table lists the marked ranks first."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs"
    run = make_tui_run(root, ranks=4, end=None)
    now = time.time()
    folder = health.health_dir(run.path, "1001", 0)
    folder.mkdir(parents=True)
    for r in range(4):
        frozen = r == 3
        b = beat(r, 12 if frozen else 13, now - 40, now - (40 if frozen else 1), late=0.06 if r == 2 else 0.0)
        health.write_beat(folder, dataclasses.replace(b, job_id="1001", host=f"node{r // 2 + 1}"))
    for kind in (EventKind.STRAGGLER, EventKind.HANG):
        rank = 2 if kind is EventKind.STRAGGLER else 3
        run.append_event(Event(kind, "1001", 0, rank, "node2", now, reason=f"{kind} of rank {rank}", ranks=[rank]))
    app = ClusterApp(root, slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await until(pilot, lambda: app.current_key is not None, "a selected run")
        await pilot.press("4")
        screen = app.screen
        assert isinstance(screen, RunScreen)
        table = screen.query_one("#ranks", RankHealthTable)
        await until(pilot, lambda: table.row_count == 4, "the ranks' rows")
        await settle(pilot)
        assert table.display and table.border_title == "ranks: 1 HUNG, 1 straggler, 2 ok"
        rows = [table.get_row_at(i) for i in range(4)]
        assert [row[0] for row in rows] == ["3", "2", "0", "1"]  # marked first
        assert rows[0][1:4] == ["node2", "step", "12"] and rows[0][-1] == "HUNG"
        assert rows[0][-2].endswith(" s ago") and int(rows[0][-2].split()[0]) >= 40  # its last heartbeat
        assert rows[1][5] == "0.060 s" and rows[1][-1] == "straggler" and rows[2][-1] == "ok"
        assert "0.100 s" in rows[2][4]  # the step time

    run_app(app, scenario)


def test_watchdog_settings_are_checked_before_queueing():
    with pytest.raises(SpecError) as e:
        S.loads(tiny_job_toml("w", 0, 4, tail="[train.watchdog]\nhang_min_s = 2\nhang_factor = 1\n"))
    assert "train.watchdog.hang_min_s: must be >= 10, found 2.0" in e.value.errors
    assert "train.watchdog.hang_factor: must be >= 2, found 1.0" in e.value.errors
    spec = S.loads(tiny_job_toml("w", 0, 4, tail=WATCHDOG))
    assert health.WatchdogSettings.of(spec.train.watchdog) == FAST


def test_the_hang_event_leaves_out_a_node_with_a_rank_in_d_state_or_a_silent_watchdog(tmp_path, monkeypatch):
    """NodeWatchdog.record on the markers the node watchdogs leave: a rank stuck in the kernel (D)
    points at its node, and so does a node whose watchdog never answered; a stopped process alone
    does not; all nodes suspect is no evidence at all (nothing would be left to run on)."""
    monkeypatch.setattr(watchdog, "DUMP_WAIT_S", 0.0)
    run = make_run(tiny_job_toml("w", 0, 4), tmp_path)
    beats = {r: beat(r, 5, 0, 0, host=f"n{r + 1}") for r in range(3)}
    dog = watchdog.NodeWatchdog(run.path, "7", 0, 3, FAST)
    dog.diag.mkdir(parents=True)

    def record(states: dict[str, dict[str, str]]) -> Event:
        for path in dog.diag.glob("dumped.*.json"):
            path.unlink()
        for host, ranks in states.items():
            (dog.diag / f"dumped.{host}.json").write_text(json.dumps({"host": host, "states": ranks}))
        dog.record(beats, health.Hang((1,), ("n2",), "no progress"))
        return [e for e in run.events() if e.event is EventKind.HANG][-1]

    stopped = record({"n1": {"0": "S"}, "n2": {"1": "T"}, "n3": {"2": "S"}})
    assert stopped.failed_nodes == [] and stopped.ranks == [1] and "rank 1: stopped (SIGSTOP)" in stopped.reason
    assert record({"n1": {"0": "S"}, "n2": {"1": "D"}, "n3": {"2": "S"}}).failed_nodes == ["n2"]
    assert record({"n1": {"0": "S"}, "n3": {"2": "S"}}).failed_nodes == ["n2"]  # n2's watchdog is silent
    assert record({}).failed_nodes == []
    assert (dog.diag / "recorded").exists()
