"""What a run costs (issue 39 item 2): Slurm's TRES strings read, the steps a restart redid found
from the run's events, and `slurm.max_gpu_hours` refusing a plan that passes the budget (validate
and submit) or what is left of it (resume). The figures against a real sacct are in
test_slurm_e2e (fake GPUs count as Slurm accounts them)."""

from __future__ import annotations

import os

import pytest

from clusterfsdp.control import cost
from clusterfsdp.core import budget as budgetmod
from clusterfsdp.core import spec as S
from clusterfsdp.core.records import Event, EventKind, Executor


def test_tres_counts_are_read_and_units_left_out():
    assert cost.parse_tres("billing=4,cpu=4,gres/gpu=2,mem=8000M,node=2") == {
        "billing": 4.0, "cpu": 4.0, "gres/gpu": 2.0, "node": 2.0
    }  # fmt: skip
    assert cost.parse_tres("") == {}


def _event(kind: EventKind, job: str, restart: int, step: int | None) -> Event:
    return Event(kind, job, restart, 0, "node1", 0.0, step=step)


def test_the_steps_a_restart_redid_are_the_ones_past_the_checkpoint_it_resumed_from():
    events = [
        _event(EventKind.START, "10", 0, None),
        _event(EventKind.FAILED, "10", 0, 37),  # died at step 37: 17 steps past the step-20 checkpoint
        _event(EventKind.START, "11", 0, None),
        _event(EventKind.RESUMED, "11", 0, 20),
        _event(EventKind.REQUEUED, "11", 0, 40),  # a save, then requeued: nothing lost
        _event(EventKind.START, "11", 1, None),
        _event(EventKind.RESUMED, "11", 1, 40),
        _event(EventKind.COMPLETED, "11", 1, 60),
    ]
    assert cost.redone(events) == [("10", 0, 17)]


@pytest.mark.parametrize(
    "slurm, refused",
    [
        ("nodes = 2\ngpus_per_node = 4\ntime = 60\nmax_gpu_hours = 8", False),  # exactly the plan
        ("nodes = 2\ngpus_per_node = 4\ntime = 61\nmax_gpu_hours = 8", True),
        ("nodes = 1\ngpus_per_node = 0\ntime = 600\nmax_gpu_hours = 0.5", False),  # CPU-only: no GPU-hours
        ("nodes = 64\ngpus_per_node = 8\ntime = '2-00:00:00'\nmax_gpu_hours = 0", False),  # no budget
    ],
)
def test_a_plan_over_the_budget_is_refused_before_queueing(slurm, refused):
    text = f"[slurm]\n{slurm}\n"
    if refused:
        with pytest.raises(S.SpecError, match=r"slurm.max_gpu_hours = 8: an attempt may use 8.13 GPU-h"):
            S.loads(text)
    else:
        S.loads(text)


def test_resume_counts_what_was_used():
    spec = S.loads("[slurm]\nnodes = 1\ngpus_per_node = 2\ntime = 60\nmax_gpu_hours = 10\n")
    assert S.budget_refusal(spec, used_gpu_hours=8.0) is None
    why = S.budget_refusal(spec, used_gpu_hours=8.5)
    assert why and "1.50 are left (8.50 used)" in why


def test_slurms_pending_reasons_are_said_in_words_and_unknown_ones_kept():
    from clusterfsdp.control import pending

    assert pending.words("Resources") == "Resources: the nodes it needs are busy; it starts when enough are free"
    assert pending.words("QOSMaxGRESPerUser").startswith("QOSMaxGRESPerUser: your QOS's limit on GPUs per user")
    assert pending.words("(Dependency)").startswith("Dependency: it waits for another job")
    assert pending.words("SomethingNew") == "SomethingNew"


def test_the_workers_save_and_stop_when_the_budget_is_used(tmp_path):
    """The budget clock as the batch script's `before` step writes it (budget.json: GPU-seconds
    left, the allocation's GPUs, since when): here 2 "GPUs" (the boundary a CPU machine cannot
    have: the clock only multiplies by the count) with 1 GPU-second left. Real ranks train, stop at
    the next agreement with a blocking checkpoint, and the run is stopped (CANCELLED) with cause `budget`,
    not failed and not requeued."""
    import json
    import time

    from procs import launch, make_run, tiny_job_toml, wait

    from clusterfsdp.control import status as statusmod
    from clusterfsdp.core import ckptfolder

    run = make_run(tiny_job_toml("budget", 0, 400, tail="[slurm]\nmax_gpu_hours = 1\n"), tmp_path / "runs")
    run.add_attempt("t1", Executor.LOCAL, "submit")  # (the job id procs.launch gives the ranks)
    budget = {"left_s": 1.0, "gpus": 2.0, "since": time.time(), "limit_h": 1.0}
    (run.path / budgetmod.BUDGET_FILE).write_text(json.dumps(budget))
    out = wait(launch(["-m", "clusterfsdp.worker", str(run.path)], 2), timeout=300)
    assert all(code == 0 for code, _ in out), out
    (stopped,) = [e for e in run.events() if e.event is EventKind.STOPPED]
    assert stopped.cause == "budget" and "slurm.max_gpu_hours = 1 used up (2 GPU(s)" in stopped.reason
    newest = ckptfolder.find(run.checkpoints_dir())
    assert newest is not None and stopped.step is not None and newest.step == stopped.step < 400
    st = statusmod.run_status(run)
    assert st.state == "CANCELLED" and st.reason.startswith("slurm.max_gpu_hours = 1 used up"), (st.state, st.reason)


# Slurm's accounting of a running sweep, as `sacct -P -X -D -o JobID,AllocTRES,ElapsedRaw,State,ReqTRES,
# TimelimitRaw` prints it: point 0 done (2 GPUs for 1800 s), point 1 running for 600 s of its 60 min
# on 2 GPUs, point 2's array task (the one starting) running for 10 s. ReqTRES as Slurm 22.05 writes
# it on the devcluster: without the GPUs (AllocTRES has them).
SWEEP_SACCT = """4000_0|cpu=4,gres/gpu=2,node=1|1800|COMPLETED|billing=4,cpu=4,mem=2000M,node=1|60
4000_1|cpu=4,gres/gpu=2,node=1|600|RUNNING|billing=4,cpu=4,mem=2000M,node=1|60
4000_2|cpu=4,gres/gpu=2,node=1|10|RUNNING|billing=4,cpu=4,mem=2000M,node=1|60
"""


@pytest.mark.parametrize("limit_h, left_s", [(4.0, 3600.0), (2.5, -1800.0)])
def test_a_sweeps_points_share_its_budget(tmp_path, monkeypatch, limit_h, left_s):
    """slurm.max_gpu_hours of a sweep bounds its points together: the budget clock the batch
    script's `before` step gives a starting point takes off what the other points used (point 0:
    1.00 GPU-h) and what they hold (point 1, running: its 2 GPUs x 60 min less the 600 s used).
    With 4 h, 1 GPU-h is left for the starting point; with 2.5 h nothing is: it gives up at once
    (cause budget, its reason naming the sweep) and trains nothing. sacct is a stub on PATH (the
    GPUs and times of a sweep in flight cannot be staged on this machine's Slurm)."""
    from tui_helpers import make_run

    from clusterfsdp.control import jobstep
    from clusterfsdp.control.sweepfolder import SweepFolder
    from clusterfsdp.core.records import SweepPoint, SweepRecord

    root = tmp_path / "runs"
    points = [SweepPoint(i, f"cd-p{i}", {"train.lr": 1e-3 * (i + 1)}) for i in range(3)]
    runs = [make_run(root, p.run_id, name="tiny-swcd", executor="slurm", job_id=f"4000_{p.index}") for p in points]
    SweepFolder(root / "tiny-swcd").write_record(SweepRecord("swcd", "tiny", Executor.SLURM, 1.0, ["train.lr"], points))
    spec = runs[2].spec()
    spec.slurm.gpus_per_node, spec.slurm.time, spec.slurm.max_gpu_hours = 2, "60", limit_h
    runs[2].job_toml.write_text(S.dumps(spec))
    (tmp_path / "sacct.txt").write_text(SWEEP_SACCT)
    stub = tmp_path / "bin" / "sacct"
    stub.parent.mkdir()
    stub.write_text('#!/bin/bash\nids=",$(echo "$*" | sed -n "s/.*-j \\([^ ]*\\).*/\\1/p'"\"),\"\n"
                    'while IFS="|" read -r id tres rest; do\n  [[ "$ids" == *",$id,"* ]] || continue\n'
                    '  [[ "$*" == *"-o AllocTRES"* ]] && echo "$tres" || echo "$id|$tres|$rest"\n'
                    f'done < {tmp_path / "sacct.txt"}\n')  # fmt: skip
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub.parent}:{os.environ['PATH']}")
    started = jobstep.before(runs[2], jobstep.SlurmJob("4000_2", 0, "node1"))
    budget = budgetmod.read_budget(runs[2])
    assert budget is not None and (budget.left_s, budget.gpus, budget.sweep) == (left_s, 2.0, "swcd")
    if left_s > 0:
        assert started == 0 and not [e for e in runs[2].events() if e.event is EventKind.GAVE_UP]
    else:
        (gave_up,) = [e for e in runs[2].events() if e.event is EventKind.GAVE_UP]
        assert started == 1 and gave_up.cause == "budget", gave_up
        assert gave_up.reason.startswith("slurm.max_gpu_hours = 2.5 of sweep swcd used up (what its points used")


def test_a_shorter_time_limit_is_suggested_only_when_slurms_test_starts_it_earlier(tmp_path, monkeypatch):
    """`sbatch --test-only --time=N` of the job's batch script, for the job's limit halved, then
    quartered, then an eighth: the longest that Slurm says starts earlier is suggested, with both
    times; none when no shorter limit helps. sbatch is a stub answering as Slurm 22.05 does (on
    stderr): limits of 15 min or less fit a backfill window that ends at 01:00 here."""
    from clusterfsdp.control import pending

    stub = tmp_path / "bin" / "sbatch"
    stub.parent.mkdir()
    stub.write_text(
        '#!/bin/bash\necho "$*" >> "$FAKE_CALLS"\nwhen=2026-11-28T01:00:00\n'
        'for a in "$@"; do case "$a" in --time=*) [ "${a#--time=}" -le 15 ] && when=2026-11-28T00:05:00;; esac; done\n'
        'echo "sbatch: Job 77 to start at $when using 4 processors on nodes node[1-2] in partition debug" >&2\n'
    )
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CALLS", str(tmp_path / "calls"))
    script = tmp_path / "sbatch.sh"
    script.write_text("#!/bin/bash\n#SBATCH --time=60\n")
    tip = pending.shorter_time(script, 60)
    assert tip == (
        "--set slurm.time=15 would start it at 2026-11-28 00:05:00, not 2026-11-28 01:00:00 (sbatch --test-only: "
        "backfill fits a job that ends sooner)"
    )
    assert (tmp_path / "calls").read_text().split("\n")[:3] == [f"--test-only {script}",
        f"--test-only --time=30 {script}", f"--test-only --time=15 {script}"]  # fmt: skip
    assert pending.shorter_time(script, 60, start="2026-11-28 00:01:00") == ""  # no earlier start: nothing said
    assert pending.shorter_time(script, 200) == ""  # 100, 50 and 25 min: none fits the window
    # a limit that runs into a reservation: Slurm's test finds no start for it (as Slurm 22.05 says it)
    stub.write_text(stub.read_text().replace("when=2026-11-28T01:00:00\n", 'when=""\n').replace(
        'echo "sbatch: Job', '[ -z "$when" ] && { echo "allocation failure: Requested node configuration is not '
        'available" >&2; exit 1; }\necho "sbatch: Job'))  # fmt: skip
    assert pending.shorter_time(script, 60) == (
        "--set slurm.time=15 would start it at 2026-11-28 00:05:00 (sbatch --test-only; with its 60 min Slurm finds "
        "no start: allocation failure: Requested node configuration is not available)"
    )


def test_the_budget_clock_counts_the_allocations_gpus_before_accounting_lists_the_job(tmp_path, monkeypatch):
    """slurmdbd records a job after the controller started it: the batch script's first step can
    find no sacct row for its own job. The clock then took 0 GPUs and never ran down (a clean-clone
    CI run's two-node test); it now takes the allocation's GPUs the batch script knows
    (SLURM_JOB_NUM_NODES x slurm.gpus_per_node). sacct is a stub on PATH that lists nothing."""
    from tui_helpers import make_run

    stub = tmp_path / "bin" / "sacct"
    stub.parent.mkdir()
    stub.write_text("#!/bin/bash\nexit 0\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub.parent}:{os.environ['PATH']}")
    run = make_run(tmp_path, end=None)
    budget = cost.write_budget(run, "4242", 10.0, 1000.0, plan_s=0.0, gpus_hint=4.0)
    assert (budget.gpus, budget.left_s, budget.limit_h) == (4.0, 36000.0, 10.0)
    assert budgetmod.read_budget(run) == budget
