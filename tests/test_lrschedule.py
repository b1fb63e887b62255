"""The learning-rate curve and what a resume with changed [train] settings does to it
(core/lrschedule.py, pure Python). The real resumes are in test_checkpoint.py."""

from __future__ import annotations

import itertools
import math

import pytest

from clusterfsdp.core import ckptfolder
from clusterfsdp.core import lrschedule as L
from clusterfsdp.core.spec import TrainSection


def closed_form(step: int, t: TrainSection) -> float:
    """The schedule as the worker computed it before curves were recorded (warmup + decay)."""
    if step < t.warmup:
        return (step + 1) / (t.warmup + 1)
    if t.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - t.warmup) / max(1, t.steps - t.warmup))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if t.schedule == "cosine" else 1 - progress
    return t.min_lr_ratio + (1 - t.min_lr_ratio) * decay


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
@pytest.mark.parametrize("warmup", [0, 1, 10])
def test_the_planned_curve_is_the_closed_form_bit_for_bit(schedule, warmup):
    t = TrainSection(steps=200, warmup=warmup, schedule=schedule, min_lr_ratio=0.1)
    curve = L.planned(L.LrPlan.of(t))
    assert [curve.factor(s) for s in range(260)] == [closed_form(s, t) for s in range(260)]
    assert L.LrCurve.from_json(curve.to_json()) == curve


def test_a_resume_with_the_same_settings_keeps_the_curve():
    t = TrainSection(steps=200)
    curve = L.planned(L.LrPlan.of(t))
    for policy in L.ResumeSchedule:
        assert L.reshape(curve, t, 120, policy) == curve
        assert L.describe(curve, L.reshape(curve, t, 120, policy), 120, t.lr, policy) == ""


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
@pytest.mark.parametrize(("old", "new", "at"), [(200, 260, 200), (300, 200, 150), (200, 400, 50), (200, 120, 100)])
def test_continue_never_raises_the_lr_and_ends_at_the_end_lr(schedule, old, new, at):
    t_old = TrainSection(steps=old, warmup=10, schedule=schedule)
    t_new = TrainSection(steps=new, warmup=10, schedule=schedule)
    curve = L.reshape(L.planned(L.LrPlan.of(t_old)), t_new, at, L.ResumeSchedule.CONTINUE)
    lrs = [curve.factor(s) for s in range(at, new + 1)]
    assert lrs[0] == pytest.approx(closed_form(at, t_old))  # no jump at the resumed step
    assert all(b <= a for a, b in itertools.pairwise(lrs)), lrs
    end = 1.0 if schedule == "constant" else 0.1
    assert lrs[-1] == pytest.approx(min(end, lrs[0]))


def test_the_other_choices():
    t_old, t_new = TrainSection(steps=200, warmup=10), TrainSection(steps=260, warmup=10)
    old = L.planned(L.LrPlan.of(t_old))
    keep = L.reshape(old, t_new, 200, L.ResumeSchedule.KEEP)
    assert [keep.factor(s) for s in range(260)] == [old.factor(s) for s in range(260)]
    rewarm = L.reshape(old, t_new, 200, L.ResumeSchedule.REWARM)
    assert rewarm.factor(199) == old.factor(199)  # the past is as it was
    assert rewarm.factor(200) > old.factor(200) and rewarm.factor(210) == 1.0 and rewarm.factor(260) == 0.1
    stretch = L.reshape(old, t_new, 200, L.ResumeSchedule.STRETCH)
    assert [stretch.factor(s) for s in range(300)] == [closed_form(s, t_new) for s in range(300)]


def test_the_resume_says_what_the_lr_becomes():
    """The case of the issue: a completed 200-step run (lr 3e-4, min ratio 0.1) extended to 260."""
    old = L.planned(L.LrPlan.of(TrainSection(steps=200)))
    new = L.reshape(old, TrainSection(steps=260), 200, L.ResumeSchedule.CONTINUE)
    text = L.describe(old, new, 200, 3e-4, "continue")
    assert text.startswith("learning rate: train.steps 200 -> 260 since the checkpoint; train.resume_schedule")
    assert "from step 200 the lr stays at 3.00e-05 to step 260" in text and "rewarm" in text
    rewarm = L.reshape(old, TrainSection(steps=260), 200, L.ResumeSchedule.REWARM)
    text = L.describe(old, rewarm, 200, 3e-4, "rewarm")
    assert "warms up from 5.45e-05 at step 200 to 3.00e-04 at step 210, then decays (cosine)" in text


def test_a_checkpoint_from_before_recorded_curves_uses_its_job_toml(tmp_path):
    """Checkpoints written before this change carry no curve: the plan comes from their job.toml;
    `clusterfsdp resume` says what the curve becomes."""
    (tmp_path / "job.toml").write_text("[train]\nsteps = 200\nwarmup = 10\n")
    old = L.recorded({"step": 200}, tmp_path)
    assert old is not None and old == L.planned(L.LrPlan.of(TrainSection(steps=200, warmup=10)))
    new = L.reshape(old, TrainSection(steps=260), 200, L.ResumeSchedule.CONTINUE)
    assert [new.factor(s) for s in range(200, 261)] == pytest.approx([0.1] * 61)
    (note,) = L.resume_notes(ckptfolder.CheckpointInfo(tmp_path, 200, {"step": 200}), TrainSection(steps=260))
    assert "train.steps 200 -> 260" in note and "stays at 3.00e-05 to step 260" in note
    assert L.recorded({"step": 1}, tmp_path / "missing") is None
