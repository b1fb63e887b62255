"""The training run on one rank: build on meta -> parallelize -> materialize -> load -> loop.

Stops cleanly at a step boundary when any rank got SIGUSR2 or SIGTERM (stopflags.py): a
collective save, then `worker.main` decides with Slurm whether the job comes back (time limit,
preemption) or stops (cancel).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any  # models: transformers PreTrainedModels wrapped by FSDP

import torch
import torch.distributed as dist

from ..control import ckptfolder
from ..control.records import EventKind
from ..control.spec import JobSpec
from ..data.samples import Batch, PreparedSamples, SyntheticSamples, open_for_training
from ..data.tokens import BOS, BYTE_VOCAB, EOS, PAD, load_tokenizer
from . import checkpoint as ckpt
from . import metrics as metricsmod
from . import model as modelmod
from . import parallelize, weights
from .stopflags import SIGNAL_NAMES, StopFlags


@dataclass
class Outcome:
    """How the loop ended: 'completed', or 'interrupted' by `signal` (SIGUSR2 or SIGTERM) and saved."""

    status: str
    step: int
    checkpoint: str = ""
    signal: str = ""


@dataclass
class Progress:
    """Where this rank is, for the record of a failure (worker.main): the step, and the steps
    this incarnation completed (an error before the first one is deterministic: not retried)."""

    step: int | None = None
    steps_done: int = 0


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


def lr_lambda(spec: JobSpec) -> Callable[[int], float]:
    t = spec.train

    def factor(step: int) -> float:
        if step < t.warmup:
            return (step + 1) / (t.warmup + 1)
        if t.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - t.warmup) / max(1, t.steps - t.warmup))
        decay = 0.5 * (1 + math.cos(math.pi * progress)) if t.schedule == "cosine" else 1 - progress
        return t.min_lr_ratio + (1 - t.min_lr_ratio) * decay

    return factor


def build(
    spec: JobSpec,
    device: torch.device,
    world_size: int,
    tokens: modelmod.TokenIds | None,
    *,
    kept: Path | None = None,
    resume: bool = False,
) -> tuple[Any, torch.optim.Optimizer, Any, modelmod.ParamCount]:
    """Model and optimizer, in the one order that works for every option: build on meta ->
    shard -> fill (pretrained load, random init, or only buffers when a checkpoint follows).

    `kept`: the run's copy of the model's config (<run>/model), used when present so that a
    resume does not need the original folder. Returns (model, optimizer, config, ParamCount)."""
    config = modelmod.build_config(spec.model, tokens, kept)
    meta = modelmod.build_meta(spec.model, config)  # 1. build on meta
    counts = modelmod.param_count(meta, config)  # (unsharded: the same on every world size)
    dtype = modelmod.DTYPES[spec.model.dtype]
    mode = "buffers" if resume else "pretrained" if spec.model.name_or_path else "init"
    filler = weights.Filler(
        weights.plan(meta, dtype),  # (conversion mapping: before sharding renames the class)
        mode,
        spec.job.seed,
        device,
        Path(spec.model.name_or_path) if spec.model.name_or_path else None,
        dtype,
    )
    mesh = parallelize.build_mesh(spec, device.type, world_size)
    if spec.fsdp.activation_checkpointing:  # 2. parallelize
        parallelize.apply_activation_checkpointing(meta)
    if spec.fsdp.version == 1:  # FSDP1 materializes and fills (3.) each unit as it wraps it
        init_fn = filler.fsdp1_init_fn(meta, lambda: modelmod.build_meta(spec.model, config))
        model = parallelize.fsdp1(meta, spec, mesh, device, init_fn)
        weights.check_materialized(model, filler.plan.model_type)
    else:
        if spec.fsdp.compile:
            parallelize.apply_compile(meta)
        dims = weights.shard_dims(meta, filler.plan, parallelize.shard_group_size(spec, mesh))
        model = parallelize.fsdp2(meta, spec, mesh, dims)
        filler.fsdp2(model, spec.fsdp.cpu_offload)  # 3. fill
    _check_tied(model, config)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=spec.train.lr,
        weight_decay=spec.train.weight_decay,
        betas=(0.9, 0.95),
        fused=device.type == "cuda" and not spec.fsdp.cpu_offload,
    )
    return model, optimizer, config, counts


def _check_tied(model, config) -> None:
    if getattr(config, "tie_word_embeddings", False):
        out, inp = model.get_output_embeddings(), model.get_input_embeddings()
        if out is not None and out.weight is not inp.weight:
            raise RuntimeError("tied embeddings came apart during sharding")


def token_ids(spec: JobSpec) -> modelmod.TokenIds | None:
    """What the data's tokenizer needs from the model config (vocab, special ids); None for synthetic data."""
    if spec.data.source != "files":
        return None
    if spec.data.tokenizer == "bytes":
        return modelmod.TokenIds(BYTE_VOCAB, BOS, EOS, PAD)
    tok: Any = load_tokenizer(spec.data.tokenizer)  # a transformers tokenizer
    return modelmod.TokenIds(len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)


def _loss_fn(spec: JobSpec) -> Callable[[torch.nn.Module, Batch], torch.Tensor]:
    """loss(model, batch): the cross-entropy summed over the batch's trained labels, from lm_head
    fused with a chunked cross-entropy where the model supports it (see loss.py; full fp32
    logits are never formed), else logits + cross-entropy. Packed documents go to
    flash_attention_2 as one row (its varlen kernel takes the document bounds from the position
    ids only for batch size 1); sdpa and eager get a block-diagonal causal mask that transformers
    builds from the position ids."""
    from . import loss as lossmod

    flatten = spec.model.attn_implementation == "flash_attention_2"

    def loss(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        ids, labels, positions = batch.input_ids, batch.labels, batch.position_ids
        if flatten and positions is not None:
            ids, labels, positions = ids.reshape(1, -1), labels.reshape(1, -1), positions.reshape(1, -1)
        return lossmod.causal_lm_loss(
            model, ids, labels, position_ids=positions, compile=spec.fsdp.compile, reduction="sum"
        )

    return loss


def _label_total(spec: JobSpec, samples, batches: list[Batch], group) -> float:
    """Trained labels in this step over all ranks: what the summed loss is divided by, so every
    trained token weighs the same whatever the world size, micro-batch or padding."""
    if samples.all_labels_trained:
        return float(sum(b.labels.numel() for b in batches) * spec.world_size)
    total = torch.tensor([float(sum(b.label_count for b in batches))])
    if group is not None:
        dist.all_reduce(total, group=group)
    return max(1.0, float(total))


def evaluate(model, loss_fn, samples: PreparedSamples, batches: int, rank: int, world_size: int, spec: JobSpec, device):
    """Mean loss over the first `batches` global micro-batches of the fixed evaluation order:
    every rank its slice, the sums of loss and of trained labels all-reduced."""
    mb = spec.train.micro_batch_size
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    model.eval()
    with torch.no_grad():
        for j in range(batches):
            batch = samples.batch(j * world_size * mb, rank, world_size, mb)
            totals[0] += loss_fn(model, batch.to(device)).double()
            totals[1] += batch.label_count
    model.train()
    if dist.is_initialized():
        dist.all_reduce(totals)
    return float(totals[0] / totals[1].clamp(min=1))


def train(
    spec: JobSpec,
    device: torch.device,
    rank: int,
    world_size: int,
    ckpt_root: Path,
    spec_text: str,
    log: Callable[[str], None],
    metrics_out: metricsmod.MetricsWriter | None,
    on_event: Callable[..., None],
    flags: StopFlags,
    progress: Progress,
    model_dir: Path | None = None,
) -> Outcome:
    flag_group = dist.new_group(backend="gloo") if dist.is_initialized() else None
    torch.manual_seed(spec.job.seed)
    t_data = time.perf_counter()
    data = open_for_training(spec, rank, log)
    t_build = time.perf_counter()
    latest = ckptfolder.find(ckpt_root)
    what = spec.model.name_or_path or spec.model.config or f"preset {spec.model.preset}"
    fill = "checkpoint" if latest else "load" if spec.model.name_or_path else "init"
    log(f"building the model ({what}): meta -> shard -> {fill}")
    model, optimizer, config, counts = build(
        spec, device, world_size, token_ids(spec), kept=model_dir, resume=latest is not None
    )
    if data.max_id >= config.vocab_size:
        raise ValueError(f"data: token id {data.max_id} does not fit the model's vocab_size {config.vocab_size}")
    samples = data.train or SyntheticSamples(spec.data.seq_len, config.vocab_size, spec.job.seed)
    eval_batches = 0
    if data.eval is not None:
        eval_batches = min(spec.eval.batches, data.eval.count // (world_size * spec.train.micro_batch_size))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(spec))
    c = spec.checkpoint
    saver = ckpt.Checkpointer(
        ckpt_root,
        model,
        optimizer,
        rank,
        world_size,
        spec_text,
        c.keep_last,
        c.async_,
        writer_threads=c.writer_threads,
        async_mode=c.async_mode,
    )
    grace = GraceCheck(spec.slurm.signal_grace_s, log, on_event)
    step, consumed, tokens_seen, elapsed_before = 0, 0, 0, 0.0
    t0 = time.perf_counter()
    if latest is not None:
        log(f"loading checkpoint {latest.path.name} (saved by {latest.meta.get('world_size', '?')} ranks) ...")
    latest, saved, unreadable = saver.load_newest()
    for bad_step, reason in unreadable:
        log(f"checkpoint step {bad_step} did not load, set aside: {reason}")
        on_event(EventKind.CHECKPOINT_FALLBACK, step=bad_step, reason=f"did not load, set aside: {reason}")
    if latest is not None:
        step, consumed, tokens_seen = saved["step"], saved["consumed"], saved["tokens_seen"]
        elapsed_before = float(saved.get("elapsed_s", 0.0))  # older checkpoints did not record it
        scheduler.last_epoch = step
        for group, lr in zip(optimizer.param_groups, scheduler.get_lr(), strict=False):
            group["lr"] = lr
        log(
            f"resumed from {latest.path.name} (step {step}, {consumed} samples seen, "
            f"saved by {saved['world_size']} ranks, now {world_size}) in {time.perf_counter() - t0:.2f} s"
        )
        on_event(EventKind.RESUMED, step=step, checkpoint=str(latest.path))
        if saved.get("data", data.key) != data.key:
            log(
                f"data: this checkpoint was trained on prepared dataset {saved['data']}, this attempt reads "
                f"{data.key} (the sources, tokenizer or format changed): the data position ({consumed} samples) "
                "continues in the new data"
            )
    t_model = time.perf_counter()
    active = f" ({counts.active / 1e6:.2f}M active per token)" if counts.active != counts.total else ""
    log(
        f"model: {config.model_type}, {counts.total / 1e6:.2f}M params{active}, vocab {config.vocab_size}, "
        f"mesh {spec.mesh_shape} "
        f"({spec.effective_sharding}, FSDP{spec.fsdp.version}), built in {t_model - t_build:.2f} s"
    )
    fpt = modelmod.flops_per_token(config, counts.active, spec.data.seq_len)
    meter = metricsmod.Meter(fpt, device, world_size, elapsed_before)
    if metrics_out is not None:
        metrics_out.begin(step)
    loss_fn = _loss_fn(spec)
    t = spec.train
    mb = t.micro_batch_size
    micro_tokens = mb * spec.data.seq_len

    def meta() -> dict:
        return {"consumed": consumed, "tokens_seen": tokens_seen, "elapsed_s": meter.elapsed(), "data": data.key}

    gradient_sync: Callable[[bool], None] | None = getattr(model, "set_requires_gradient_sync", None)  # FSDP2
    model.train()
    first_step = progress.step = step
    while step < t.steps:
        stop = flags.agree(flag_group, step, spec.slurm.signal_grace_s) if flags.due(step) else 0
        if stop:
            secs = saver.save(step, meta(), blocking=True)
            saver.close()
            log(f"{SIGNAL_NAMES[stop]}: saved step {step} in {secs:.2f} s")
            return Outcome("interrupted", step, str(ckptfolder.step_dir(ckpt_root, step)), SIGNAL_NAMES[stop])
        batches = [samples.batch(consumed + m * world_size * mb, rank, world_size, mb) for m in range(t.grad_accum)]
        scale = world_size / _label_total(spec, samples, batches, flag_group)
        loss_sum = torch.zeros((), device=device)
        for micro, batch in enumerate(batches):
            consumed += world_size * mb
            last = micro == t.grad_accum - 1
            if gradient_sync is not None:
                gradient_sync(last)
            loss = loss_fn(model, batch.to(device)) * scale
            loss.backward()
            loss_sum += loss.detach()
        grad_norm = _clip(model, t.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        step += 1
        progress.step, progress.steps_done = step, progress.steps_done + 1
        tokens_seen += world_size * t.grad_accum * micro_tokens
        meter.tick(world_size * t.grad_accum * micro_tokens)
        flags.tick()
        if saver.poll():
            grace(saver.last_save_s, flags.latency_s(), step)
        if step == first_step + 1:
            log(
                f"first step done {time.perf_counter() - t_data:.2f} s after the start (data ready in "
                f"{t_build - t_data:.2f} s, model built in {t_model - t_build:.2f} s)"
            )
        eval_now = data.eval is not None and (
            step == t.steps or (spec.eval.every_steps > 0 and step % spec.eval.every_steps == 0)
        )
        if step % t.log_every == 0 or step == t.steps or eval_now:
            if dist.is_initialized():
                dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
            extra = {}
            if eval_now:
                assert data.eval is not None
                eval_loss = evaluate(model, loss_fn, data.eval, eval_batches, rank, world_size, spec, device)
                extra = {"eval_loss": eval_loss, "eval_ppl": math.exp(min(eval_loss, 700.0))}
            row = meter.row(
                step=step,
                loss=float(loss_sum),
                lr=scheduler.get_last_lr()[0],
                grad_norm=float(grad_norm),
                tokens_seen=tokens_seen,
                **extra,
            )
            log(metricsmod.format_row(row, t.steps))
            if metrics_out is not None:
                metrics_out.write(row)
        if c.every_steps and step % c.every_steps == 0 and step < t.steps:
            blocked = saver.save(step, meta())
            flags.pause()
            log(f"checkpoint step {step}: training blocked {blocked:.3f} s ({'async' if c.async_ else 'sync'})")
            if not c.async_:
                grace(saver.last_save_s, flags.latency_s(), step)
    log(f"saving the final checkpoint (step {step}) ...")
    secs = saver.save(step, meta(), blocking=True)  # the last step always saves synchronously
    saver.close()
    log(f"saved step {step} in {secs:.2f} s")
    return Outcome("completed", step, str(ckptfolder.step_dir(ckpt_root, step)))


def _clip(model, max_norm: float) -> torch.Tensor:
    """Global grad norm over all shards (DTensor-aware for FSDP2, FSDP1's own for FSDP1)."""
    if hasattr(model, "clip_grad_norm_"):  # FSDP1
        return model.clip_grad_norm_(max_norm if max_norm > 0 else float("inf"))
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else float("inf"))
    return norm.full_tensor() if isinstance(norm, DTensor) else norm
