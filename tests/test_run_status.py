"""What `status` says of a run in the moments the folder and Slurm disagree, and what it reads.

The Slurm job table is handed to `status.run_status` as `statuses()` hands it (one squeue for all
runs): rows as squeue prints them, so no controller is needed to set up the seconds between the
workers' last record and the batch script's end (the devcluster tests cover the real sequence).
"""

from __future__ import annotations

import json

from tui_helpers import T0, make_run

from clusterfsdp.control import jsonout, status
from clusterfsdp.control.records import Event, EventKind, RunState
from clusterfsdp.control.slurmcli import JobRow


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
    assert st.state is RunState.COMPLETING and st.reason.startswith("the workers ended (failed: boom)")


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
