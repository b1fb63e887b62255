"""The one-screen summary of a job (what `validate` prints and the TUI's compose screen shows)."""

from __future__ import annotations

from . import modelsource
from . import spec as specmod


def summary(spec: specmod.JobSpec, where: str) -> str:
    s, t = spec.slurm, spec.train
    gpus = f"{s.gpus_per_node} GPU(s)" if s.gpus_per_node else "CPU"
    mesh = "replicate x shard" if len(spec.mesh_shape) == 2 else "shard"
    every = spec.checkpoint.every_steps
    length = f"{t.epochs:g} epochs" if t.epochs > 0 else f"{t.steps} steps"
    lines = [
        f"job        {spec.job.name} -> {spec.job.run_root}/{spec.job.name}/<run id>/",
        f"resources  {s.nodes} node(s) x {spec.tasks_per_node} worker(s) ({gpus}) = {spec.world_size} ranks, "
        f"time {spec.time_minutes} min, partition {s.partition or '(default)'}",
        f"mesh       {' x '.join(map(str, spec.mesh_shape))} ({mesh}), sharding {spec.effective_sharding}, "
        f"FSDP{spec.fsdp.version}, {spec.fsdp.mixed_precision}",
        f"model      {modelsource.describe(spec)}",
        f"data       {spec.data.source}{' ' + ', '.join(_paths(spec)) if _paths(spec) else ''}, "
        f"seq {spec.data.seq_len}" + (f", {spec.data.format}, {spec.packing} packing" if _paths(spec) else ""),
        *([f"tokenizer  {_tokenizer(spec)}"] if spec.data.source == "files" else []),
        f"train      {length} x {t.micro_batch_size * t.grad_accum * spec.world_size} samples "
        f"({t.micro_batch_size}/rank x {t.grad_accum} accum), lr {t.lr:g} {t.schedule}",
        f"checkpoint {f'every {every} steps' if every else 'at the end'}"
        f"{' (async)' if spec.checkpoint.async_ else ''}, keep {spec.checkpoint.keep_last}",
        f"runs on    {where}",
    ]
    return "\n".join(lines + [f"note       {n}" for n in spec.notices()])


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
