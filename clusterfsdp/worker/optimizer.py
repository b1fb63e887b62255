"""The optimizer of a training run, built beside the model (build.py) once it is sharded and
filled: AdamW over the parameters that train (LoRA: the adapters only), fused on GPUs unless the
parameters live on the CPU (fsdp.cpu_offload). Its state is checkpointed with the model's
(checkpoint.py); the lr of each step is the Trainer's to set (train.lr x the schedule)."""

from __future__ import annotations

import torch

from ..core.spec import JobSpec


def adamw(spec: JobSpec, model: torch.nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """AdamW with the job's lr and weight decay over `model`'s trainable parameters."""
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=spec.train.lr,
        weight_decay=spec.train.weight_decay,
        betas=(0.9, 0.95),
        fused=device.type == "cuda" and not spec.fsdp.cpu_offload,
    )
