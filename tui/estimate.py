"""Per-GPU memory of a job's model state, estimated from the spec alone (no torch), for the
compose screen's live summary: the number to watch while changing nodes, sharding or model.

Counted: parameters, gradients and AdamW's two moments, all in the master dtype (that is what
FSDP2 keeps per shard), divided over the shard group; plus the unsharded parameters that exist
during compute (two layers at a time when params reshard after forward, the whole model
otherwise). With `[peft] method = "lora"` the base holds only its parameters (frozen: no
gradients, no moments), in peft.base_dtype when set (bf16: 2 bytes each), and the adapters hold
all four, in model.dtype; the adapters are counted from the base's tensor shapes as peft adds
them (`modelsource.lora_params`: the number the job's log gives), or, without safetensors on
this host, roughly as r x 2 x hidden size per adapted matrix (7 per layer for 'all-linear').
Not counted: activations, the allocator's cache, NCCL buffers. The parameter count
is `modelsource.estimate`'s, for any family: exact from a local weights folder's safetensors
headers, else from the config (preset, config folder, or a hub id already in the HF cache).
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterfsdp.core import modelsource
from clusterfsdp.core import spec as specmod

from .byte_sizes import human_size

MASTER_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
COMPUTE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Memory:
    params: int
    shard_group: int
    state_bytes: float  # params + grads + AdamW moments held by one rank
    gathered_bytes: float  # unsharded params alive during forward/backward
    offloaded: bool  # state lives in CPU memory (fsdp.cpu_offload)
    trainable: int = 0  # LoRA: the adapters' parameters (the base is frozen); 0: a full fine-tune
    trainable_exact: bool = True  # counted from the base's shapes (else roughly, from the config)

    def describe(self, per: str) -> str:
        where = "in CPU memory" if self.offloaded else f"per {per}"
        if self.trainable:
            return (
                f"~{self.params / 1e6:,.1f}M frozen + {'' if self.trainable_exact else '~'}"
                f"{self.trainable / 1e6:,.3f}M LoRA params: "
                f"{human_size(self.state_bytes)} base+adapters+grads+AdamW {where} (sharded over {self.shard_group}) "
                f"+ {human_size(self.gathered_bytes)} gathered for compute; activations not included"
            )
        return (
            f"~{self.params / 1e6:,.1f}M params: {human_size(self.state_bytes)} params+grads+AdamW {where} "
            f"(sharded over {self.shard_group}) + {human_size(self.gathered_bytes)} gathered for compute; "
            "activations not included"
        )


def shard_group(spec: specmod.JobSpec) -> int:
    return {"full": spec.world_size, "grad_op": spec.world_size, "hybrid": spec.tasks_per_node, "none": 1}[
        spec.effective_sharding
    ]


def estimate(spec: specmod.JobSpec) -> Memory | None:
    counted = modelsource.estimate(spec)
    if counted is None:
        return None
    n, layers = counted.total, counted.layers
    group = shard_group(spec)
    trainable, exact = lora_params(spec, layers)
    copies = 1 if trainable else 4  # a frozen base: no gradients, no AdamW moments
    state = (copies * MASTER_BYTES[spec.base_dtype] * n + 4 * MASTER_BYTES[spec.model.dtype] * trainable) / group
    compute = COMPUTE_BYTES[spec.fsdp.mixed_precision]
    keeps_gathered = spec.effective_sharding in ("grad_op", "none") or not spec.fsdp.reshard_after_forward
    gathered = n * compute if keeps_gathered else 2 * n / max(layers, 1) * compute
    return Memory(n, group, state, gathered, spec.fsdp.cpu_offload, trainable, exact)


def lora_params(spec: specmod.JobSpec, layers: int) -> tuple[int, bool]:
    """Adapter parameters of a LoRA job and whether the count is exact (see the module doc); 0 for
    a full fine-tune."""
    counted = modelsource.lora_params(spec)
    if counted is not None:
        return counted
    p = spec.peft
    cfg = modelsource.model_config(spec) if p.method == "lora" else None
    if cfg is None:
        return 0, True
    hidden = next((cfg[k] for k in ("hidden_size", "n_embd", "d_model") if isinstance(cfg.get(k), int)), 0)
    matrices = 7 if isinstance(p.target_modules, str) else len(p.target_modules)
    return p.r * 2 * hidden * matrices * layers, False
