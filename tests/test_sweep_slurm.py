"""A sweep on the real devcluster (slurm/devcluster.sh): one job array whose tasks each train
their own point's run folder, throttled by `%N`, watched with `status SWEEP --json`."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from slurm_fixtures import bounded

from clusterfsdp.control import status
from clusterfsdp.control.sweepfolder import all_sweeps
from clusterfsdp.core import ckptfolder

pytestmark = pytest.mark.slurm  # the first devcluster's chain (the two chains are balanced by time)


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clusterfsdp.cli", *args], capture_output=True, text=True,
                          timeout=bounded(timeout))  # fmt: skip


def test_grid_is_one_throttled_job_array_of_runs(slurm_cluster, tiny_job, tmp_path):
    """A 2x2 grid with --max-parallel 1: one sbatch (`--array=0-3%1`), point i trains in run
    folder <sweep>-p<i> as array task <array>_<i>, never two tasks at once (sacct's start and end
    times), all four COMPLETED, and `status SWEEP --json` lists each point's values, state and
    loss, sorted by loss. A second sweep, in the preemptible partition: one point preempted comes
    back by itself (its array task requeued), then `cancel SWEEP` stops both after a save."""
    root = tmp_path / "runs"
    r = cli("sweep", str(tiny_job), "--executor", "slurm", "--grid", "train.lr=1e-3,3e-3",
            "--grid", "train.micro_batch_size=2,4", "--max-parallel", "1", "--set", "slurm.tasks_per_node=1",
            "--set", "train.steps=3", "--set", "train.log_every=1", "--set", "slurm.signal_grace_s=20")  # fmt: skip
    assert r.returncode == 0, r.stderr
    (sweep,) = all_sweeps(root)
    record = sweep.record()
    assert record.job_id and [p.run_id for p in record.points] == [f"{sweep.id[2:]}-p{i}" for i in range(4)]
    script = (sweep.submitit_dir / f"{record.job_id}_submission.sh").read_text()
    assert "#SBATCH --array=0-3%1" in script
    folders = [sweep.run_folder(p) for p in record.points]
    assert [f.record().attempts[0].job_id for f in folders] == [f"{record.job_id}_{i}" for i in range(4)]

    def done() -> bool:
        return all(status.run_status(f).state.final for f in folders)

    # a second sweep, endless, in the preemptible partition, for the preemption and cancel: queued once
    # the first has ended, so that its points do not train (a core each) while the first's points run
    slurm_cluster.wait_for("every point to end", done, timeout=bounded(240), interval=1.0)
    r = cli("sweep", str(tiny_job), "--executor", "slurm", "--grid", "train.lr=1e-3,3e-3",
            "--set", "slurm.partition=low", "--set", "slurm.tasks_per_node=1", "--set", "train.steps=100000",
            "--set", "train.log_every=1")  # fmt: skip
    assert r.returncode == 0, r.stderr
    fields = "JobID,State,Start,End,AllocTRES,ElapsedRaw"
    rows = slurm_cluster.run(["sacct", "-n", "-X", "-P", "-j", record.job_id, "-o", fields]).stdout
    tasks = sorted(line.split("|") for line in rows.splitlines() if line.strip())
    assert [(t[0], t[1]) for t in tasks] == [(f"{record.job_id}_{i}", "COMPLETED") for i in range(4)], tasks
    spans = sorted((datetime.fromisoformat(t[2]), datetime.fromisoformat(t[3])) for t in tasks)
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans)), spans  # never two

    st = cli("status", sweep.id[:-1], "--run-root", str(root), "--json", "--sort", "loss")
    assert st.returncode == 0, st.stderr
    doc = json.loads(st.stdout)
    points = doc["points"]
    assert sorted(p["index"] for p in points) == [0, 1, 2, 3] and doc["job_id"] == record.job_id
    assert all(p["state"] == "COMPLETED" and p["step"] == 3 and p["loss"] > 0 for p in points)
    assert [p["loss"] for p in points] == sorted(p["loss"] for p in points)
    cpu_s = [dict(kv.split("=") for kv in t[4].split(","))["cpu"] for t in tasks]  # what sacct charged each task
    charged = sum(int(c) * int(t[5]) for c, t in zip(cpu_s, tasks, strict=True)) / 3600
    assert doc["cost"] == {"gpu_hours": 0.0, "cpu_hours": round(charged, 6), "unknown_points": 0}, (doc["cost"], tasks)
    assert {(p["values"]["train.lr"], p["values"]["train.micro_batch_size"]) for p in points} == {
        (1e-3, 2), (1e-3, 4), (3e-3, 2), (3e-3, 4)}  # fmt: skip
    for p in points:  # each point trained with its own values, in its own folder
        job = Path(p["folder"], "job.toml").read_text()
        assert f"micro_batch_size = {p['values']['train.micro_batch_size']}" in job

    # one point preempted by a job in `high` on its node: it saves, its array task is requeued and resumes
    (endless,) = [s for s in all_sweeps(root) if s.id != sweep.id]
    array = endless.record().job_id
    preempted, other = (endless.run_folder(p) for p in endless.record().points)
    slurm_cluster.wait_for("point 0 to train", preempted.metrics, timeout=bounded(120), interval=1.0)
    node = slurm_cluster.run(["squeue", "-h", "-j", f"{array}_0", "-o", "%N"]).stdout.strip()
    slurm_cluster.sbatch(["-p", "high", "-w", node, "--exclusive", "-o", "/dev/null", "--wrap", "sleep 3"])

    def resumed():
        return next((e for e in preempted.events() if e.event == "resumed" and e.restart == 1), None)

    back = slurm_cluster.wait_for("point 0 to come back", resumed, timeout=bounded(150), interval=1.0)
    (requeued,) = [e for e in preempted.events() if e.event == "requeued"]
    assert (requeued.cause, requeued.job_id, back.job_id, back.step) == ("preempted", f"{array}_0", f"{array}_0",
                                                                         requeued.step)  # fmt: skip
    assert len(preempted.record().attempts) == 1  # the same array task, requeued: no new job

    # cancel: every live point saves and stops; a sweep is one line in `runs`
    c = cli("cancel", endless.id, "--run-root", str(root))
    assert c.returncode == 0 and c.stdout.count("scancel") == 2, c.stdout + c.stderr
    for folder in (preempted, other):
        slurm_cluster.wait_for("the cancel", lambda f=folder: status.run_status(f).state == "CANCELLED", timeout=60)
    stopped = [e for e in preempted.events() if e.event == "stopped"]
    assert stopped and stopped[-1].cause == "cancelled" and Path(stopped[-1].checkpoint).is_dir()  # saved first
    listing = cli("runs", "--run-root", str(root)).stdout.splitlines()
    listing = [line for line in listing if not line.startswith("cost ")]  # (a line per user: what they cost)
    assert len(listing) == 2 and any(line.startswith(endless.id) and "2 CANCELLED" in line for line in listing)

    # resume: every unfinished point again, from its own save, as a single job of its run (no array)
    r = cli("resume", endless.id, "--run-root", str(root))
    assert r.returncode == 0 and r.stdout.count("resumes from step") == 2, r.stdout + r.stderr
    for folder in (preempted, other):
        last, saved = folder.record().attempts[-1], ckptfolder.find(folder.checkpoints_dir())
        assert last.job_id.isdigit() and saved is not None and last.resume_step == saved.step
