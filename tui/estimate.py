"""Per-GPU memory of a job's model state, estimated from the spec alone (no torch), for the
compose screen's live summary: the number to watch while changing nodes, sharding or model.

Counted: parameters, gradients and AdamW's two moments, all in the master dtype (that is what
FSDP2 keeps per shard), divided over the shard group; plus the unsharded parameters that exist
during compute (two layers at a time when params reshard after forward, the whole model
otherwise). Not counted: activations, the allocator's cache, NCCL buffers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clusterfsdp.control import spec as specmod
from clusterfsdp.control.presets import PRESETS, llama_param_count

from .units import human_size

MASTER_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
COMPUTE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Memory:
    params: int
    shard_group: int
    state_bytes: float  # params + grads + AdamW moments held by one rank
    gathered_bytes: float  # unsharded params alive during forward/backward
    offloaded: bool  # state lives in CPU memory (fsdp.cpu_offload)

    def describe(self, per: str) -> str:
        where = "in CPU memory" if self.offloaded else f"per {per}"
        return (
            f"~{self.params / 1e6:,.1f}M params: {human_size(self.state_bytes)} params+grads+AdamW {where} "
            f"(sharded over {self.shard_group}) + {human_size(self.gathered_bytes)} gathered for compute; "
            "activations not included"
        )


def model_config(spec: specmod.JobSpec) -> dict[str, Any] | None:
    """The HF config of the model: the preset (with from_config) or a local folder's config.json."""
    if not spec.model.name_or_path:
        return {**PRESETS[spec.model.preset], **spec.model.from_config}
    config = Path(spec.model.name_or_path).expanduser() / "config.json"
    try:
        return json.loads(config.read_text())
    except (OSError, ValueError):
        return None  # a hub id: its size is not known before download


def shard_group(spec: specmod.JobSpec) -> int:
    return {"full": spec.world_size, "grad_op": spec.world_size, "hybrid": spec.tasks_per_node, "none": 1}[
        spec.effective_sharding
    ]


def estimate(spec: specmod.JobSpec) -> Memory | None:
    cfg = model_config(spec)
    if cfg is None:
        return None
    try:
        n, layers = llama_param_count(cfg), int(cfg["num_hidden_layers"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    group = shard_group(spec)
    state = 4 * MASTER_BYTES[spec.model.dtype] * n / group
    compute = COMPUTE_BYTES[spec.fsdp.mixed_precision]
    keeps_gathered = spec.effective_sharding in ("grad_op", "none") or not spec.fsdp.reshard_after_forward
    gathered = n * compute if keeps_gathered else 2 * n / max(layers, 1) * compute
    return Memory(n, group, state, gathered, spec.fsdp.cpu_offload)
