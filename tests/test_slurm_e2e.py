"""Every Slurm path of the product, through the real daemons of the local multi-node test
cluster (slurm/devcluster.sh): sbatch, srun, squeue, sacct, scancel, scontrol requeue."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import newest_checkpoint, weights_folder

from clusterfsdp.control import ckptfolder, runfolder, status

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[1]
TWO_NODES = ["--set", "slurm.nodes=2", "--set", "slurm.tasks_per_node=2"]


def cli(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clusterfsdp.cli", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def only_run(root: Path) -> runfolder.RunFolder:
    (run,) = runfolder.list_runs(root)
    return run


def wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def max_step(run: runfolder.RunFolder) -> int:
    return max((r["step"] for r in run.metrics()), default=0)


def node_hosts(run: runfolder.RunFolder) -> set[str]:
    return {json.loads(p.read_text())["hostname"] for p in run.nodes_dir.rglob("*.json")}


@pytest.mark.parametrize("version", [2, 1])
def test_two_node_hybrid_job_completes(slurm_cluster, tiny_job, tmp_path, version):
    r = cli(
        "submit",
        str(tiny_job),
        "--executor",
        "slurm",
        *TWO_NODES,
        "--set",
        "fsdp.sharding=hybrid",
        "--set",
        f"fsdp.version={version}",
        "--set",
        "train.steps=40",
        "--follow",
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert f"mesh (2, 2) (hybrid, FSDP{version})" in r.stdout and "4 ranks on 2 node(s)" in r.stdout
    run = only_run(tmp_path / "runs")
    assert node_hosts(run) == {"node1", "node2"}
    rows = run.metrics()
    assert rows[-1]["step"] == 40 and rows[0]["loss"] - rows[-1]["loss"] > 0.8
    assert newest_checkpoint(run.checkpoints_dir()).step == 40
    job_id = run.attempts[-1].job_id
    assert slurm_cluster.wait_sacct(int(job_id), "COMPLETED")
    st = cli("status", str(run.path))
    assert st.returncode == 0 and "state      COMPLETED" in st.stdout


def test_dry_run_script_submitted_by_hand_behaves_like_submit(slurm_cluster, tiny_job, tmp_path):
    r = cli("submit", str(tiny_job), *TWO_NODES, "--set", "train.steps=20", "--dry-run")
    assert r.returncode == 0 and r.stdout.startswith("#!/bin/bash")
    run = only_run(tmp_path / "runs")
    assert status.run_status(run).state == "PREPARED"
    job_id = slurm_cluster.sbatch([str(run.path / "sbatch.sh")])
    wait_for(lambda: status.run_status(run).state == "COMPLETED", 300, "the hand-submitted job")
    assert run.attempts[-1].job_id == str(job_id) and node_hosts(run) == {"node1", "node2"}
    assert newest_checkpoint(run.checkpoints_dir()).step == 20
    assert slurm_cluster.wait_sacct(job_id, "COMPLETED")


@pytest.mark.timeout(1500)  # attempts are slow while the other xdist worker loads both cores
def test_time_limit_signal_save_requeue_resume(slurm_cluster, tiny_job, tmp_path):
    """A 1-minute limit with a 45 s grace: SIGUSR2 arrives early (Slurm checks limits about every
    30-60 s), the ranks save, rank 0 requeues, and the next attempts resume until all steps are done."""
    r = cli(
        "submit",
        str(tiny_job),
        "--executor",
        "slurm",
        "--set",
        "slurm.time=1",
        "--set",
        "slurm.signal_grace_s=45",
        "--set",
        "slurm.max_restarts=20",  # attempts train ~130 steps on an idle machine, far fewer under load
        "--set",
        "train.steps=300",
        "--set",
        "train.log_every=20",
        "--follow",
        timeout=1200,
    )
    run = only_run(tmp_path / "runs")
    events = run.events()
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr, events)
    requeues = [e for e in events if e.event == "requeued"]
    resumes = [e for e in events if e.event == "resumed"]
    assert requeues and len(resumes) == len(requeues)
    assert [e.restart for e in resumes] == list(range(1, len(resumes) + 1))
    assert newest_checkpoint(run.checkpoints_dir()).step == 300
    assert len({p.name for p in run.logs_dir.iterdir()}) == len(requeues) + 1  # one log folder per attempt
    st = cli("status", str(run.path))
    assert "requeued" in st.stdout and "state      COMPLETED" in st.stdout


def test_preemption_signal_saves_requeues_and_resumes(slurm_cluster, tiny_job, tmp_path):
    r = cli(
        "submit",
        str(tiny_job),
        "--executor",
        "slurm",
        *TWO_NODES,
        "--set",
        "train.steps=200",
        "--set",
        "train.log_every=10",
    )
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "runs")
    job_id = run.attempts[-1].job_id
    wait_for(lambda: max_step(run) >= 30, 300, "step 30")
    slurm_cluster.run(["scancel", "--signal=USR2", job_id])
    wait_for(lambda: status.run_status(run).state == "COMPLETED", 600, "completion after the requeue")
    kinds = [str(e.event) for e in run.events()]
    assert kinds.index("requeued") < kinds.index("resumed") < kinds.index("completed")
    resumed = next(e for e in run.events() if e.event == "resumed")
    assert resumed.step is not None and resumed.step >= 30 and resumed.job_id == job_id and resumed.restart == 1
    slurm_cluster.wait_sacct_rows(
        job_id, lambda rows: "REQUEUED" in rows and rows[-1] == "COMPLETED", "REQUEUED, COMPLETED last", timeout=60
    )


def test_requeue_refused_falls_back_to_a_follow_up_job(slurm_cluster, tiny_job, tmp_path):
    """With --no-requeue, `scontrol requeue` is refused; rank 0 submits a follow-up job
    (--dependency=afterany) that resumes from the checkpoint just saved."""
    r = cli(
        "submit",
        str(tiny_job),
        "--executor",
        "slurm",
        "--set",
        "slurm.requeue=false",
        "--set",
        "train.steps=150",
        "--set",
        "train.log_every=10",
    )
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "runs")
    first = run.attempts[-1].job_id
    wait_for(lambda: max_step(run) >= 20, 300, "step 20")
    slurm_cluster.run(["scancel", "--signal=USR2", first])
    wait_for(lambda: len(run.attempts) == 2, 120, "the follow-up job")
    second = run.attempts[-1]
    assert second.reason.startswith("follow-up: requeue refused")
    wait_for(lambda: status.run_status(run).state == "COMPLETED", 600, "the follow-up to complete")
    resumed = next(e for e in run.events() if e.event == "resumed")
    assert resumed.job_id == second.job_id and resumed.step is not None and resumed.step >= 20
    assert any(e.event == "follow_up" and e.job_id_next == second.job_id for e in run.events())
    assert newest_checkpoint(run.checkpoints_dir()).step == 150


def test_cancel_logs_follow_and_states(slurm_cluster, tiny_job, tmp_path):
    root = str(tmp_path / "runs")
    # pending: held back by a begin time in the future
    r = cli("submit", str(tiny_job), "--executor", "slurm", "--set", "slurm.extra={begin='now+1hour'}")
    assert r.returncode == 0, r.stderr
    pending = only_run(tmp_path / "runs")
    assert status.run_status(pending).state == "PENDING"
    # failed: a model folder that passes the checks at submit and disappears before the job starts
    missing = weights_folder(tmp_path / "gone")
    r = cli(
        "submit",
        str(tiny_job),
        "--executor",
        "slurm",
        "--set",
        f"model.name_or_path='{missing}'",
        "--set",
        "model.from_config={}",
    )
    shutil.rmtree(missing)
    failed = next(x for x in runfolder.list_runs(root) if x.id != pending.id)
    # running, followed with `logs -f` until it ends
    r = cli("submit", str(tiny_job), "--executor", "slurm", "--set", "train.steps=60")
    running = next(x for x in runfolder.list_runs(root) if x.id not in (pending.id, failed.id))
    wait_for(lambda: status.run_status(running).state == "RUNNING", 120, "RUNNING")
    follow = cli("logs", running.id, "--run-root", root, "-f", timeout=300)
    assert follow.returncode == 0 and "step 60/60" in follow.stdout
    wait_for(lambda: status.run_status(failed).state == "FAILED", 300, "the failed job")
    reason = status.run_status(failed).reason
    assert "FileNotFoundError" in reason and "model.name_or_path" in reason
    assert re.search(r"rank \d on node\d", reason), reason  # the failing rank and its host
    listing = cli("runs", "--run-root", root).stdout
    for run, state in [(pending, "PENDING"), (failed, "FAILED"), (running, "COMPLETED")]:
        line = next(row for row in listing.splitlines() if row.startswith(run.id))
        assert state in line, listing
    c = cli("cancel", pending.id, "--run-root", root)
    assert c.returncode == 0 and "scancel" in c.stdout
    wait_for(lambda: status.run_status(pending).state == "CANCELLED", 60, "CANCELLED")
    assert slurm_cluster.squeue_state(int(pending.attempts[-1].job_id)) == ""


def test_queue_poll_is_one_batched_call_and_copes_without_sacct(slurm_cluster, tiny_job, tmp_path):
    """Wrappers in front of the real squeue/sacct count calls; a PATH without sacct is 'accounting missing'."""
    for _ in range(3):
        assert (
            cli("submit", str(tiny_job), "--executor", "slurm", "--set", "slurm.extra={begin='now+1hour'}").returncode
            == 0
        )
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    for tool in ("squeue", "sacct", "scontrol", "sbatch", "scancel"):
        real = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        (bindir / tool).write_text(f'#!/bin/sh\necho {tool} >> {calls}\nexec {real} "$@"\n')
        (bindir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:/usr/bin:/bin"}
    r = cli("runs", "--run-root", str(tmp_path / "runs"), env=env)
    assert r.returncode == 0 and r.stdout.count("PENDING") == 3
    assert calls.read_text().split() == ["squeue"]
    (bindir / "sacct").unlink()
    for run in runfolder.list_runs(tmp_path / "runs"):
        assert cli("cancel", run.id, "--run-root", str(tmp_path / "runs"), env=env).returncode == 0
    time.sleep(2)
    r = cli("runs", "--run-root", str(tmp_path / "runs"), env=env)
    assert r.returncode == 0 and r.stdout.count("CANCELLED") == 3, r.stdout + r.stderr


@pytest.mark.parametrize(
    "override,message",
    [
        ("slurm.partition=nosuch", "invalid partition"),
        # 5 nodes x 2 tasks on the 2-node, 2-CPU-per-node devcluster: Slurm 22.05 refuses the CPU count
        ("slurm.nodes=5", "more processors requested than permitted"),
        ("slurm.time='2-00:00:00'", "time limit"),
    ],
)
def test_bad_inputs_show_slurms_reason_and_leave_nothing(slurm_cluster, tiny_job, tmp_path, override, message):
    r = cli("submit", str(tiny_job), "--executor", "slurm", "--set", override)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: sbatch refused the job") and message in line.lower(), line
    assert list(runfolder.list_runs(tmp_path / "runs")) == []


def _pids_in_netns(netns: str) -> list[int]:
    inode = os.stat(f"/run/netns/{netns}").st_ino
    out = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(p / "ns" / "net") == f"net:[{inode}]":
                out.append(int(p.name))
        except OSError:
            continue
    return out


def test_node_failure_then_resume_on_the_remaining_node(slurm_cluster, tiny_job, tmp_path):
    """Kills node2's slurmd and every process in its namespace mid-run; the job fails with a reason,
    and `resume` continues from the last complete checkpoint on node1 alone (4 ranks -> 2)."""
    r = cli(
        "submit",
        str(tiny_job),
        "--executor",
        "slurm",
        *TWO_NODES,
        "--set",
        "slurm.requeue=false",
        "--set",
        "train.steps=150",
        "--set",
        "checkpoint.every_steps=20",
    )
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "runs")
    try:
        wait_for(lambda: ckptfolder.find(run.checkpoints_dir()), 300, "a first checkpoint")
        for pid in _pids_in_netns(slurm_cluster.netns[-1]):
            os.kill(pid, signal.SIGKILL)
        st = wait_for(lambda: (s := status.run_status(run)).state in ("FAILED", "NODE_FAIL") and s, 300, "the failure")
        assert st.reason, st
        saved = newest_checkpoint(run.checkpoints_dir()).step
        res = cli(
            "resume",
            run.id,
            "--run-root",
            str(tmp_path / "runs"),
            "--set",
            "slurm.nodes=1",
            "--executor",
            "slurm",
            "--follow",
        )
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr
        assert f"resumes from step {saved}" in res.stdout and "saved by 4 ranks, now 2" in res.stdout
        assert newest_checkpoint(run.checkpoints_dir()).step == 150
    finally:
        subprocess.run(["bash", str(REPO / "slurm" / "devcluster.sh"), "restart"], capture_output=True, timeout=300)
