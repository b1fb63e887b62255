"""`clusterfsdp doctor` names the right first cause from the run folder alone.

The failed runs are real: two gloo worker processes each (tests/procs.py) on the tiny CPU job,
one module-scoped fixture making them side by side. The faults are injected at an optimizer step
by tests/faulty_worker.py (the real worker otherwise): a Python error in user code, a CUDA
out-of-memory error (simulated: raised with CUDA's message, there is no GPU here), a SIGKILLed
rank, and a rank stuck in a sleep whose stacks faulthandler dumps into diagnostics/ (the
watchdog's stand-in) while the other rank times out in the collective. Two need no injection: a
JSONL file broken after its first record (validate reads only the first) and a model config that
validate accepts but the model cannot run (5 attention heads over 2 key/value heads).

Preemption, time limit and node failure need Slurm: a failed node and a time limit followed by a
killed rank come from run folders the Slurm recovery tests left on the devcluster (events.jsonl,
state.json and nodes/ kept in tests/golden/doctor/); preemption gets the events the real code
writes: `outcomes.classify_stop` on `scontrol show job` output captured on the devcluster
(tests/golden/scontrol/), recorded as the worker's rank 0 records it.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import time
from pathlib import Path

import pytest
from procs import CORPUS, launch, make_run, tiny_job_toml, wait

from clusterfsdp import cli
from clusterfsdp.control import doctor
from clusterfsdp.control.doctor import Finding
from clusterfsdp.core import outcomes, runfolder
from clusterfsdp.core.records import Cause, Event, EventKind, Executor
from clusterfsdp.core.slurmcli import JobInfo

FAULTY = str(Path(__file__).parent / "faulty_worker.py")
GOLDEN = Path(__file__).parent / "golden" / "scontrol"
GOLDEN_RUNS = Path(__file__).parent / "golden" / "doctor"
FAULTS = {"error": "error@3:1", "oom": "oom@2:0", "kill": "kill@3:1", "bug": "bug@3:1"}
# A run that really diverges (no injection): fp16 at lr 0.9 without warmup sends the loss 11 -> 67 -> NaN
# at step 4; the guard rolls back to step 2 once, diverges again at step 4 and refuses a second rollback.
# Its grace time (0 s) is shorter than any save: each save is warned about.
DIVERGING = tiny_job_toml("diverging", 0, 8, fsdp='sharding = "full"',
                          tail="[slurm]\nsignal_grace_s = 0\n[checkpoint]\nevery_steps = 2\n"
                               "[train.guard]\nrollback_after = 2\n").replace(
    'mixed_precision = "fp32"', 'mixed_precision = "fp16"').replace("lr = 3e-3", "lr = 0.9").replace(
    "warmup = 2", "warmup = 0")  # fmt: skip


def _broken_jsonl(folder: Path) -> Path:
    path = folder / "broken.jsonl"
    text = CORPUS.read_text()[:40000]
    records = [json.dumps({"text": text[i : i + 400]}) for i in range(0, len(text), 400)]
    records.insert(20, '{"text": "a record cut short')
    path.write_text("\n".join(records) + "\n")
    return path


@pytest.fixture(scope="module")
def failed_runs(tmp_path_factory) -> dict[str, runfolder.RunFolder]:
    root = tmp_path_factory.mktemp("doctor")
    job = tiny_job_toml("doctor", 0, 6)
    runs = {name: make_run(job, root) for name in [*FAULTS, "hang"]}
    runs["data"] = make_run(job.replace(str(CORPUS), str(_broken_jsonl(root))), root)
    runs["config"] = make_run(job.replace("[data]", "[model.from_config]\nnum_attention_heads = 5\n[data]"), root)
    runs["numerical"] = make_run(DIVERGING, root)
    for name, run in runs.items():
        run.add_attempt(name, Executor.LOCAL, "submit")  # as `submit` records it (no process group to watch)
    started = [launch([FAULTY, str(runs[n].path)], 2, n, {"CLUSTERFSDP_TEST_FAULT": f}) for n, f in FAULTS.items()]
    started += [launch(["-m", "clusterfsdp.worker", str(runs[n].path)], 2, n) for n in ("data", "config", "numerical")]
    for procs in started:
        wait(procs, timeout=600)
    # the hang last, once the data is prepared: its short collective timeout covers training only
    hang = launch([FAULTY, str(runs["hang"].path)], 2, "hang", {"CLUSTERFSDP_TEST_FAULT": "hang@3:1"})
    try:
        hang[0].wait(timeout=300)  # rank 0 times out waiting for rank 1
        dump = runs["hang"].path / "diagnostics" / "hang.0" / "rank1.txt"
        deadline = time.monotonic() + 60
        while not (dump.is_file() and dump.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        for p in hang:
            p.send_signal(signal.SIGKILL)
        wait(hang)
    return runs


def test_python_error_in_user_code(failed_runs):
    d = doctor.diagnose(failed_runs["error"])
    assert d.finding is Finding.PYTHON_ERROR and (d.rank, d.step, d.job_id) == (1, 2, "error"), d  # 2 steps done
    assert d.host == socket.gethostname() and d.summary.startswith("ZeroDivisionError: float division by zero")
    assert d.source == "logs/error.0/rank1.log"
    assert "in divide_the_loss_by_the_padding" in d.lines[0]
    assert d.lines[-1] == "ZeroDivisionError: float division by zero"
    assert d.others and d.others[0].startswith("rank 0 ")  # the survivor's lost peer, after it
    # it happened once: the advice says so, and never that it repeats
    assert "repeats" not in d.next_steps[0] and "it happened once" in d.next_steps[0], d.next_steps
    assert d.repeats == 1


def test_the_same_error_at_the_same_step_again_is_said_to_repeat(failed_runs, tmp_path):
    """The error run's records written again as a second incarnation (job error2: what a restart
    that fails the same way leaves): now, and only now, the doctor says it repeats."""
    run = runfolder.RunFolder(tmp_path / "doctor" / failed_runs["error"].path.name)
    shutil.copytree(failed_runs["error"].path, run.path)
    for e in failed_runs["error"].events():
        run.append_event(Event(e.event, "error2", e.restart, e.rank, e.host, e.time + 60, e.step, e.reason,
                               world_size=e.world_size, cause=e.cause, steps_done=e.steps_done))  # fmt: skip
    shutil.copytree(run.logs_dir / "error.0", run.logs_dir / "error2.0")
    d = doctor.diagnose(run)
    assert (d.job_id, d.finding, d.repeats) == ("error2", Finding.PYTHON_ERROR, 2), d
    assert "it happened at the same step in 2 attempts" in d.next_steps[0]
    assert d.earlier == ["job error.0: python_error: ZeroDivisionError: float division by zero"]


def test_an_exception_in_clusterfsdps_own_code_is_a_bug_to_report(failed_runs):
    """The innermost frame is clusterfsdp's (worker/train.py), at a line that raises nothing on
    purpose: not "fix the code in the innermost frame", but report it with the run folder."""
    run = failed_runs["bug"]
    d = doctor.diagnose(run)
    assert not any("fix the code" in line for line in d.next_steps), d.next_steps
    assert d.finding is Finding.BUG and d.rank == 1 and d.summary.startswith("TypeError: "), d
    assert d.frame.startswith("clusterfsdp/worker/train.py:") and d.frame.endswith(" in step"), d.frame
    assert "a bug in clusterfsdp (clusterfsdp/worker/train.py:" in d.next_steps[0]
    assert f"report it with the run folder {run.path}" in d.next_steps[0]
    assert "raised in  clusterfsdp/worker/train.py:" in "\n".join(d.render())
    # the errors clusterfsdp raises on purpose are no bug: a DataError (data/samples.py), the guard's NumericalError
    assert doctor.diagnose(failed_runs["data"]).finding is Finding.DATA_ERROR


def test_a_diverging_fp16_run_is_numerical_with_its_step_lr_dtype_and_a_checkpoint(failed_runs, capsys):
    """The guard's refused rollback ends the run: a `numerical` finding (not a python_error in
    worker/numguard.py) naming the step, the lr and the precision, with a lower lr from the
    checkpoint before the bad steps and bf16 as the advice. The refusal is the run's failure, not
    a rollback: `status` counts the one rollback that happened."""
    run = failed_runs["numerical"]
    d = doctor.diagnose(run)
    assert not any("fix the code" in line for line in d.next_steps), d.next_steps
    assert d.finding is Finding.NUMERICAL and d.step == 5 and "NumericalError" in d.summary, d
    assert d.numbers.startswith("step 5 (bad since step 4), lr ") and "(train.lr 0.9)" in d.numbers, d.numbers
    assert "fsdp.mixed_precision fp16" in d.numbers
    assert d.next_steps[0].startswith(f"clusterfsdp resume {run.id} --step 2 --set train.lr=0.09 "), d.next_steps
    assert "--set fsdp.mixed_precision=bf16" in d.next_steps[1]
    events = run.events()
    (back,) = [e for e in events if e.event is EventKind.ROLLBACK]  # the real one; the refused one is no event
    assert back.step == 2 and "rolled back to checkpoint step 2" in back.reason
    assert {e.rank for e in events if e.event is EventKind.FAILED and "NumericalError" in e.reason} == {0, 1}
    assert cli.main(["status", str(run.path)]) == 1
    out = capsys.readouterr().out
    assert "numerical guard: 4 step(s) skipped, 1 rollback(s)" in out and "2 rollback(s)" not in out
    assert "state      FAILED - NumericalError: numerical guard: 2 bad steps in a row" in out
    assert "cause      numerical: " in out and "numbers    step 5" in out


def test_simulated_oom_names_the_rank_and_a_smaller_micro_batch(failed_runs):
    d = doctor.diagnose(failed_runs["oom"])
    assert d.finding is Finding.OOM and d.rank == 0 and "CUDA out of memory" in d.summary, d
    assert any("OutOfMemoryError: CUDA out of memory" in line for line in d.lines)
    assert f"clusterfsdp resume {failed_runs['oom'].id} --set train.micro_batch_size=" in d.next_steps[0]


def test_a_killed_rank_is_the_cause_not_the_survivors_lost_peer(failed_runs, capsys):
    d = doctor.diagnose(failed_runs["kill"])
    assert d.finding is Finding.RANK_KILLED and d.rank == 1 and d.host == socket.gethostname(), d
    assert d.others and "rank 0" in d.others[0]
    # one verdict: status's state line and attempt line say what the doctor says, the dead rank first
    assert cli.main(["status", str(failed_runs["kill"].path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    state = next(line for line in lines if line.startswith("state "))
    ended = next(line for line in lines if line.startswith("  ended "))
    assert "Connection" not in state + ended and state.startswith("state      FAILED - rank 1 died"), state
    assert state == f"state      FAILED - {d.headline()}", state
    assert ended.endswith(f"failed (rank_killed): {d.headline()}"), ended
    assert d.summary.startswith("rank 1 died without an exception")


def test_a_hung_rank_and_its_stuck_frame(failed_runs):
    d = doctor.diagnose(failed_runs["hang"])
    assert d.finding is Finding.HANG and d.rank == 1, d
    assert d.stuck_frame.startswith("wait_for_a_lock_that_never_comes (") and "faulty_worker.py:" in d.stuck_frame
    assert d.source == "diagnostics/hang.0/rank1.txt"
    assert d.others and "rank 0" in d.others[0] and "timed out" in d.others[0].lower()


def test_a_broken_jsonl_record_is_a_data_error(failed_runs):
    d = doctor.diagnose(failed_runs["data"])
    assert d.finding is Finding.DATA_ERROR and "broken.jsonl:21: not valid JSON" in d.summary, d
    assert d.lines and "DataError" in d.lines[-1]


def test_a_config_that_validate_accepts_but_the_model_cannot_run(failed_runs, capsys):
    run = failed_runs["config"]
    assert cli.main(["validate", str(run.job_toml)]) == 0
    d = doctor.diagnose(run)
    assert d.finding is Finding.BAD_CONFIG and d.step in (0, None), d
    assert d.lines and "Error" in d.lines[-1]


def test_cli_doctor_json_and_the_status_block(failed_runs, capsys):
    run = failed_runs["oom"]
    assert cli.main(["doctor", str(run.path)]) == 0
    text = capsys.readouterr().out
    assert "cause      oom: OutOfMemoryError: CUDA out of memory" in text and "next       clusterfsdp resume" in text
    assert cli.main(["doctor", str(run.path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["finding"] == "oom" and data["rank"] == 0 and data["lines"]
    assert cli.main(["status", str(run.path)]) == 1
    shown = capsys.readouterr().out
    assert "state      FAILED" in shown and "cause      oom:" in shown and "next       " in shown


def test_a_save_longer_than_the_grace_time_is_warned_about(failed_runs, capsys):
    """worker/train.GraceCheck: a save (plus the time the ranks take to act on a signal) that does
    not fit in slurm.signal_grace_s is a log line and a `warning` event, which `status` shows."""
    run = failed_runs["numerical"]
    grace = "the last checkpoint save took "  # (the loss-rise check warns in this run too: train.guard.warn_rise)
    warnings = [e for e in run.events() if e.event is EventKind.WARNING and e.reason.startswith(grace)]
    first, last = warnings[0], warnings[-1]
    assert first.step == 2 and first.reason.startswith("the last checkpoint save took "), warnings
    assert "more than slurm.signal_grace_s = 0 s leaves before the time limit" in first.reason
    assert "raise slurm.signal_grace_s to at least " in first.reason
    assert f"warning: {first.reason}" in run.log_path("numerical", 0, 0).read_text()
    assert cli.main(["status", str(run.path)]) == 1
    assert f"note       warning (step {last.step}): {last.reason}" in capsys.readouterr().out


def _slurm_run(tmp_path: Path, *events: Event) -> runfolder.RunFolder:
    run = make_run(tiny_job_toml("slurmy", 0, 6), tmp_path)
    for e in events:
        run.append_event(e)
    return run


def _event(kind: EventKind, rank: int = 0, **fields) -> Event:
    return Event(kind, "4242", 0, rank, "node1", time.time(), **fields)


@pytest.mark.parametrize(
    ("name", "signal_name", "finding"),
    [("preempted_in_grace", "SIGTERM", Finding.PREEMPTED), ("", "SIGUSR2", Finding.TIME_LIMIT)],
)
def test_preemption_and_time_limit(tmp_path, name, signal_name, finding):
    info = JobInfo.parse((GOLDEN / f"{name}.txt").read_text().strip()) if name else None
    verdict = outcomes.classify_stop(signal_name, info, 0, cancel_asked=False)
    run = _slurm_run(
        tmp_path,
        _event(EventKind.START, world_size=2, nodes=1),
        _event(EventKind.REQUEUED, step=4, cause=verdict.cause, reason=f"{verdict.reason}; saved step 4"),
    )
    d = doctor.diagnose(run)
    assert d.finding is finding and d.step == 4 and verdict.reason in d.summary, d
    assert d.next_steps[0].startswith("nothing: the run saved")
    for kind in (EventKind.START, EventKind.COMPLETED):  # the next incarnation completes: the interruption is history
        run.append_event(Event(kind, "4242", 1, 0, "node1", time.time(), step=6))
    d = doctor.diagnose(run)
    assert d.finding is Finding.NONE and d.earlier == [f"job 4242.0: {finding}: {verdict.reason}; saved step 4"], d


def _captured(tmp_path: Path, name: str, until: EventKind) -> runfolder.RunFolder:
    """A run folder of tests/golden/doctor/<name> (events.jsonl, state.json and nodes/ copied from
    the devcluster run of a Slurm recovery test), its events cut after the first `until`
    record: the folder as it was when that attempt had just failed."""
    run = runfolder.RunFolder(tmp_path / "tiny-cpu" / "20261125-010000-abcd")
    shutil.copytree(GOLDEN_RUNS / name, run.path)
    lines = run.events_file.read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if json.loads(line)["event"] == until)
    run.events_file.write_text("".join(lines[: cut + 1]))
    return run


def test_node_failure_from_a_devcluster_run(tmp_path):
    """test_slurm_e2e's failed node: node2's slurmd and processes killed, the batch step's verdict."""
    d = doctor.diagnose(_captured(tmp_path, "node_failure", EventKind.AUTO_RESTART))
    assert d.finding is Finding.NODE_FAILURE and d.host == "node2" and "Slurm declared node2 down" in d.summary, d


def test_a_killed_rank_after_a_time_limit_from_a_devcluster_run(tmp_path):
    """test_slurm_e2e's time limit (SIGUSR2, saved, requeued), then rank 1 SIGKILLed in the next incarnation."""
    d = doctor.diagnose(_captured(tmp_path, "time_limit_then_rank_killed", EventKind.AUTO_RESTART))
    assert d.finding is Finding.RANK_KILLED and (d.rank, d.host, d.restart) == (1, "node1", 1), d
    assert d.earlier == ["job 16665123.0: time_limit: SIGUSR2 ahead of the time limit; saved step 16"]
    assert d.others and d.others[0].startswith("rank 0 on node1: RuntimeError:") and "Connection closed" in d.others[0]


def test_restarts_used_up_by_time_limits_that_saved_nothing_newer(tmp_path):
    """Rank 0's own `failed` record (restarts_exhausted) is no error of a rank: the time limit is the cause."""
    verdict = outcomes.classify_stop("SIGUSR2", None, 1, cancel_asked=False)
    reason = f"{verdict.reason}; saved step 4, no progress since the last restart, and 3 restarts used"
    run = _slurm_run(
        tmp_path,
        _event(EventKind.START, world_size=2, nodes=1),
        _event(EventKind.FAILED, step=4, cause=Cause.RESTARTS_EXHAUSTED, reason=reason),
    )
    d = doctor.diagnose(run)
    assert d.finding is Finding.TIME_LIMIT and d.summary == reason and "max_restarts ran out" in d.next_steps[0], d


def test_the_tui_run_screen_shows_why_a_run_failed(tmp_path, monkeypatch):
    """The run screen (4) of a FAILED run ends its header with the doctor's short explanation;
    a fixed run folder as the worker leaves it after a CUDA out-of-memory error on rank 1."""
    from tui_helpers import T0, FakeSlurm, make_run, rendered, run_app, until

    from clusterfsdp.tui.app import ClusterApp
    from clusterfsdp.tui.run_screen import RunScreen

    monkeypatch.chdir(tmp_path)
    run = make_run(tmp_path / "runs", end=None)
    reason = "rank 1 on node1: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    run.append_event(Event(EventKind.FAILED, "1001", 0, 1, "node1", T0 + 60, step=40, reason=reason, cause=Cause.ERROR,
                           steps_done=40))  # fmt: skip
    log = run.log_path("1001", 0, 1)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(
        'Traceback (most recent call last):\n  File "/job/model.py", line 9, in forward\n    return self.big(x)\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    )
    app = ClusterApp(tmp_path / "runs", slurm=FakeSlurm(), refresh_s=3600)

    async def scenario(pilot):
        await until(pilot, lambda: app.current_key is not None, "a selected run")
        await pilot.press("4")
        screen = app.screen
        assert isinstance(screen, RunScreen)
        await until(pilot, lambda: "cause      oom:" in rendered(screen.query_one("#run-header")), "the diagnosis")
        header = rendered(screen.query_one("#run-header"))
        assert "rank 1 on node1" in header and "| torch.OutOfMemoryError" in header
        assert f"next       clusterfsdp resume {run.id} --set train.micro_batch_size" in header

    run_app(app, scenario)


def test_a_watchdogs_hang_record_and_a_py_spy_dump(tmp_path):
    """A `hang` line in events.jsonl (the watchdog's record: which rank stopped, where) and a
    `py-spy dump` of that rank under diagnostics/: the doctor names the rank and its stuck frame.
    The line has the fields every event has (a watchdog's also has `ranks`; tests/test_watchdog.py
    runs the real one), and the dump is py-spy's own format (threads by name, innermost frame first)."""
    run = _slurm_run(tmp_path, _event(EventKind.START, world_size=4, nodes=2))
    hang = {"event": "hang", "job_id": "4242", "restart": 0, "rank": 3, "host": "node2", "time": time.time(),
            "reason": "rank 3 on node2 made no progress for 95 s (slowest recent step 0.2 s)"}  # fmt: skip
    with open(run.events_file, "a") as f:
        f.write(json.dumps(hang) + "\n")
    dump = run.path / "diagnostics" / "4242.0" / "rank3.txt"
    dump.parent.mkdir(parents=True)
    dump.write_text(
        "Process 5120: python -u -m submitit.core._submit\nPython v3.11.2 (/usr/bin/python3.11)\n\n"
        'Thread 5120 (idle): "MainThread"\n    wait (threading.py:331)\n    get (queue.py:180)\n'
        "    next_batch (clusterfsdp/data/samples.py:212)\n"
        'Thread 5177 (idle): "Thread-2 (_heartbeat)"\n    sleep (clusterfsdp/core/lock.py:90)\n'
    )
    d = doctor.diagnose(run, live=True)
    assert d.finding is Finding.HANG and (d.rank, d.host) == (3, "node2") and "95 s" in d.summary, d
    assert d.stuck_frame == "wait (threading.py:331)" and d.source == "diagnostics/4242.0/rank3.txt"
    assert d.lines[-1] == "next_batch (clusterfsdp/data/samples.py:212)"
