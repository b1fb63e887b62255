"""The numerical guard (worker/numguard.py, train.guard): bad steps skipped on every rank, a
rollback after bad steps in a row that ends equal to a run whose data order never held their
samples, and the skip kept across resumes.

The runs are real: two gloo ranks each (tests/procs.py) on the tiny fp32 job, so that runs
compare bitwise. A NaN loss is injected by tests/poison_worker.py (the real worker otherwise)
for chosen positions of the data order: only the rank that reads such a sample sees it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from procs import launch, make_run, tiny_job_toml, wait

from clusterfsdp.control import status
from clusterfsdp.control.status import guard_note
from clusterfsdp.core import ckptfolder, runfolder
from clusterfsdp.core import spec as S
from clusterfsdp.core.records import EventKind
from clusterfsdp.core.spec.schema import Guard
from clusterfsdp.data.samples import Skipped
from clusterfsdp.worker.main import ENV_LOG_ALL_RANKS
from clusterfsdp.worker.numguard import NumGuard, Verdict

POISON = str(Path(__file__).parent / "poison_worker.py")
# 2 ranks x micro-batch 2: step s reads positions [4(s-1), 4s), rank 1 the last two of them.
ISOLATED = 7  # step 2, rank 1: skipped, no rollback
STREAK = (22, 26)  # steps 6 and 7, rank 1: two bad steps in a row, back to the checkpoint of step 4
JOB = tiny_job_toml(
    "guard",
    seed=3,
    steps=10,
    fsdp='sharding = "full"',
    tail="""
[slurm]
tasks_per_node = 2
[checkpoint]
every_steps = 4
keep_last = 5
[train.guard]
rollback_after = 2
""",
)


def test_skipped_ranges_take_positions_out_of_the_order():
    skipped = Skipped.of([[5, 8], [20, 24], [6, 10]])
    assert skipped.ranges == ((5, 10), (20, 24))
    kept = [p for p in range(40) if not (5 <= p < 10 or 20 <= p < 24)]
    assert [skipped.raw(p) for p in range(len(kept))] == kept
    # positions read 12..17 are 17..19 and 24..26: added in two pieces, merged with the old ranges
    more = skipped.plus(12, 18)
    assert more.ranges == ((5, 10), (17, 27))
    assert [more.raw(p) for p in range(12)] == [skipped.raw(p) for p in range(12)]  # before it: unchanged
    assert more.raw(12) == skipped.raw(18) == 27


def test_the_verdicts():
    log: list[str] = []
    guard = NumGuard(Guard(spike_grad_norm=3.0, spike_window=3, rollback_after=2), log.append, lambda *a, **k: None)
    loss = torch.tensor(2.0)
    assert guard.judge(loss, torch.tensor(float("nan"))) is Verdict.NONFINITE
    assert guard.judge(loss, torch.tensor(float("inf"))) is Verdict.NONFINITE
    assert [guard.judge(loss, torch.tensor(v)) for v in (1.0, 100.0, 2.0)] == [Verdict.OK] * 3  # warm-up
    assert guard.judge(loss, torch.tensor(6.5)) is Verdict.GRAD_NORM_SPIKE  # > 3 x median(1, 100, 2)
    assert guard.judge(loss, torch.tensor(5.9)) is Verdict.OK
    for step in (1, 2):
        guard.record(Verdict.NONFINITE, step, 4 * step - 4, 4 * step, torch.tensor(float("nan")))
    assert guard.streak.steps == 2 and guard.streak.first_step == 1 and guard.rollback_due()
    assert guard.row() == {"skipped": "nonfinite"} and "step 2 skipped (nonfinite" in log[-1]
    guard.record(Verdict.OK, 3, 8, 12, torch.tensor(1.0))
    assert not guard.rollback_due() and guard.row() == {}
    off = NumGuard(Guard(nonfinite=False), log.append, lambda *a, **k: None)
    assert off.judge(loss, torch.tensor(float("nan"))) is Verdict.OK
    with pytest.raises(S.SpecError, match=r"train\.guard\.spike_loss: must be 0 \(off\) or > 1"):
        S.loads(JOB, ["train.guard.spike_loss=0.5"])


def _rows(run: runfolder.RunFolder) -> list[dict[int, dict]]:
    """metrics.jsonl split where the step goes backwards (a rollback): step -> row."""
    out: list[dict[int, dict]] = [{}]
    for r in run.metrics():
        if out[-1] and r["step"] <= max(out[-1]):
            out.append({})
        out[-1][r["step"]] = r
    return out


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat = checkpoint.parent / f"{checkpoint.name}.pt"
    dcp_to_torch_save(checkpoint, flat)
    return torch.load(flat, weights_only=False)["model"]


def test_poisoned_samples_are_skipped_by_every_rank_and_a_rollback_ends_as_a_run_without_them(tmp_path):
    """Run A reads the poisoned positions; run B (the reference) is the same job with positions
    20-27 taken out of its data order before step 1. Then A resumes from the checkpoint it rolled
    back to, with the poison still there."""
    poisoned, reference = make_run(JOB, tmp_path), make_run(JOB, tmp_path)
    env = {"CLUSTERFSDP_TEST_POISON": ",".join(map(str, (ISOLATED, *STREAK))), ENV_LOG_ALL_RANKS: "1"}
    procs = launch([POISON, str(poisoned.path)], 2, "a", env)
    procs += launch([POISON, str(reference.path)], 2, "b", {**env, "CLUSTERFSDP_TEST_SKIP": "20-28"})
    out = wait(procs)
    assert all(code == 0 for code, _ in out), "\n".join(text[-3000:] for _, text in out)

    # step 2: rank 1 alone read the poisoned sample; both ranks skipped the update (and the final
    # weights below are finite: no rank applied a NaN update to its shard)
    for rank in (0, 1):
        (log,) = poisoned.path.glob(f"logs/*/rank{rank}.log")
        assert "numerical guard: step 2 skipped (nonfinite" in log.read_text()
    events = poisoned.events()
    assert [e.step for e in events if e.event is EventKind.BAD_STEP] == [2, 6, 7]
    (back,) = [e for e in events if e.event is EventKind.ROLLBACK]
    assert back.step == 4 and back.checkpoint.endswith("step-00000004") and "positions 20-27" in back.reason
    assert [e.step for e in reference.events() if e.event is EventKind.BAD_STEP] == [2]
    assert "numerical guard: 3 step(s) skipped, 1 rollback(s)" in guard_note(events)

    before, after = _rows(poisoned)
    (ref,) = _rows(reference)
    assert sorted(before) == list(range(1, 8)) and sorted(after) == list(range(5, 11))
    assert before[2]["skipped"] == ref[2]["skipped"] == "nonfinite" and math.isnan(before[2]["loss"])
    assert [before[s]["skipped"] for s in (6, 7)] == ["nonfinite"] * 2
    # bitwise: the rollback restored everything and skipped exactly those samples
    same = [(rows, step) for rows, steps in ((before, (1, 3, 4, 5)), (after, range(5, 11))) for step in steps]
    keys = ("loss", "grad_norm", "lr")
    for rows, step in same:
        assert [rows[step][k] for k in keys] == [ref[step][k] for k in keys], step

    final = ckptfolder.find(poisoned.checkpoints_dir())
    final_ref = ckptfolder.find(reference.checkpoints_dir())
    assert final is not None and final_ref is not None and final.step == final_ref.step == 10
    weights, weights_ref = _weights(final.path), _weights(final_ref.path)
    assert weights.keys() == weights_ref.keys()
    for name, w in weights.items():
        assert torch.isfinite(w).all() and torch.equal(w, weights_ref[name]), name

    # the skip is kept: in the checkpoints after the rollback and in the one it went back to
    rolled_to = ckptfolder.find(poisoned.checkpoints_dir(), 4)
    assert rolled_to is not None
    assert rolled_to.meta["skipped"] == final.meta["skipped"] == final_ref.meta["skipped"] == [[20, 28]]
    # a later resume from the checkpoint it went back to skips them too: no new bad step, the same rows
    ckptfolder.keep_only_up_to(poisoned.checkpoints_dir(), 4)
    out = wait(launch([POISON, str(poisoned.path)], 2, "c", env))
    assert all(code == 0 for code, _ in out), "\n".join(text[-3000:] for _, text in out)
    assert [e.step for e in poisoned.events() if e.event is EventKind.BAD_STEP] == [2, 6, 7]
    *_, resumed = _rows(poisoned)
    assert sorted(resumed) == list(range(5, 11))
    for step in resumed:
        assert [resumed[step][k] for k in keys] == [ref[step][k] for k in keys], step


def test_a_diverging_run_is_warned_about_and_spiking_steps_are_skipped(tmp_path):
    """lr 0.9 in fp32 sends the loss from ~5.5 to ~18 in one step. With the default guard the run
    completes, but no longer without a word: a `warning` event, the log line, and a line of
    `status` (train.guard.warn_rise). With spike_loss set, the same steps are skipped for real:
    every step after the first reads above 2x the median of the accepted one, no update is made,
    and without rollbacks (rollback_after = 0) the run completes with them skipped. Two real
    1-rank runs side by side, the only difference the guard."""
    diverging = ["slurm.tasks_per_node=1", "train.lr=0.9", "train.warmup=0", "train.schedule=constant"]
    job = tiny_job_toml("diverge", seed=1, steps=5)
    default = make_run(job, tmp_path / "default", diverging)
    spikes = ["train.guard.spike_loss=2.0", "train.guard.spike_window=1", "train.guard.rollback_after=0"]
    skipping = make_run(job, tmp_path / "spikes", [*diverging, *spikes])
    out = wait(launch(["-m", "clusterfsdp.worker", str(default.path)], 1, "d") +
               launch(["-m", "clusterfsdp.worker", str(skipping.path)], 1, "s"))  # fmt: skip
    assert all(code == 0 for code, _ in out), "\n".join(text[-3000:] for _, text in out)

    rows = {r["step"]: r for r in default.metrics()}
    assert rows[2]["loss"] > 3 * rows[1]["loss"] and "skipped" not in rows[2]  # diverged, nothing skipped
    (warning,) = [e for e in default.events() if e.event is EventKind.WARNING]
    assert warning.step == 2 and "the loss rose to" in warning.reason and "lower train.lr" in warning.reason
    assert "warning: the loss rose to" in out[0][1]
    assert f"warning (step 2): {warning.reason}" in status.run_status(default).notes

    skipped = [e for e in skipping.events() if e.event is EventKind.BAD_STEP]
    assert [e.step for e in skipped] == [2, 3, 4, 5] and all("loss_spike" in e.reason for e in skipped)
    assert [r.get("skipped") for r in skipping.metrics()] == [None] + ["loss_spike"] * 4
    assert skipping.events()[-1].event is EventKind.COMPLETED
