"""Sharding a meta-device HF model: FSDP2 `fully_shard` on a 1-D or 2-D (HSDP) DeviceMesh,
or FSDP1 FullyShardedDataParallel; activation checkpointing and per-layer compile first.

Order (torchtitan's): activation checkpointing -> per-layer torch.compile -> fully_shard per
decoder layer -> fully_shard(root). Tied embeddings stay in the root unit, so the tie survives.
FSDP1 gets its checkpoint wrappers after wrapping, inside each unit (torch's order for it: its
state-dict names assume FSDP outside the wrapper, which a LoRA checkpoint's frozen keys need).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
)
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing as apply_ac,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffload,
    CPUOffloadPolicy,
    MixedPrecision,
    MixedPrecisionPolicy,
    ShardingStrategy,
    fully_shard,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp._common_utils import HandleTrainingState
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from torch.distributed.tensor import Shard

from ..core.spec import JobSpec
from .loss import attach
from .model import decoder_layers, layer_classes

MP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def build_mesh(spec: JobSpec, device_type: str, world_size: int) -> DeviceMesh:
    """(replicate=nodes, shard=gpus per node) for hybrid; 1-D over all ranks otherwise."""
    shape = spec.mesh_shape
    if len(shape) == 2 and shape[0] * shape[1] == world_size:
        return init_device_mesh(device_type, shape, mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))


def apply_activation_checkpointing(model: nn.Module) -> None:
    classes = tuple(layer_classes(model))
    apply_ac(
        model,
        checkpoint_wrapper_fn=functools.partial(
            checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False
        ),
        check_fn=lambda m: isinstance(m, classes),
    )


def apply_compile(model: nn.Module) -> None:
    """Compile each decoder layer in place (repeated structure compiles once)."""
    for layer in decoder_layers(model):
        layer.compile(fullgraph=False)


def shard_group_size(spec: JobSpec, mesh: DeviceMesh) -> int:
    """Ranks one parameter is sharded over (1 when parameters are replicated)."""
    if spec.effective_sharding == "none":
        return 1
    return mesh["shard"].size() if mesh.mesh_dim_names and "shard" in mesh.mesh_dim_names else mesh.size()


def fsdp2(model: nn.Module, spec: JobSpec, mesh: DeviceMesh, shard_dims: dict[nn.Parameter, int]) -> nn.Module:
    """`shard_dims`: parameters sharded along another dim than 0 (weights.shard_dims)."""
    f = spec.fsdp
    kwargs: dict[str, Any] = dict(
        mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=MP_DTYPES[f.mixed_precision], reduce_dtype=torch.float32)
    )
    if f.cpu_offload:  # (pinned host memory needs an accelerator; a CPU run offloads to unpinned memory)
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=mesh.device_type != "cpu")
    if shard_dims:
        kwargs["shard_placement_fn"] = lambda p: Shard(shard_dims.get(p, 0))
    sharding = spec.effective_sharding
    reshard = f.reshard_after_forward and sharding != "grad_op"
    if sharding == "none":  # replicate: one unit, params stay gathered (mesh of 1 shard per replica)
        mesh = init_device_mesh(mesh.device_type, (mesh.size(), 1), mesh_dim_names=("replicate", "shard"))
        kwargs["mesh"] = mesh
    layers = decoder_layers(model)
    for i, layer in enumerate(layers):
        # The last layer's params are needed again first in backward: keep them gathered.
        fully_shard(layer, reshard_after_forward=reshard and i < len(layers) - 1, **kwargs)
    fully_shard(model, reshard_after_forward=False, **kwargs)
    # lm_head + cross-entropy fused and chunked (no full logits), run inside the root unit's
    # forward window like `forward` itself (see loss.py); other architectures keep `forward`.
    attach(model, compile=f.compile)
    return model


def fsdp1(
    model: nn.Module, spec: JobSpec, mesh: DeviceMesh, device: torch.device, param_init_fn: Callable[[nn.Module], None]
) -> nn.Module:
    """FSDP1 over a meta-device model: `param_init_fn` materializes (and initializes) each unit just
    before FSDP1 flattens and shards it; HYBRID_SHARD uses the 2-D mesh."""
    strategy = {
        "hybrid": ShardingStrategy.HYBRID_SHARD,
        "full": ShardingStrategy.FULL_SHARD,
        "grad_op": ShardingStrategy.SHARD_GRAD_OP,
        "none": ShardingStrategy.NO_SHARD,
    }[spec.effective_sharding]
    if strategy is ShardingStrategy.FULL_SHARD and not spec.fsdp.reshard_after_forward:
        strategy = ShardingStrategy.SHARD_GRAD_OP
    mp = MP_DTYPES[spec.fsdp.mixed_precision]
    wrapped = FSDP(
        model,
        sharding_strategy=strategy,
        device_mesh=mesh if strategy is ShardingStrategy.HYBRID_SHARD else None,
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layer_classes(model)),
        mixed_precision=MixedPrecision(param_dtype=mp, reduce_dtype=torch.float32, buffer_dtype=mp),
        # on CPU the parameters are in host memory already, and FSDP1's offload pins memory, which needs a GPU
        cpu_offload=CPUOffload(offload_params=spec.fsdp.cpu_offload and device.type != "cpu"),
        device_id=device,  # FSDP1 accepts the CPU (gloo) as a device when named explicitly
        use_orig_params=True,
        param_init_fn=param_init_fn,
        sync_module_states=False,  # every rank builds identical weights (deterministic init), or rank 0 broadcasts
    )
    for unit in FSDP.fsdp_modules(wrapped):  # before FSDP's own pre-forward writes the tensor views back
        if _unsharded_views(unit):
            unit.register_forward_pre_hook(_expose, prepend=True)
    return wrapped


def expose_fsdp1_params(model: nn.Module) -> None:
    """Register FSDP1's original parameters as Parameters again where a forward left them as
    tensors. Without this, a frozen NO_SHARD unit's weights are missing from every state dict.

    With use_orig_params, FSDP1 swaps each unit's parameters for plain tensor views during the
    forward and restores them when it reshards. A NO_SHARD unit never reshards: one rank, or
    fsdp.sharding = "none". Its post-backward hook restores them only when its flat parameter
    trains, so a unit that is all frozen stays as tensors after any forward, and a trainable one
    after an evaluation's forward. LoRA's root unit (the embeddings, final norm and head) is such
    a unit. The next forward's writeback then adopts those tensors as the parameters for good.
    FSDP's state-dict hook then asserts that `model.embed_tokens.weight` is missing (torch 2.13).

    `fsdp1` hooks this in before every forward of such a unit, and the checkpointer calls it before
    it takes or loads a state dict. It does nothing for FSDP2 or for sharded FSDP1 units.
    """
    for unit in FSDP.fsdp_modules(model):
        _expose(unit)


def _unsharded_views(unit: nn.Module) -> bool:
    """Whether `unit` is an FSDP1 unit whose original parameters are views into its whole flat
    parameter: use_orig_params on NO_SHARD."""
    handle = getattr(unit, "_handle", None)
    return handle is not None and handle._use_orig_params and not handle.uses_sharded_strategy


def _expose(unit: nn.Module, *_hook_args: Any) -> None:
    """One unit's views as Parameters, between steps only (in a forward they must stay tensors)."""
    if _unsharded_views(unit) and unit._handle._training_state is HandleTrainingState.IDLE:  # type: ignore[union-attr]
        unit._handle._use_unsharded_views(as_params=True)  # type: ignore[union-attr]
