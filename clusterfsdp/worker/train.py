"""The training loop on one rank, in torchtitan's shape: a `Trainer` holding its typed
components (data, model, optimizer, learning-rate schedule, Checkpointer, metrics) and a
`TrainState` (what a checkpoint carries besides model and optimizer), with `step`,
`maybe_eval`, `maybe_save` and `run() -> Outcome`.

Stops cleanly at a step boundary when any rank got SIGUSR2 or SIGTERM (stopflags.py): a
collective save, then `worker.main` decides with Slurm whether the job comes back (time limit,
preemption) or stops (cancel). A step with a NaN/Inf or spiking loss or grad norm is skipped on
every rank, and bad steps in a row roll back to a checkpoint with their samples skipped
(numguard.py, train.guard). Early stopping on a benchmark score: benchstop.py.

Over 500 lines on purpose: the `Trainer` and its `TrainState` are one unit (what a step does and
what a checkpoint carries must change together); set-up, checkpointing, metrics and the guard
are their own modules already.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any  # models: transformers PreTrainedModels wrapped by FSDP

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ..core import ckptfolder, lrschedule, peftbase
from ..core.budget import Budget
from ..core.records import EventKind
from ..core.spec import JobSpec
from ..data import mixture, samplesets
from ..data.mixsamples import MixtureSamples
from ..data.rankdata import TrainingData, open_for_training
from ..data.samples import Batch, PreparedSamples, Skipped, SyntheticSamples
from . import adapters, evalloss, objectives, preference
from . import loss as lossmod
from . import metrics as metricsmod
from . import model as modelmod
from .benchstop import BenchStop
from .build import build_model, token_ids
from .checkpoint import Checkpointer
from .elastic import GrowWatch
from .generate import SampleGenerator
from .heartbeat import Heartbeat, Phase
from .numguard import LossRise, NumGuard, Verdict, roll_back
from .optimizer import adamw
from .stopflags import SIGNAL_NAMES, StopFlags


@dataclass
class TrainState:
    """Where the run is: what a checkpoint must carry besides model and optimizer for a resume
    to continue exactly. `Stateful` (state_dict / load_state_dict) with JSON values: the
    Checkpointer writes it into the checkpoint's clusterfsdp.json, which the control plane reads
    without torch. Features that add state (epochs, the best eval metric, bad-step counters) add
    a field with a default, so older checkpoints still load; fields marked `saved=False` are this
    incarnation's only."""

    step: int = 0
    consumed: int = 0  # samples consumed: the data position, one integer whatever the world size
    tokens_seen: int = 0
    elapsed_s: float = 0.0  # training time along the run's trajectory (metrics.Meter)
    data: str = ""  # the key of the prepared training dataset it was trained on
    steps_total: int = 0  # the steps this run trains (train.steps, or derived from train.epochs)
    best_eval_loss: float = 0.0  # the best judged score (lower better: eval loss, or minus the eval reward accuracy)
    best_step: int = 0  # 0: no evaluation yet (ckptfolder.BEST_STEP)
    stale_evals: int = 0  # evaluations in a row without an improvement of early_stopping.min_delta
    lr_schedule: dict[str, Any] = field(default_factory=dict)  # the lr curve (control.lrschedule.LrCurve)
    skipped: list[list[int]] = field(default_factory=list)  # data positions never read (data.samples.Skipped)
    # Steps this incarnation ran, for the record of a failure (worker.main): an error before the
    # first one is deterministic (a bad config), not retried.
    steps_run: int = field(default=0, metadata={"saved": False})

    def state_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("saved", True)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for f in fields(self):
            if f.metadata.get("saved", True) and f.name in state:
                setattr(self, f.name, type(getattr(self, f.name))(state[f.name]))


class LoopEnd(StrEnum):
    """How `Trainer.run` ended."""

    COMPLETED = "completed"  # train.steps reached, or early stopping (Outcome.reason); the final checkpoint saved
    INTERRUPTED = "interrupted"  # a stop signal (SIGUSR2 or SIGTERM); saved at a step boundary


@dataclass(frozen=True)
class Outcome:
    end: LoopEnd
    step: int
    checkpoint: str  # the checkpoint saved at `step`
    signal: str = ""  # INTERRUPTED: SIGUSR2 or SIGTERM
    reason: str = ""  # COMPLETED before train.steps: why (early stopping)


@dataclass(frozen=True)
class RankContext:
    """What the rank hands the Trainer: the spec, where this rank is, where the run's files go,
    and the channels to the outside (the log, events of rank 0, the metrics sink, stop flags)."""

    spec: JobSpec
    device: torch.device
    rank: int
    world_size: int
    checkpoints: Path
    spec_text: str  # the run's job.toml, copied into every checkpoint
    model_dir: Path | None  # the run's copy of the model's config (<run>/model)
    log: Callable[[str], None]
    on_event: Callable[..., None]  # events.jsonl (rank 0 only; a no-op elsewhere)
    sink: metricsmod.MetricsWriter | None  # rank 0 only
    flags: StopFlags
    beat: Heartbeat | None = None  # this rank's heartbeat (train.watchdog), told at each step and phase


class GraceCheck:
    """Warns (log line and a `warning` event) when a save takes longer than a signal leaves
    before the time limit (slurm.signal_grace_s), counting the time the ranks may take to act on
    the signal; again only when a save is 1.5x slower than the one warned about."""

    def __init__(self, grace_s: int, log: Callable[[str], None], on_event: Callable[..., None]):
        self.grace_s, self.log, self.on_event = grace_s, log, on_event
        self.warned_s = 0.0

    def __call__(self, save_s: float, latency_s: float, step: int) -> None:
        need = save_s + latency_s
        if need <= self.grace_s or save_s < 1.5 * self.warned_s:
            return
        self.warned_s = save_s
        text = (
            f"the last checkpoint save took {save_s:.1f} s (+ up to {latency_s:.1f} s until the ranks act on a "
            f"signal), more than slurm.signal_grace_s = {self.grace_s} s leaves before the time limit: a save "
            f"there would be cut off; raise slurm.signal_grace_s to at least {math.ceil(2 * need)}"
        )
        self.log(f"warning: {text}")
        self.on_event(EventKind.WARNING, step=step, reason=text)


class Trainer:
    """One rank's training run. Construction makes every component, in order (`_open_data`,
    `_build_model`, `_restore`, `_start_metrics`); `run` trains to train.steps or to a stop
    signal. Every method is collective: all ranks call them in the same order."""

    def __init__(self, ctx: RankContext):
        self.ctx, self.spec, self.log = ctx, ctx.spec, ctx.log
        self.state = TrainState()
        self.grace = GraceCheck(ctx.spec.slurm.signal_grace_s, ctx.log, ctx.on_event)
        # Small agreements (stop flags, label counts) go over gloo: no device sync in the loop.
        self.flag_group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        torch.manual_seed(self.spec.job.seed)
        self.t_start = time.perf_counter()
        self._phase(Phase.DATA_PREP)
        self.data, self.samples, self.eval_batches = self._open_data()
        self.steps = self._count_steps()
        self._record_data()
        self.sample_gen = SampleGenerator(self.spec, self.data.eval) if self.spec.eval.samples else None
        self.t_build = time.perf_counter()
        self._phase(Phase.MODEL_LOAD)
        self.model, self.optimizer, self.config, self.counts = self._build_model()
        self.checkpointer = Checkpointer(
            ctx.checkpoints, self.model, self.optimizer, self.spec.checkpoint,
            rank=ctx.rank, world_size=ctx.world_size, spec_text=ctx.spec_text,
            trainable_only=adapters.enabled(self.spec),
        )  # fmt: skip
        self.new_best, self.stop_reason = False, ""  # what the last evaluation decided (_judge)
        self.budget: Budget | None = None  # the GPU-hours budget clock (worker.main sets it under Slurm)
        self.grow: GrowWatch | None = None  # rank 0 of a node range below its largest size (worker.main)
        self.bench_stop: BenchStop | None = None  # early stopping on a benchmark score (worker.main)
        self.curve = self._restore()
        self.state.lr_schedule = self.curve.to_json()
        self._set_lr()
        self.guard = NumGuard(self.spec.train.guard, ctx.log, ctx.on_event)
        self.rise = LossRise(self.spec.train.guard.warn_rise, ctx.log, ctx.on_event)
        assert self.samples is not None
        self.samples.skipped = Skipped.of(self.state.skipped)
        self.t_ready = time.perf_counter()
        self.meter = self._start_metrics()
        self.objective = self._preference() if self.spec.preference_training else None
        self.loss_fn = self.objective.train if self.objective is not None else _loss_fn(self.spec)
        # FSDP2: no gradient sync on the inner micro-batches of a step.
        self.gradient_sync: Callable[[bool], None] | None = getattr(self.model, "set_requires_gradient_sync", None)

    # ---------------------------------------------------------------- set-up steps
    def _open_data(self) -> tuple[TrainingData, PreparedSamples | MixtureSamples | SyntheticSamples | None, int]:
        """The prepared data (rank 0 prepares it if missing) and how many eval micro-batches
        every rank gets from the held-out set."""
        ctx = self.ctx
        data = open_for_training(self.spec, ctx.rank, self.log)
        eval_batches = 0
        if data.eval is not None:
            per_batch = ctx.world_size * self.spec.train.micro_batch_size
            eval_batches = min(self.spec.eval.batches, data.eval.count // per_batch)
        return data, data.train, eval_batches

    def _count_steps(self, step: int = 0, consumed: int = 0) -> int:
        """The steps this run trains (samplesets.total_steps: train.epochs counts them from the
        training set's size and the global batch), said in the log with the passes over the
        data when train.epochs is set or the steps make more than one pass."""
        if self.samples is None or isinstance(self.samples, SyntheticSamples):
            return self.spec.train.steps
        steps = samplesets.total_steps(self.spec, self.samples.count, step, consumed)
        if note := samplesets.epochs_note(self.spec, self.samples.count, steps):
            self.log(note)
        self.state.steps_total = steps
        return steps

    def _record_data(self) -> None:
        """Rank 0: the sample sets' statistics (each source's of a mixture) and the steps the run
        trains into data.json, for `status` and the TUI (`step 34/46` of an epochs run)."""
        if self.ctx.sink is None or self.data.train is None:
            return
        sets = (("train", self.data.train), ("eval", self.data.eval))
        metas = {role: s.meta for role, s in sets if isinstance(s, PreparedSamples)}
        sources = {
            role: [
                {"label": mixture.label(self.spec, i), "weight": self.spec.data.sources[i].weight, "meta": part.meta}
                for i, part in enumerate(s.parts)
            ]
            for role, s in sets
            if isinstance(s, MixtureSamples)
        }
        self.ctx.sink.sample_sets(metas, sources, self.steps)

    def _build_model(self) -> tuple[Any, torch.optim.Optimizer, Any, modelmod.ParamCount]:
        """The model (build.py), only buffers filled when a checkpoint follows, and its optimizer
        beside it (optimizer.py); the data's token ids must fit the model's vocabulary."""
        spec, ctx = self.spec, self.ctx
        newest = ckptfolder.find(ctx.checkpoints)
        resume = newest is not None
        if resume and adapters.enabled(spec):
            adapters.check_base(spec, newest.meta)  # (before loading a base the adapters do not fit)
        what = spec.model.name_or_path or spec.model.config or f"preset {spec.model.preset}"
        fill = "checkpoint" if resume else "load" if spec.model.name_or_path else "init"
        self.log(f"building the model ({what}): meta -> shard -> {fill}")
        model, config, counts = build_model(
            spec, ctx.device, ctx.world_size, token_ids(spec), kept=ctx.model_dir, resume=resume
        )
        if self.data.max_id >= config.vocab_size:
            raise ValueError(
                f"data: token id {self.data.max_id} does not fit the model's vocab_size {config.vocab_size}"
            )
        if self.samples is None:
            self.samples = SyntheticSamples(spec.data.seq_len, config.vocab_size, spec.job.seed)
        return model, adamw(spec, model, ctx.device), config, counts

    def _restore(self) -> lrschedule.LrCurve:
        """Load the newest checkpoint that loads on every rank (newer unreadable ones are set
        aside, each with an event) into the model, the optimizer, the RNG and the TrainState;
        returns the lr curve to follow (the planned one, or the checkpoint's, reshaped as
        train.resume_schedule says when [train] changed since: said in the log)."""
        ctx, state = self.ctx, self.state
        t0 = time.perf_counter()
        newest = ckptfolder.find(ctx.checkpoints)
        if newest is not None:
            ranks = newest.meta.get("world_size", "?")
            self.log(f"loading checkpoint {newest.path.name} (saved by {ranks} ranks) ...")
        loaded, saved, unreadable = self.checkpointer.load_newest()
        for bad_step, reason in unreadable:
            self.log(f"checkpoint step {bad_step} did not load, set aside: {reason}")
            ctx.on_event(EventKind.CHECKPOINT_FALLBACK, step=bad_step, reason=f"did not load, set aside: {reason}")
        state.data = self.data.key
        t = dataclasses.replace(self.spec.train, steps=self.steps)
        planned = lrschedule.planned(lrschedule.LrPlan.of(t))
        if loaded is None:
            return planned
        trained_on = saved.get("data", self.data.key)
        state.load_state_dict(saved)
        state.data = self.data.key
        if self.spec.train.epochs > 0:
            before = state.steps_total
            self.steps = self._count_steps(state.step, state.consumed)
            self._record_data()  # counted again from the checkpoint's data position
            t = dataclasses.replace(t, steps=self.steps)
            if before and before != self.steps:
                self.log(
                    f"train.epochs: {self.steps} steps now, the checkpoint planned {before} (the global batch, now "
                    f"{self.spec.global_batch}, train.epochs or the data changed): the data position "
                    f"({state.consumed} samples) continues and the run ends after {self.spec.train.epochs:g} passes"
                )
        state.steps_total = self.steps
        old = lrschedule.recorded(saved, loaded.path) or planned
        curve = lrschedule.reshape(old, t, state.step, lrschedule.ResumeSchedule(t.resume_schedule))
        self.log(
            f"resumed from {loaded.path.name} (step {state.step}, {state.consumed} samples seen, "
            f"saved by {saved['world_size']} ranks, now {ctx.world_size}) in {time.perf_counter() - t0:.2f} s"
        )
        ctx.on_event(EventKind.RESUMED, step=state.step, checkpoint=str(loaded.path))
        if trained_on != self.data.key:
            self.log(
                f"data: this checkpoint was trained on prepared dataset {trained_on}, this attempt reads "
                f"{self.data.key} (the sources, tokenizer or format changed): the data position "
                f"({state.consumed} samples) continues in the new data"
            )
        note = lrschedule.describe(old, curve, state.step, t.lr, t.resume_schedule)
        if note:
            self.log(note)
        return curve

    def _start_metrics(self) -> metricsmod.Meter:
        spec, config, counts = self.spec, self.config, self.counts
        active = f" ({counts.active / 1e6:.2f}M active per token)" if counts.active != counts.total else ""
        self.log(
            f"model: {config.model_type}, {counts.total / 1e6:.2f}M params{active}, vocab {config.vocab_size}, "
            f"mesh {spec.mesh_shape} ({spec.effective_sharding}, FSDP{spec.fsdp.version}), "
            f"built in {self.t_ready - self.t_build:.2f} s"
        )
        fused = hasattr(self.model, "clusterfsdp_loss")  # loss.attach: FSDP2 and a supported architecture
        self.log(
            "loss: lm_head fused with the loss, a chunk of logits at a time"
            if fused
            else "loss: the full logits (FSDP1, or an architecture outside loss.FUSED_ARCHITECTURES)"
        )
        if counts.trainable:
            share = 100 * counts.trainable / counts.total
            self.log(
                f"peft: LoRA r={spec.peft.r}, {counts.trainable / 1e6:.3f}M trainable params ({spec.model.dtype}) of "
                f"{(counts.total + counts.trainable) / 1e6:.2f}M ({share:.2f}% of the base, kept in {spec.base_dtype})"
            )
            fpt = adapters.flops_per_token(config, counts.active, counts.trainable, spec.data.seq_len)
        else:
            fpt = modelmod.flops_per_token(config, counts.active, spec.data.seq_len)
        if self.ctx.sink is not None:
            self.ctx.sink.begin(self.state.step)
        return metricsmod.Meter(fpt, self.ctx.device, self.ctx.world_size, self.state.elapsed_s)

    def _preference(self) -> preference.Objectives:
        """The preference objectives, with their reference (objectives.start: a table or a live copy)."""
        sets, ctx = {"train": self.data.train, "eval": self.data.eval}, self.ctx
        return objectives.start(
            self.spec, self.model, {role: s for role, s in sets.items() if s is not None}, ctx.checkpoints,
            self.state.step > 0, ctx.rank, ctx.world_size, ctx.device, self.log, adapters.enabled(self.spec),
            kept=ctx.model_dir, max_id=self.data.max_id,
        )  # fmt: skip

    # ---------------------------------------------------------------- the loop
    def run(self) -> Outcome:
        """Train to train.steps (then a final, blocking save), or until the ranks agree on a
        stop signal (then a blocking save at that step boundary)."""
        spec, flags, state = self.spec, self.ctx.flags, self.state
        self.model.train()
        first = state.step
        self._phase(Phase.STEP)
        while state.step < self.steps:
            if self.budget is not None and flags.due(state.step) and self.budget.reached(time.time()):
                flags.budget_used()  # slurm.max_gpu_hours: saved and stopped like a cancel
            if self.grow is not None and state.step > first and flags.due(state.step) and self.grow.reason:
                flags.grow()  # nodes came free: saved and requeued onto more (after a step: never a no-progress stop)
            if self.bench_stop is not None and flags.due(state.step) and not self.stop_reason:
                self.stop_reason = self.bench_stop.check(state.step + 1)  # (it stops after this step)
            stop = flags.agree(self.flag_group, state.step, spec.slurm.signal_grace_s) if flags.due(state.step) else 0
            if stop:
                return self._interrupted(SIGNAL_NAMES[stop])
            loss_sum, grad_norm = self.step()
            if state.step == first + 1:
                self.log(
                    f"first step done {time.perf_counter() - self.t_start:.2f} s after the start (data ready in "
                    f"{self.t_build - self.t_start:.2f} s, model built in {self.t_ready - self.t_build:.2f} s)"
                )
            self._maybe_log(loss_sum, grad_norm)
            if self.guard.rollback_due():
                roll_back(self)
                continue
            self.maybe_save()
            if self.stop_reason:
                self.log(self.stop_reason)
                break
        self.log(f"saving the final checkpoint (step {state.step}) ...")
        secs = self._save(blocking=True)  # the last step always saves synchronously
        self.checkpointer.close()
        self.log(f"saved step {state.step} in {secs:.2f} s")
        final = str(ckptfolder.step_dir(self.ctx.checkpoints, state.step))
        return Outcome(LoopEnd.COMPLETED, state.step, final, reason=self.stop_reason)

    def step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over train.grad_accum micro-batches of this rank's slice of the
        global batch; returns (the step's loss on this rank, the global grad norm)."""
        ctx, t, state = self.ctx, self.spec.train, self.state
        mb, world = t.micro_batch_size, ctx.world_size
        assert self.samples is not None
        at = [state.consumed + m * world * mb for m in range(t.grad_accum)]
        batches = [self.samples.batch(consumed, ctx.rank, world, mb) for consumed in at]
        if ctx.beat is not None:
            ctx.beat.fetched()
        scale = world / evalloss.label_total(self.spec, self.samples, batches, self.flag_group)
        first = state.consumed
        if self.objective is not None:
            self.objective.train.begin(self.model, batches, ctx.device)  # the step's rewards (kto: its KL first)
        loss_sum = torch.zeros((), device=ctx.device)
        for micro, batch in enumerate(batches):
            state.consumed += world * mb
            if self.gradient_sync is not None:
                self.gradient_sync(micro == t.grad_accum - 1)
            loss = self.loss_fn(self.model, batch.to(ctx.device)) * scale
            loss.backward()
            loss_sum += loss.detach()
        grad_norm = _clip(self.model, t.max_grad_norm)
        verdict = self.guard.judge(loss_sum, grad_norm)  # the same on every rank (numguard.py)
        if verdict is Verdict.OK:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        state.step += 1
        self.guard.record(verdict, state.step, first, state.consumed, grad_norm)
        self._set_lr()
        state.steps_run += 1
        if ctx.beat is not None:
            ctx.beat.step(state.step)
        tokens = world * t.grad_accum * mb * self.spec.data.seq_len * (2 if self.objective is not None else 1)
        state.tokens_seen += tokens
        self.meter.tick(tokens)
        ctx.flags.tick()
        if self.checkpointer.poll():
            self.grace(self.checkpointer.last_save_s, ctx.flags.latency_s(), state.step)
        return loss_sum, grad_norm

    def maybe_eval(self) -> dict[str, float]:
        """eval_loss and eval_ppl when this step evaluates (every eval.every_steps, and the last step), else
        nothing; a preference objective's rewards instead of eval_ppl (the exp of a pair loss is no perplexity)."""
        if not self._eval_due():
            return {}
        assert self.data.eval is not None
        self._phase(Phase.EVAL)
        loss_fn = self.objective.eval if self.objective is not None else self.loss_fn
        ctx = self.ctx
        eval_loss = evalloss.evaluate(
            self.model, loss_fn, self.data.eval, self.eval_batches, self.spec, ctx.device, ctx.rank, ctx.world_size
        )
        rewards = self.objective.eval.row(self.flag_group, "eval_") if self.objective is not None else {}
        self._phase(Phase.STEP)
        # the judged score, lower better: the eval loss, or minus the reward accuracy (checkpoint.keep_best)
        self._judge(
            -rewards["eval_reward_accuracy"] if "reward_accuracy" in self.spec.checkpoint.keep_best else eval_loss
        )
        if self.sample_gen is not None:  # [eval] samples: every rank generates, rank 0 writes
            samples = self.sample_gen.generate(self.model, self.state.step, self.ctx.device)
            if self.ctx.sink is not None:
                self.ctx.sink.samples(samples)
        if self.objective is not None:
            return {"eval_loss": eval_loss, **rewards}
        return {"eval_loss": eval_loss, "eval_ppl": math.exp(min(eval_loss, 700.0))}

    def _judge(self, eval_loss: float) -> None:
        """After an evaluation (the same all-reduced score on every rank, so every rank decides
        alike): a new lowest eval loss, or score (saved at this step with checkpoint.keep_best), and
        train.early_stopping's verdict, against the best before this evaluation."""
        state, stop = self.state, self.spec.train.early_stopping
        first = state.best_step == 0
        if stop.metric == "eval_loss" and not first:
            improved = eval_loss < state.best_eval_loss - stop.min_delta
            state.stale_evals = 0 if improved else state.stale_evals + 1
            if state.stale_evals >= stop.patience:
                self.stop_reason = (
                    f"early stopping at step {state.step}: eval_loss has not improved by more than {stop.min_delta:g} "
                    f"on its best ({state.best_eval_loss:.4f} at step {state.best_step}) for {stop.patience} "
                    "evaluation(s)"
                )
        self.new_best = first or eval_loss < state.best_eval_loss
        if self.new_best:
            state.best_eval_loss, state.best_step = eval_loss, state.step

    def _eval_due(self) -> bool:
        step, every = self.state.step, self.spec.eval.every_steps
        return self.data.eval is not None and (step == self.steps or (every > 0 and step % every == 0))

    def _maybe_log(self, loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """A metrics row every train.log_every steps, at the last step, at every eval and at a
        step the numerical guard skipped."""
        step, t = self.state.step, self.spec.train
        skipped = self.guard.row()
        if not (step % t.log_every == 0 or step == self.steps or self._eval_due() or skipped):
            return
        if dist.is_initialized():
            dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
        row = self.meter.row(
            step=step,
            loss=float(loss_sum),
            lr=self.optimizer.param_groups[0]["lr"],
            grad_norm=float(grad_norm),
            tokens_seen=self.state.tokens_seen,
            total_steps=self.steps,
            **self._epoch(),
            **skipped,
            **(self.objective.train.row(self.flag_group) if self.objective is not None else {}),
            **self.maybe_eval(),
        )
        self.log(metricsmod.format_row(row, self.steps))
        self.rise.check(step, row["loss"], row["lr"], self.spec.fsdp.mixed_precision)
        if self.ctx.sink is not None:
            self.ctx.sink.write(row)

    def _epoch(self) -> dict[str, float]:
        """The fractional epoch (samples consumed / training samples) for a metrics row; none
        for synthetic data."""
        if self.samples is None or isinstance(self.samples, SyntheticSamples):
            return {}
        return {"epoch": samplesets.epoch(self.state.consumed, self.samples.count)}

    def maybe_save(self) -> None:
        """A checkpoint every checkpoint.every_steps and, with keep_best on an eval metric, at an evaluation
        with a new best (async when configured); not at the last step nor when early stopping ends the run."""
        c, step = self.spec.checkpoint, self.state.step
        best, self.new_best = self.new_best and c.keep_best in ("eval_loss", "eval_reward_accuracy"), False
        due = (c.every_steps and step % c.every_steps == 0) or best
        if not due or step >= self.steps or self.stop_reason:
            return
        blocked = self._save()
        self.ctx.flags.pause()
        self.log(f"checkpoint step {step}: training blocked {blocked:.3f} s ({'async' if c.async_ else 'sync'})")
        if not c.async_:
            self.grace(self.checkpointer.last_save_s, self.ctx.flags.latency_s(), step)

    def rewind(self, target: ckptfolder.CheckpointInfo, skipped: Skipped) -> None:
        """Load `target` in place (model, optimizer, RNG, TrainState) and go on from its step with
        the data positions `skipped` passed over for good, recorded in that checkpoint too: the
        numerical guard's rollback (`numguard.roll_back` decides when and to which checkpoint;
        this is what it may change of the Trainer). The data position, the total steps and the
        lr schedule stay this run's: the samples read since are not read again."""
        state = self.state
        meta = self.checkpointer.load(target)
        kept = {"data": state.data, "steps_total": state.steps_total, "lr_schedule": state.lr_schedule}
        state.load_state_dict({**meta, **kept, "skipped": skipped.to_json()})
        self.checkpointer.amend(target, {"skipped": skipped.to_json()})
        assert self.samples is not None
        self.samples.skipped = skipped
        self._set_lr()
        self.meter = metricsmod.Meter(self.meter.fpt, self.ctx.device, self.ctx.world_size, state.elapsed_s)
        self.ctx.flags.pause()
        if self.ctx.sink is not None:
            self.ctx.sink.begin(state.step)

    def _set_lr(self) -> None:
        """The lr of the next step: train.lr x the curve at this step."""
        lr = self.spec.train.lr * self.curve.factor(self.state.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _save(self, *, blocking: bool = False) -> float:
        self.state.elapsed_s = self.meter.elapsed()
        self._phase(Phase.SAVE)
        meta = self.state.state_dict()
        if adapters.enabled(self.spec):
            meta[peftbase.BASE_KEY] = peftbase.reference(self.spec)
        secs = self.checkpointer.save(self.state.step, meta, blocking=blocking)
        self._phase(Phase.STEP)
        return secs

    def _phase(self, phase: Phase) -> None:
        if self.ctx.beat is not None:
            self.ctx.beat.phase(phase)

    def _interrupted(self, signal: str) -> Outcome:
        step = self.state.step
        secs = self._save(blocking=True)
        self.checkpointer.close()
        self.log(f"{signal}: saved step {step} in {secs:.2f} s")
        return Outcome(LoopEnd.INTERRUPTED, step, str(ckptfolder.step_dir(self.ctx.checkpoints, step)), signal)


# ---------------------------------------------------------------- the objective
def _loss_fn(spec: JobSpec) -> Callable[[torch.nn.Module, Batch], torch.Tensor]:
    """loss(model, batch): the cross-entropy summed over the batch's trained labels, from lm_head
    fused with a chunked cross-entropy where the model supports it (see loss.py; full fp32
    logits are never formed), else logits + cross-entropy. Packed documents go to
    flash_attention_2 as one row (its varlen kernel takes the document bounds from the position
    ids only for batch size 1); sdpa and eager get a block-diagonal causal mask that transformers
    builds from the position ids."""
    flatten = spec.model.attn_implementation == "flash_attention_2"

    def loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        ids, labels, positions = batch.input_ids, batch.labels, batch.position_ids
        if flatten and positions is not None:
            ids, labels, positions = ids.reshape(1, -1), labels.reshape(1, -1), positions.reshape(1, -1)
        return lossmod.causal_lm_loss(
            model, ids, labels, position_ids=positions, compile=spec.fsdp.compile, reduction="sum"
        )

    return loss


def _clip(model, max_norm: float) -> torch.Tensor:
    """Global grad norm over all shards (DTensor-aware for FSDP2, FSDP1's own for FSDP1)."""
    if hasattr(model, "clip_grad_norm_"):  # FSDP1
        return model.clip_grad_norm_(max_norm if max_norm > 0 else float("inf"))
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else float("inf"))
    return norm.full_tensor() if isinstance(norm, DTensor) else norm
