"""The one-screen summary of a job (what `validate` prints and the TUI's compose screen shows)."""

from __future__ import annotations

from ..core import modelsource
from ..core import spec as specmod


def summary(spec: specmod.JobSpec, where: str) -> str:
    s, t = spec.slurm, spec.train
    gpus = f"{s.gpus_per_node} GPU(s)" if s.gpus_per_node else "CPU"
    mesh = "replicate x shard" if len(spec.mesh_shape) == 2 else "shard"
    every = spec.checkpoint.every_steps
    length = f"{t.epochs:g} epochs" if t.epochs > 0 else f"{t.steps} steps"
    lines = [
        f"job        {spec.job.name} -> {spec.job.run_root}/{spec.job.name}/<run id>/",
        f"resources  {spec.node_range.render()} node(s) x {spec.tasks_per_node} worker(s) ({gpus}) = {_ranks(spec)} "
        "ranks, "
        f"time {spec.time_minutes} min, partition {s.partition or '(default)'}",
        f"mesh       {' x '.join(map(str, spec.mesh_shape))} ({mesh}), sharding {_sharding(spec)}, "
        f"FSDP{spec.fsdp.version}, {spec.fsdp.mixed_precision}",
        f"model      {modelsource.describe(spec)}",
        f"data       {spec.data.source}{' ' + ', '.join(_paths(spec)) if _paths(spec) else ''}, "
        f"seq {spec.data.seq_len}" + (f", {spec.data.format}, {spec.packing} packing" if _paths(spec) else ""),
        *([f"tokenizer  {_tokenizer(spec)}"] if spec.data.source == "files" else []),
        f"train      {length} x {t.micro_batch_size * t.grad_accum * spec.world_size} samples "
        f"({t.micro_batch_size}/rank x {t.grad_accum} accum), lr {t.lr:g} {t.schedule}",
        *_elastic(spec),
        *_peft(spec),
        f"checkpoint {f'every {every} steps' if every else 'at the end'}"
        f"{' (async)' if spec.checkpoint.async_ else ''}, keep {spec.checkpoint.keep_last}",
        f"runs on    {where}",
    ]
    return "\n".join(lines + [f"note       {n}" for n in spec.notices()])


def _sharding(spec: specmod.JobSpec) -> str:
    """The sharding the job gets; 'hybrid' (the default) on one node is 'full', said as the
    default's effect, not as a note about a key the job may never have set."""
    if spec.effective_sharding != spec.fsdp.sharding:
        return f"{spec.effective_sharding} ('{spec.fsdp.sharding}' on 1 node)"
    return spec.effective_sharding


def _ranks(spec: specmod.JobSpec) -> str:
    low = spec.node_range.low * spec.tasks_per_node
    return str(spec.world_size) if low == spec.world_size else f"{low}-{spec.world_size}"


def _elastic(spec: specmod.JobSpec) -> list[str]:
    """A node range: the accumulation at each size (the same global batch), and how it grows."""
    nodes, s = spec.node_range, spec.slurm
    if not nodes.elastic:
        return []
    accum = f"{spec.grad_accum_at(nodes.low)} on {nodes.low}, {spec.train.grad_accum} on {nodes.high}"
    grows = (f"grows up to {s.max_grows} time(s) when nodes come free (sinfo every {s.grow_check_s} s)"
             if s.max_grows else "never grows (slurm.max_grows = 0)")  # fmt: skip
    return [
        f"elastic    starts on {nodes.render()} nodes, whatever is free; grad_accum {accum} node(s) "
        f"(global batch {spec.global_batch}); {grows}"
    ]


def _peft(spec: specmod.JobSpec) -> list[str]:
    """The LoRA line: rank, scale, targets and the trainable parameters (counted from the base's
    tensor shapes as peft adds the adapters: the count the job's log gives)."""
    p = spec.peft
    if p.method != "lora":
        return []
    targets = p.target_modules if isinstance(p.target_modules, str) else ", ".join(p.target_modules)
    saved = f" + trained copies of {', '.join(p.modules_to_save)}" if p.modules_to_save else ""
    counted = modelsource.lora_params(spec)
    size = f": {'' if counted[1] else '~'}{counted[0] / 1e6:,.3f}M trainable params" if counted else ""
    return [
        f"peft       LoRA r={p.r} alpha={p.alpha:g} on {targets}{saved}{size} ({spec.model.dtype}), "
        f"base frozen in {spec.base_dtype}"
    ]


def _tokenizer(spec: specmod.JobSpec) -> str:
    """Which tokenizer the data is tokenized with, and why when it was not named."""
    d, m = spec.data, spec.model
    if d.tokenizer == "bytes":
        return "bytes (built-in byte-level)"
    if d.tokenizer == m.name_or_path:
        return f"{d.tokenizer} (the model's own)"
    return d.tokenizer


def _paths(spec: specmod.JobSpec) -> list[str]:
    """data.paths, or each [[data.sources]] path with its weight."""
    return spec.data.paths or [f"{s.path} (weight {s.weight:g})" for s in spec.data.sources]
