"""The learning-rate curve of a run, and what a resume with changed `[train]` settings (steps,
schedule, warmup, min_lr_ratio) does to it (`train.resume_schedule`). Pure Python: the worker
sets the lr from it at every step; `clusterfsdp resume` describes the curve a resume will follow
before queueing it, from the checkpoint's clusterfsdp.json.

A curve is a list of phases, each from `start` to `end` going from factor `f0` to `f1` of the
peak lr (`train.lr`): a linear warmup, a cosine or linear decay, or a constant. A run starts with
the planned curve (warmup, then decay to min_lr_ratio at train.steps); every checkpoint records
the curve it was trained on, so that a resume never reshapes it by accident. When the spec's
settings differ from those the curve was made for, the resume reshapes the rest of it:

- continue (default): from the lr at the resumed step, the same kind of decay down to the end lr
  at the new train.steps (a finished run that is extended stays at its end lr); never higher
  than it is (a warmup under way finishes as planned);
- keep: the recorded curve unchanged (past its end the end lr stays);
- rewarm: warm up again over train.warmup steps to the peak lr, then decay to the new end;
- stretch: the curve planned for the new settings from step 0, as if they had always been the
  plan (the lr may jump up or down at the resumed step).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from . import ckptfolder
from .spec import TrainSection
from .value import value


class ResumeSchedule(StrEnum):
    CONTINUE = "continue"
    KEEP = "keep"
    REWARM = "rewarm"
    STRETCH = "stretch"


class Shape(StrEnum):
    WARMUP = "warmup"
    COSINE = "cosine"
    LINEAR = "linear"
    CONSTANT = "constant"


@value(frozen=True)
class LrPlan:
    """The [train] settings a curve was made for: a resume reshapes the curve when they change."""

    steps: int
    warmup: int
    schedule: str
    min_lr_ratio: float

    @classmethod
    def of(cls, t: TrainSection) -> LrPlan:
        return cls(t.steps, t.warmup, t.schedule, t.min_lr_ratio)

    @classmethod
    def from_job_toml(cls, text: str) -> LrPlan:
        """The plan of a checkpoint older than recorded curves, from the job.toml inside it."""
        train = tomllib.loads(text).get("train", {})
        d = TrainSection()
        return cls(
            int(train.get("steps", d.steps)),
            int(train.get("warmup", d.warmup)),
            str(train.get("schedule", d.schedule)),
            float(train.get("min_lr_ratio", d.min_lr_ratio)),
        )


@value(frozen=True)
class LrPhase:
    start: int
    end: int
    shape: Shape
    f0: float  # factor of the peak lr at `start`
    f1: float  # ... at `end`, and after it

    def factor(self, step: int) -> float:
        if self.shape is Shape.CONSTANT:
            return self.f0
        if self.shape is Shape.WARMUP:  # f1 one step after `end`: step s of a warmup from 0 is (s + 1) / (W + 1)
            done = min(1.0, (step - self.start + 1) / (self.end - self.start + 1))
            return self.f0 + (self.f1 - self.f0) * done
        progress = min(1.0, (step - self.start) / max(1, self.end - self.start))
        decay = 0.5 * (1 + math.cos(math.pi * progress)) if self.shape is Shape.COSINE else 1 - progress
        return self.f1 + (self.f0 - self.f1) * decay


@value(frozen=True)
class LrCurve:
    phases: tuple[LrPhase, ...]
    plan: LrPlan

    def factor(self, step: int) -> float:
        """The lr at `step` as a fraction of train.lr."""
        current = self.phases[0]
        for phase in self.phases:
            if phase.start <= step:
                current = phase
        return current.factor(step)

    def to_json(self) -> dict[str, Any]:
        return {
            "phases": [[p.start, p.end, str(p.shape), p.f0, p.f1] for p in self.phases],
            "plan": [self.plan.steps, self.plan.warmup, self.plan.schedule, self.plan.min_lr_ratio],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LrCurve:
        phases = tuple(LrPhase(int(a), int(b), Shape(c), float(d), float(e)) for a, b, c, d, e in data["phases"])
        steps, warmup, schedule, ratio = data["plan"]
        return cls(phases, LrPlan(int(steps), int(warmup), str(schedule), float(ratio)))


def _decay(start: int, plan: LrPlan, f0: float) -> LrPhase:
    if plan.schedule == "constant":
        return LrPhase(start, max(start, plan.steps), Shape.CONSTANT, f0, f0)
    return LrPhase(start, max(start, plan.steps), Shape(plan.schedule), f0, plan.min_lr_ratio)


def planned(plan: LrPlan) -> LrCurve:
    """Linear warmup from 0 (step s: (s + 1) / (warmup + 1)), then the decay to min_lr_ratio."""
    warmup = (LrPhase(0, plan.warmup, Shape.WARMUP, 0.0, 1.0),) if plan.warmup > 0 else ()
    return LrCurve((*warmup, _decay(plan.warmup, plan, 1.0)), plan)


def reshape(curve: LrCurve, t: TrainSection, step: int, policy: ResumeSchedule) -> LrCurve:
    """The curve a resume at `step` follows under `t` (see the module docstring)."""
    plan = LrPlan.of(t)
    if curve.plan == plan or policy is ResumeSchedule.KEEP:
        return replace(curve, plan=plan)
    if policy is ResumeSchedule.STRETCH:
        return planned(plan)
    if policy is ResumeSchedule.REWARM:
        f0 = curve.factor(step)
        warmup = (LrPhase(step, step + plan.warmup, Shape.WARMUP, f0, 1.0),) if plan.warmup > 0 else ()
        kept = tuple(p for p in curve.phases if p.start < step)
        return LrCurve((*kept, *warmup, _decay(step + plan.warmup, plan, 1.0)), plan)
    start = max(step, curve.phases[-1].start)  # a warmup under way ends as planned
    f0 = curve.factor(start)
    decay = _decay(start, plan, f0)
    decay = replace(decay, f1=min(decay.f1, f0))  # continue never raises the lr
    return LrCurve((*(p for p in curve.phases if p.start < start), decay), plan)


def recorded(meta: dict[str, Any], checkpoint: Path) -> LrCurve | None:
    """The curve a checkpoint was trained on: from its clusterfsdp.json (`meta`), else (written
    before curves were recorded) the one planned by the job.toml inside it; None if unreadable."""
    if meta.get("lr_schedule"):
        try:
            return LrCurve.from_json(meta["lr_schedule"])
        except (KeyError, TypeError, ValueError):
            return None
    try:
        return planned(LrPlan.from_job_toml((checkpoint / ckptfolder.JOB_TOML).read_text()))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, TypeError, ValueError):
        return None


def resume_notes(target: ckptfolder.CheckpointInfo | None, t: TrainSection) -> tuple[str, ...]:
    """What `clusterfsdp resume` says about the lr curve of a resume from `target`."""
    old = recorded(target.meta, target.path) if target is not None else None
    if target is None or old is None:
        return ()
    new = reshape(old, t, target.step, ResumeSchedule(t.resume_schedule))
    note = describe(old, new, target.step, t.lr, t.resume_schedule)
    return (note,) if note else ()


def describe(old: LrCurve, new: LrCurve, step: int, peak_lr: float, policy: str) -> str:
    """One line: what the lr does from `step` on when the [train] settings of its curve changed
    since the checkpoint; '' when they did not."""
    if old.plan == new.plan:
        return ""
    names = ("train.steps", "train.warmup", "train.schedule", "train.min_lr_ratio")
    before, after = (old.plan.steps, old.plan.warmup, old.plan.schedule, old.plan.min_lr_ratio), (
        new.plan.steps, new.plan.warmup, new.plan.schedule, new.plan.min_lr_ratio,
    )  # fmt: skip
    changed = ", ".join(f"{n} {a} -> {b}" for n, a, b in zip(names, before, after, strict=True) if a != b)
    if new.plan.steps <= step:
        return f"learning rate: {changed} since the checkpoint at step {step}: no step left to train"
    active = max(i for i, p in enumerate(new.phases) if p.start <= step or i == 0)
    parts = []
    for phase in new.phases[active:]:
        begin = max(phase.start, step)
        lr0, lr1 = peak_lr * phase.factor(begin), peak_lr * phase.f1
        if phase.shape is Shape.CONSTANT or lr0 == lr1 or phase.end <= begin:
            end = new.plan.steps if phase is new.phases[-1] else phase.end
            parts.append(f"stays at {lr0:.2e} to step {end}")
        elif phase.shape is Shape.WARMUP:
            parts.append(f"warms up from {lr0:.2e} at step {begin} to {lr1:.2e} at step {phase.end}")
        else:
            parts.append(f"decays ({phase.shape}) from {lr0:.2e} at step {begin} to {lr1:.2e} at step {phase.end}")
    if new.phases[-1].end > new.plan.steps:
        parts[-1] += f" (training stops at step {new.plan.steps}, at {peak_lr * new.factor(new.plan.steps):.2e})"
    others = ", ".join(p.value for p in ResumeSchedule if p.value != policy)
    return (
        f"learning rate: {changed} since the checkpoint; train.resume_schedule = {policy}: from step {step} the lr "
        f"{', then '.join(parts)} (the checkpoint's curve: {peak_lr * old.factor(step):.2e} at step {step}; other "
        f"choices: {others})"
    )
