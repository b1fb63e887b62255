"""Elastic starts on the devcluster's real daemons (issue 39 item 3): a `slurm.nodes = "1-2"` run
starts on the one node another job leaves free, and when that job ends rank 0's sinfo check finds
the node, the ranks save and the job requeues itself, to resume on both nodes with half the
gradient accumulation (the same global batch). The job asks `--time-min` too: Slurm takes it."""

from __future__ import annotations

import time

import pytest
from procs import losses, make_run, run_workers
from test_slurm_e2e import assert_every_attempt_is_submitits, cli, logged_steps, only_run, wait_for

from clusterfsdp.control import doctor, noderecord, status
from clusterfsdp.core import slurmcli

pytestmark = pytest.mark.slurm(cluster="b")  # the second devcluster's half (tests/slurm_fixtures.py)
# Steps of 64 samples x 128 tokens (0.4 s on a loaded 2-core VM), enough of them to still be training on
# one node when the grow is found (two sinfo checks 5 s apart, from the Trainer's start: 25-30 steps), few
# enough that the runs' tiny reduction-order differences stay within the tolerance (cheap steps drifted
# past it within 100 steps: a noisy batch of 8 amplifies them)
STEPS, LOG_EVERY = 80, 5


@pytest.mark.timeout(1200)
def test_a_node_range_starts_on_the_free_node_and_grows_onto_both(slurm_cluster, tiny_job, tmp_path):
    """Every step is trained once (the grow saves at the step it stops at: none redone) and the
    losses are a 2-node run's within the reduction-order tolerance (abs 2e-4, as in
    tests/test_parallel.py): the reference is the same job.toml with `slurm.nodes = 2` trained by 4
    local gloo ranks (the 2-node layout: a 2 x 2 HSDP mesh, the same global batch)."""
    blocker = slurm_cluster.sbatch(["--nodes=1", "--exclusive", "--time=10", "--wrap", "sleep 900", "-o", "/dev/null"])
    wait_for(lambda: slurm_cluster.squeue_state(blocker) == "RUNNING", 30, "the blocking job to run")
    sets = ["slurm.nodes='1-2'", "slurm.grow_check_s=5", "slurm.time_min=5", "fsdp.sharding='hybrid'",
            "train.grad_accum=2", f"train.steps={STEPS}", f"train.log_every={LOG_EVERY}"]  # fmt: skip
    r = cli("submit", str(tiny_job), "--executor", "slurm", *[a for s in sets for a in ("--set", s)])
    assert r.returncode == 0, r.stderr
    run = only_run(tmp_path / "runs")
    job_id = run.attempts[-1].job_id
    script = (run.submitit_dir / job_id / f"{job_id}_submission.sh").read_text()
    assert {"#SBATCH --nodes=1-2", "#SBATCH --time-min=5", "#SBATCH --time=10"} <= set(script.splitlines())
    wait_for(lambda: slurm_cluster.squeue_state(int(job_id)) == "RUNNING", 120, "the run to start on the free node")
    freed = time.time()
    slurm_cluster.run(["scancel", str(blocker)])
    first = wait_for(lambda: next((e for e in run.events() if e.event == "start"), None), 300, "the start on 1 node")
    assert (first.nodes, first.world_size) == (1, 2)
    grown = wait_for(lambda: next((e for e in run.events() if e.event == "start" and e.restart == 1), None), 300,
                     "the start on 2 nodes")  # fmt: skip
    wait_for(lambda: status.run_status(run).state == "COMPLETED", 600, "completion on 2 nodes")
    (requeued,) = [e for e in run.events() if e.event == "requeued"]
    (resumed,) = [e for e in run.events() if e.event == "resumed"]
    assert (requeued.cause, requeued.job_id, requeued.restart) == ("grow", job_id, 0)
    assert "growing from 1 to 2 node(s) of slurm.nodes = '1-2' (grow 1 of slurm.max_grows = 2)" in requeued.reason
    assert (resumed.job_id, resumed.restart, resumed.step) == (job_id, 1, requeued.step)  # no step redone
    assert (grown.nodes, grown.world_size) == (2, 4) and 0 < (requeued.step or 0) < STEPS
    assert len(run.attempts) == 1  # the same job, requeued: one batch script, submitit's
    assert_every_attempt_is_submitits(run)
    assert logged_steps(run) == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))  # every step once
    before = (run.logs_dir / f"{job_id}.0" / "rank0.log").read_text()
    assert "slurm.nodes = '1-2': on 1 node(s) with train.grad_accum = 4 (global batch 64)" in before, before[-2000:]
    log = (run.logs_dir / f"{job_id}.1" / "rank0.log").read_text()
    assert "slurm.nodes = '1-2': on 2 node(s) with train.grad_accum = 2 (global batch 64)" in log
    assert "saved by 2 ranks, now 4" in log and "mesh (2, 2) (hybrid, FSDP2)" in log, log[-2000:]
    out = cli("status", str(run.path)).stdout
    assert "  size     (restart 0) 1 node(s) x 2 = 2 ranks\n  size     (restart 1) 2 node(s) x 2 = 4 ranks" in out
    assert "ended    (restart 0) requeued (grow): node" in out, out
    (earlier,) = doctor.diagnose(run).earlier  # a grow is no failure
    assert earlier.startswith(f"job {job_id}.0: none: node"), earlier
    print(f"\ngrow: found and saved at step {requeued.step}, {requeued.time - freed:.1f} s after the node was freed; "
          f"training again on 2 nodes {grown.time - freed:.1f} s after; 0 steps redone")  # fmt: skip
    reference = make_run(run.job_toml.read_text(), tmp_path / "ref", ["slurm.nodes=2"])
    run_workers(reference, 4)
    want, got = losses(reference), losses(run)
    print(f"losses: largest difference from the 2-node run {max(abs(got[s] - want[s]) for s in got):.2e}")
    assert sorted(got) == sorted(want) == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    assert all(got[s] == pytest.approx(want[s], abs=2e-4) for s in got), [(s, got[s], want[s]) for s in got]


def test_node_exclusions_of_a_range_leave_its_least_size(slurm_cluster, tiny_job, tmp_path):
    """With both nodes quarantined in the node record, a fixed 2-node job excludes neither (it
    could not fit), while a `1-2` range excludes the newer-marked one and keeps one node: the rule
    'never exclude so many that it cannot fit' counts the range's least size."""
    path = noderecord.record_path(tmp_path / "runs", slurmcli.cluster_name())
    noderecord.mark(path, ["node1"], reason="old mark", cause="hang", run="r1")
    noderecord.mark(path, ["node2"], reason="new mark", cause="hang", run="r2")
    synthetic = ["--set", "data.source=synthetic", "--set", "data.paths=[]", "--dry-run"]
    r = cli("submit", str(tiny_job), "--set", "slurm.nodes=2", *synthetic)
    assert r.returncode == 0 and "--exclude" not in r.stdout, r.stdout + r.stderr
    r = cli("submit", str(tiny_job), "--set", "slurm.nodes='1-2'", *synthetic)
    assert r.returncode == 0 and "#SBATCH --exclude=node2" in r.stdout, r.stdout + r.stderr
