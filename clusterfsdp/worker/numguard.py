"""The numerical guard (`[train.guard]`): a step whose loss or gradient norm is NaN or Inf, or
spikes far above the recent accepted steps, is skipped on every rank, and a run of such steps
rolls the run back to a checkpoint and takes their samples out of the data order.

A skipped step is a step without an update: its gradients are dropped (set to None) and the
optimizer does not step (AdamW's step count and moments stay as they were), while the step
number, the data position and the lr curve (a function of the step) move on as for any step.
So the run still ends at train.steps, a skipped step's samples are simply not learned from, and
nothing about the rest of the run depends on whether a step was skipped (Megatron-Bridge and
Lightning's SpikeDetection skip the same way).

Every rank decides alike without an all-reduce of its own: the decision reads only values that
are the same on every rank. The grad norm `train._clip` returns is global: FSDP2's
clip_grad_norm_ over DTensor gradients reduces the partial norms over the mesh (`full_tensor`),
FSDP1's all-reduces its total, and the gradients it measures were already reduce-scattered (or
all-reduced) over every rank in backward. A NaN or Inf in any one rank's loss makes that rank's
gradients non-finite in backward, so it reaches every rank's norm: a non-finite loss anywhere is
caught through the norm (a loss that is not finite comes from logits that are not, whose
gradients are not either). Only the loss spike check needs the step's loss over all ranks: one
all-reduce of one number per step, made only when train.guard.spike_loss is set. Reading the
norm back on the host is one device sync per step (the loop otherwise syncs on metrics rows only).

Rollback (`roll_back`, after train.guard.rollback_after bad steps in a row): back to the newest
checkpoint older than the first of them (newer ones are set aside, as `resume --step` does), and
the data positions those steps read are skipped from then on (`data.samples.Skipped`, kept in
TrainState.skipped, so in every later checkpoint, and written into the checkpoint rolled back
to, so that a resume from it skips them too). The run then continues exactly as a run whose data
order never held those samples: a checkpoint's data position counts samples read, and ranges are
only ever added beyond it. The count of bad steps in a row and the spike history are this
incarnation's: after a start or a rollback the spike checks wait for spike_window accepted
steps, and a streak cut by a requeue starts again from zero.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ..core import ckptfolder
from ..core.ckptfolder import CheckpointInfo
from ..core.records import EventKind
from ..core.spec.schema import Guard
from ..data.samples import Skipped

if TYPE_CHECKING:
    from .train import Trainer


class NumericalError(RuntimeError):
    """Bad steps in a row and no checkpoint before them to go back to."""


class Verdict(StrEnum):
    """What the guard made of a step (the `skipped` field of its metrics row, unless OK)."""

    OK = "ok"
    NONFINITE = "nonfinite"  # the loss or the grad norm is NaN or Inf (on any rank)
    LOSS_SPIKE = "loss_spike"
    GRAD_NORM_SPIKE = "grad_norm_spike"


class Spikes:
    """The last `window` accepted values of one quantity: a value above `factor` x their median
    is a spike, once the window is full (the median: one earlier outlier does not move it)."""

    def __init__(self, factor: float, window: int):
        self.factor = factor
        self.recent: deque[float] = deque(maxlen=window)

    def is_spike(self, value: float) -> bool:
        full = len(self.recent) == self.recent.maxlen
        return bool(self.factor) and full and value > self.factor * statistics.median(self.recent)

    def accept(self, value: float) -> None:
        self.recent.append(value)


@dataclass
class Streak:
    """Bad steps in a row: how many, the step number of the first, and the data position where
    the samples of the first began."""

    steps: int = 0
    first_step: int = 0
    first_position: int = 0


class NumGuard:
    """Judges each step (`judge`, the same verdict on every rank), records the bad ones
    (`record`), and says when a rollback is due."""

    def __init__(self, config: Guard, log: Callable[[str], None], on_event: Callable[..., None]):
        self.config, self.log, self.on_event = config, log, on_event
        self.verdict = Verdict.OK  # of the last step
        self.streak = Streak()
        self.loss = Spikes(config.spike_loss, config.spike_window)
        self.grad_norm = Spikes(config.spike_grad_norm, config.spike_window)
        self.rolled_back_from = 0  # the first bad step of the streak that made the last rollback

    @property
    def on(self) -> bool:
        c = self.config
        return c.nonfinite or bool(c.spike_loss) or bool(c.spike_grad_norm)

    def judge(self, loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> Verdict:
        """The step's verdict from the global grad norm and, with spike_loss, the step's loss
        averaged over the ranks (then collective). `loss_sum` is this rank's share of the loss."""
        if not self.on:
            return Verdict.OK
        norm, loss = float(grad_norm), None
        if self.config.spike_loss:
            mean = loss_sum.detach().clone()
            if dist.is_initialized():
                dist.all_reduce(mean, op=dist.ReduceOp.AVG)
            loss = float(mean)
        if self.config.nonfinite and not (math.isfinite(norm) and (loss is None or math.isfinite(loss))):
            return Verdict.NONFINITE
        if loss is not None and self.loss.is_spike(loss):
            return Verdict.LOSS_SPIKE
        if self.grad_norm.is_spike(norm):
            return Verdict.GRAD_NORM_SPIKE
        if loss is not None and math.isfinite(loss):
            self.loss.accept(loss)
        if math.isfinite(norm):  # with nonfinite = false a NaN step goes on, but is no measure of a spike
            self.grad_norm.accept(norm)
        return Verdict.OK

    def record(self, verdict: Verdict, step: int, first: int, end: int, grad_norm: torch.Tensor) -> None:
        """After step `step`, which read the data positions [first, end): a bad one is logged
        (every rank), recorded as a bad_step event (rank 0) and counted in the streak."""
        self.verdict = verdict
        if verdict is Verdict.OK:
            self.streak = Streak()
            return
        if not self.streak.steps:
            self.streak = Streak(0, step, first)
        self.streak.steps += 1
        text = (
            f"step {step} skipped ({verdict}, grad norm {float(grad_norm):.4g}): no update on any rank, "
            f"its samples (data positions {first}-{end - 1}) not learned from"
        )
        self.log(f"numerical guard: {text}")
        self.on_event(EventKind.BAD_STEP, step=step, reason=text)

    def rollback_due(self) -> bool:
        n = self.config.rollback_after
        return bool(n) and self.streak.steps >= n

    def row(self) -> dict[str, str]:
        """The metrics row's field for the last step: `skipped` with the verdict, when it was."""
        return {} if self.verdict is Verdict.OK else {"skipped": str(self.verdict)}

    def reset(self) -> None:
        self.verdict, self.streak = Verdict.OK, Streak()
        self.loss.recent.clear()
        self.grad_norm.recent.clear()


class LossRise:
    """A warning when the loss of a metrics row rises `factor`-fold above the lowest logged so
    far (and by at least MIN_RISE): a diverging run (lr 0.9: 6 -> 94) is a climb, not a spike
    above the recent median, so the spike checks (off by default) never see it, and the run
    would complete without a word. Once per incarnation; reads only the rows' loss, the mean
    over the ranks (the same value on every rank)."""

    MIN_RISE = 1.0  # nats: at small losses a few-fold rise is noise (0.002 -> 0.007)

    def __init__(self, factor: float, log: Callable[[str], None], on_event: Callable[..., None]):
        self.factor, self.log, self.on_event = factor, log, on_event
        self.low: tuple[float, int] | None = None  # the lowest logged loss and its step
        self.warned = False

    def check(self, step: int, loss: float, lr: float, precision: str) -> None:
        if not self.factor or self.warned or not math.isfinite(loss):
            return
        if self.low is None or loss < self.low[0]:
            self.low = (loss, step)
            return
        low, at = self.low
        if loss < self.factor * low or loss - low < self.MIN_RISE:
            return
        self.warned = True
        text = (
            f"the loss rose to {loss:.4g} at step {step}, {loss / max(low, 1e-12):.1f}x its lowest ({low:.4g} at step "
            f"{at}; lr {lr:.2e}, {precision}): the run may be diverging; lower train.lr, or set "
            "train.guard.spike_loss to skip such steps (train.guard.warn_rise = 0: no warning)"
        )
        self.log(f"warning: {text}")
        self.on_event(EventKind.WARNING, step=step, reason=text)


def roll_back(tr: Trainer) -> None:
    """Back to the newest checkpoint before the streak of bad steps (every rank; collective):
    newer checkpoints set aside, model, optimizer, RNG and TrainState loaded in place, the
    streak's data positions skipped from now on (recorded in the TrainState and in that
    checkpoint's clusterfsdp.json), a rollback event and a log line. Raises NumericalError (the
    ranks' failure, never recorded as a rollback) when no checkpoint is older than the streak, or
    when training did not get past the streak that made the previous rollback (bad steps that
    follow the model, not the samples: rolling back again would skip data forever)."""
    ctx, state, guard = tr.ctx, tr.state, tr.guard
    streak = guard.streak
    skipped = Skipped.of(state.skipped).plus(streak.first_position, state.consumed)
    what = f"{streak.steps} bad steps in a row (steps {streak.first_step}-{state.step})"
    tr.checkpointer.wait()
    _barrier(tr.flag_group)  # rank 0's rename of a finished async save is visible to every rank
    target = _newest_before(ctx.checkpoints, streak.first_step, ctx.rank, tr.flag_group)
    if refusal := _refusal(what, streak.first_step, target, guard.rolled_back_from):
        # a failure, not a rollback: every rank records it as its `failed` event (the doctor's `numerical`)
        raise NumericalError(f"numerical guard: {refusal}")
    assert target is not None
    if ctx.rank == 0:
        ckptfolder.keep_only_up_to(ctx.checkpoints, target.step)
    _barrier(tr.flag_group)
    tr.rewind(target, skipped)
    guard.reset()
    guard.rolled_back_from = streak.first_step
    ranges = ", ".join(f"{a}-{b - 1}" for a, b in skipped.ranges)
    text = (
        f"{what}: rolled back to checkpoint step {target.step}; the data order's positions {ranges} "
        "are skipped from now on"
    )
    tr.log(f"numerical guard: {text}")
    ctx.on_event(EventKind.ROLLBACK, step=target.step, checkpoint=str(target.path), reason=text)
    _barrier(tr.flag_group)


def _refusal(what: str, first: int, target: CheckpointInfo | None, rolled_back_from: int) -> str:
    """Why the run must not roll back ('' when it may)."""
    if target is None:
        return (
            f"{what} and no checkpoint before step {first} to go back to (set checkpoint.every_steps, or "
            "train.guard.rollback_after = 0 to only skip)"
        )
    if first <= rolled_back_from:
        return (
            f"{what} again, after a rollback that skipped the samples of the bad steps from step {rolled_back_from}: "
            "the model or its settings (train.lr?), not the data"
        )
    return ""


def _newest_before(root, step: int, rank: int, group) -> CheckpointInfo | None:
    """The newest complete checkpoint older than `step`, as rank 0 sees it (one answer for all)."""
    mine = [c for c in ckptfolder.list_checkpoints(root) if c.step < step] if rank == 0 else []
    answer: list[int | None] = [mine[-1].step if mine else None]
    if group is not None:
        dist.broadcast_object_list(answer, src=0, group=group)
    return None if answer[0] is None else ckptfolder.find(root, answer[0])


def _barrier(group) -> None:
    if group is not None:
        dist.barrier(group=group)
