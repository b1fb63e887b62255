"""The optimizer of a training run, built beside the model (build.py) once it is sharded and
filled: AdamW over the parameters that train (LoRA: the adapters only), fused on GPUs unless the
parameters live on the CPU (fsdp.cpu_offload), else `foreach` (multi-tensor), as torchtitan builds
it: torch's own default is the single-tensor loop for every parameter that is a DTensor (FSDP2's),
one DTensor dispatch per tensor and per op, 3.3-3.9 ms of CPU per step for llama-tiny's 21
parameters against 1.1-1.3 ms (bench/optimizer_bench.py; bench/README.md, "Slurm ranks forked per
node, AdamW foreach"; the same updates, another loop). Its state is checkpointed with the model's
(checkpoint.py), the same for both loops; the lr of each step is the Trainer's to set (train.lr x
the schedule)."""

from __future__ import annotations

import torch

from ..core.spec import JobSpec


def adamw(spec: JobSpec, model: torch.nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """AdamW with the job's lr and weight decay over `model`'s trainable parameters."""
    fused = device.type == "cuda" and not spec.fsdp.cpu_offload
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=spec.train.lr,
        weight_decay=spec.train.weight_decay,
        betas=(0.9, 0.95),
        fused=fused,
        foreach=not fused,
    )
