"""What `status` says of a run in the moments the folder and Slurm disagree, and what it reads.

The Slurm job table is handed to `status.run_status` as `statuses()` hands it (one squeue for all
runs): rows as squeue prints them, so no controller is needed to set up the seconds between the
workers' last record and the batch script's end. The real sequence on real Slurm is
tests/test_slurm_e2e.py::test_dry_run_script_submitted_by_hand_behaves_like_submit (the batch shell
held with SIGSTOP so the window stays open).
"""

from __future__ import annotations

import json
import os

from tui_helpers import T0, make_run

from clusterfsdp import cli
from clusterfsdp.control import doctor, jsonout, logs, status
from clusterfsdp.control.doctor import Finding
from clusterfsdp.core.records import Event, EventKind, Executor, RunState
from clusterfsdp.core.slurmcli import JobRow


def test_a_slurm_job_still_running_after_its_workers_completed_is_completing(tmp_path):
    """The batch script's `after` step runs once srun returned: Slurm says RUNNING, the folder
    says completed. `status` says COMPLETING (one field for a script to wait on), still live."""
    run = make_run(tmp_path, executor="slurm", job_id="77", end="completed")
    st = status.run_status(run, {"77": JobRow("77", "RUNNING", "None")})
    assert st.state is RunState.COMPLETING and st.state.live and not st.state.final
    assert st.reason == "the workers ended (completed); the batch script's last step is running"
    doc = json.loads(jsonout.document(st))
    assert doc["state"] == "COMPLETING" and doc["live"] is True
    assert status.run_status(run, {}).state is RunState.COMPLETED  # once the job has left the queue


def test_a_requeued_job_running_again_is_running_not_completing(tmp_path):
    """After a requeue the next incarnation runs under the same job id before it writes `start`:
    the previous incarnation's end says nothing of it."""
    run = make_run(tmp_path, executor="slurm", job_id="78", end="requeued")
    assert status.run_status(run, {"78": JobRow("78", "RUNNING", "None")}).state is RunState.RUNNING
    run.append_event(Event(EventKind.START, "78", 1, 0, "node1", T0 + 100))
    run.append_event(Event(EventKind.FAILED, "78", 1, 0, "node1", T0 + 120, reason="boom"))
    st = status.run_status(run, {"78": JobRow("78", "RUNNING", "None")})
    assert st.state is RunState.COMPLETING  # how it ended: the doctor's verdict, the cause first, then the rank
    assert st.reason.startswith("the workers ended (failed (bad_config): boom (rank 0 on node1))"), st.reason


def test_status_reads_the_last_training_row_and_the_last_evaluation(tmp_path):
    run = make_run(tmp_path, steps=40, logged=40, eval_every=20)
    st = status.run_status(run)
    assert (st.step, st.loss) == (40, 2.5)
    assert (st.eval_step, round(st.eval_loss or 0, 6), st.eval_ppl) == (40, 2.8, 10.0)
    doc = json.loads(jsonout.document(st))
    assert (doc["eval_step"], round(doc["eval_loss"], 6), doc["eval_ppl"]) == (40, 2.8, 10.0)


def test_status_finds_an_old_evaluation_behind_many_training_rows(tmp_path):
    """The last evaluation may lie thousands of rows back; it is found reading backwards, and a
    row without eval_ppl gets exp(eval_loss)."""
    run = make_run(tmp_path, steps=10, logged=0)
    rows = [{"step": 1, "eval_loss": 1.0}] + [{"step": s, "loss": 0.5} for s in range(2, 20_000)]
    run.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    st = status.run_status(run)
    assert (st.step, st.loss, st.eval_step, st.eval_loss) == (19_999, 0.5, 1, 1.0)
    assert abs((st.eval_ppl or 0) - 2.718281828) < 1e-6


def test_following_a_new_attempt_starts_at_it_and_names_each_attempt(tmp_path):
    """`resume --follow` / `submit --follow`: the previous attempt's log is not replayed (it looked
    like a restart), and each log followed (the new attempt, then its requeue) starts with a banner."""
    run = make_run(tmp_path, job_id="1001", ranks=1, log_lines=5)
    run.add_attempt("1002", Executor.LOCAL, "resume from step 40")
    calls = []

    def done() -> bool:
        calls.append(1)
        if len(calls) <= 2:
            log = run.log_path("1002", len(calls) - 1, 0)
            log.parent.mkdir(parents=True)
            log.write_text(f"attempt line {len(calls)}\n")
            os.utime(log.parent, (T0 + 1000 * len(calls), T0 + 1000 * len(calls)))
            return False
        return True

    text = "".join(logs.follow(run, 0, done, poll_s=0.01, job_id="1002"))
    assert text == "==> 1002.0 (rank0.log) <==\nattempt line 1\n==> 1002.1 (rank0.log) <==\nattempt line 2\n"


def test_logs_of_an_empty_rank_log_says_so(tmp_path, capsys):
    run = make_run(tmp_path, ranks=2)
    run.log_path("1001", 0, 1).write_text("")
    assert cli.main(["logs", run.id, "--rank", "1", "--run-root", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert out.out == "" and f"run {run.id}: rank 1's log is empty so far" in out.err


def test_resume_of_a_completing_run_is_refused_with_what_is_happening(tmp_path, monkeypatch):
    """Through a stub `squeue` on PATH that answers as Slurm 22.05 does for a job whose batch
    script is still in its after-step (no Slurm here): resume is refused, not waited for (the
    step may still queue an automatic restart), and the refusal says why, not "cancel it first"."""
    import pytest

    from clusterfsdp.control.run import Run, RunBusy

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "squeue").write_text("#!/bin/bash\necho '77|RUNNING|None|1:02|node1'\n")
    (bindir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    run = make_run(tmp_path / "runs", executor="slurm", job_id="77", end="completed")
    with pytest.raises(RunBusy) as refused:
        Run(run).resume()
    assert str(refused.value) == (
        f"run {run.id} is COMPLETING (the workers ended (completed); the batch script's last step is running); "
        f"resume once `clusterfsdp status {run.id}` shows how it ended"
    )


def test_logs_of_an_earlier_attempt(tmp_path, capsys):
    """`logs --attempt JOB.RESTART` reads that incarnation's log of the rank, not the newest one;
    an attempt that has no log of the rank is one line listing those that have."""
    run = make_run(tmp_path, job_id="1001", log_lines=3)
    run.add_attempt("1002", Executor.LOCAL, "resume from step 40")
    for rank in (0, 1):
        log = run.log_path("1002", 0, rank)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"[rank{rank}] the resumed attempt\n")
    os.utime(run.logs_dir / "1001.0", (T0, T0))  # the older attempt's folder is the older one
    os.utime(run.logs_dir / "1002.0", (T0 + 100, T0 + 100))
    assert cli.main(["logs", str(run.path), "--rank", "1"]) == 0
    assert capsys.readouterr().out == "[rank1] the resumed attempt\n"
    assert cli.main(["logs", str(run.path), "--rank", "1", "--attempt", "1001.0"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "[rank1] line 0: step 0 loss 5.0000"
    assert cli.main(["logs", str(run.path), "--rank", "1", "--attempt", "1001.3"]) == 2
    assert f"run {run.id}: no log for rank 1 yet (attempts: 1001.0, 1002.0)" in capsys.readouterr().err


def test_a_run_cancelled_before_it_started_says_by_whom(tmp_path, capsys):
    """A Slurm job cancelled while it waited (sacct's `CANCELLED by UID`) or by `clusterfsdp cancel`
    says so instead of a bare CANCELLED, and `doctor` says the same, without `.None`."""
    run = make_run(tmp_path, executor="slurm", job_id="19018033", end=None, log_lines=0, ranks=0)
    run.events_file.write_text("")  # it never started
    row = JobRow("19018033", "CANCELLED", "None", "00:00:00", "None assigned", "0:0", by=str(os.getuid()))
    st = status.run_status(run, {"19018033": row})
    user = __import__("pwd").getpwuid(os.getuid()).pw_name
    assert (st.state, st.reason) == (RunState.CANCELLED, f"cancelled before it started (by {user} (uid {os.getuid()}))")
    found = doctor.diagnose(run, st.events, st.state.live, st.state, st.reason)
    assert (found.finding, found.summary, found.where()) == (Finding.CANCELLED, st.reason, "job 19018033"), found
    assert ".None" not in "\n".join(found.render())
    st = status.run_status(run, {"19018033": JobRow("19018033", "CANCELLED", "DependencyNeverSatisfied")})
    assert st.reason == "cancelled before it started (while it waited: DependencyNeverSatisfied)"
    run.update_attempt("19018033", cancelled=T0 + 1)  # `clusterfsdp cancel`
    st = status.run_status(run, {"19018033": row})
    assert st.reason == "cancelled before it started (by clusterfsdp cancel)"
