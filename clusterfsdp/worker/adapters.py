"""LoRA adapters (Hugging Face peft) on the sharded model: `[peft] method = "lora"`.

Order (build.py): the base model on meta -> `inject` (peft's `inject_adapter_in_model`: each
targeted linear layer becomes a `peft.tuners.lora.Linear` holding it as `base_layer`, every base
parameter frozen) -> activation checkpointing / compile -> the same `fully_shard` units as a full
fine-tune (the adapters of a decoder layer are sharded with it) -> the base filled exactly as a
full fine-tune fills it, through `base_view`, in which the model has its own module names again
-> `fill` the adapters (peft's own init, on full-size tensors seeded by (seed, name), each rank
keeping its shard: the same adapters for every world size and FSDP version). Under FSDP1
`fsdp1_init_fn` does the last two unit by unit inside `param_init_fn`.

The optimizer, gradient clipping and checkpoints see only the trainable parameters; a checkpoint
carries `control.peftbase.reference` (the base's folder, commit and weight files), and `check_base`
refuses to load adapters onto a base that changed (`resume` already refused it before queueing;
this catches a requeue after the base was replaced). `adapter_export.py` writes the adapter folder or the merged model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from ..core import peftbase
from ..core.spec import JobSpec, PeftSection
from .model import ModelError, canonical
from .model import flops_per_token as full_flops_per_token
from .weights import take_shards, unit_seed

ADAPTER = "default"  # peft's adapter name


def enabled(spec: JobSpec) -> bool:
    return spec.peft.method == "lora"


# peft is imported where a LoRA run uses it: every run imports this module (for `enabled`), and
# peft costs a rank about 0.3 s more on top of torch and transformers that a full fine-tune never needs.
def lora_config(p: PeftSection, base: str = ""):
    from peft import LoraConfig  # LoRA only (see above)

    return LoraConfig(
        r=p.r,
        lora_alpha=p.alpha,
        lora_dropout=p.dropout,
        target_modules=p.target_modules,
        modules_to_save=p.modules_to_save or None,
        use_rslora=p.use_rslora,
        base_model_name_or_path=base or None,
        task_type="CAUSAL_LM",
    )


def inject(model: nn.Module, p: PeftSection, dtype: torch.dtype) -> None:
    """Adapters into the meta model, in place (the model keeps its class); the base frozen, in
    the dtype it was built in (JobSpec.base_dtype); the adapters and trained copies in `dtype`
    (model.dtype: peft makes adapters in torch's default dtype and copies modules_to_save in the
    base's)."""
    from peft import inject_adapter_in_model  # LoRA only

    try:
        inject_adapter_in_model(lora_config(p), model, adapter_name=ADAPTER, low_cpu_mem_usage=True)
    except ValueError as e:
        model_type = getattr(getattr(model, "config", None), "model_type", "?")
        text = " ".join(str(e).split())[:300]
        raise ModelError(
            f"peft.target_modules: peft cannot put adapters on model type {model_type!r}: {text}"
        ) from None
    freeze_base(model)
    for m in model.modules():
        for key, param in m._parameters.items():
            if param is not None and param.requires_grad and param.dtype != dtype:
                m._parameters[key] = nn.Parameter(param.to(dtype), requires_grad=True)


def freeze_base(model: nn.Module) -> None:
    """Only the adapters and trained copies train (again after a loader made new parameters)."""
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" in name or ".modules_to_save." in name)


def _wrappers(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module, nn.Module]]:
    """(parent, attribute, peft wrapper, the module it wraps) for every adapter layer and every
    trained copy (modules_to_save) under `model`."""
    from peft.tuners.lora import LoraLayer  # LoRA only (base_view, fill)
    from peft.utils import ModulesToSaveWrapper

    out = []
    for parent in model.modules():
        for key, child in parent.named_children():
            if isinstance(child, LoraLayer):
                out.append((parent, key, child, child.get_base_layer()))
            elif isinstance(child, ModulesToSaveWrapper):
                out.append((parent, key, child, child.original_module))
    return out


@contextlib.contextmanager
def base_view(model: nn.Module) -> Iterator[nn.Module]:
    """The model with its own module names (each wrapper replaced by the module it wraps) while
    the base is filled or measured; the sharded parameters are the same objects."""
    swapped = _wrappers(model)
    for parent, key, _, inner in swapped:
        setattr(parent, key, inner)
    try:
        yield model
    finally:
        for parent, key, wrapper, _ in swapped:
            setattr(parent, key, wrapper)


def _materialize_fsdp2(model: nn.Module, device: torch.device) -> None:
    """Storage for the tensors still on meta (the adapters: the base loader fills only the base),
    then FSDP2 told of the new tensors, as its own `to_empty` does (`reset_sharded_param`,
    private API of torch 2.13's fully_shard)."""
    for m in model.modules():
        if any(
            (p.to_local() if isinstance(p, DTensor) else p).is_meta for p in m._parameters.values() if p is not None
        ):
            m.to_empty(device=device, recurse=False)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            for group in m._get_fsdp_state()._fsdp_param_groups:
                for fsdp_param in group.fsdp_params:
                    fsdp_param.reset_sharded_param()


def layer_names(model: nn.Module) -> dict[int, str]:
    """Module id -> canonical name, taken on the whole model (the seeds of `fill`)."""
    return {id(m): canonical(n) for n, m in model.named_modules()}


@torch.no_grad()
def fill(
    model: nn.Module, seed: int, device: torch.device, *, names: dict[int, str] | None = None, keep: bool = False
) -> None:
    """Initialize the trainable tensors of `model` (adapters: peft's own init; trained copies:
    the base module's values) on full-size tensors seeded by (seed, layer name). keep=False
    (FSDP2, after the base is filled): each sharded tensor takes its shard; keep=True (FSDP1's
    param_init_fn, before flattening; `names` from the whole model): the full tensors stay, for
    the wrappers still on meta."""
    names = names or layer_names(model)
    if not keep:
        _materialize_fsdp2(model, device)
    for _, _, wrapper, inner in _wrappers(model):
        trained = [(m, key, p) for m in wrapper.modules() for key, p in m._parameters.items()
                   if p is not None and p.requires_grad]  # fmt: skip
        if keep and not any(p.is_meta for _, _, p in trained):
            continue  # (FSDP1: a decoder layer flattened before the root unit)
        full = {id(p): nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device)) for _, _, p in trained}
        for m, key, p in trained:
            m._parameters[key] = full[id(p)]
        if hasattr(wrapper, "reset_lora_parameters"):
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.manual_seed(unit_seed(seed, names[id(wrapper)]))
                wrapper.reset_lora_parameters(ADAPTER, True)  # type: ignore[operator]
        else:  # a trained copy starts as the base module
            base = dict(inner.named_parameters())
            for name, p in wrapper.modules_to_save[ADAPTER].named_parameters():  # type: ignore[union-attr]
                value = base[name]
                p.copy_(value.full_tensor() if isinstance(value, DTensor) else value)
        if not keep:
            take_shards(trained, full)


def fsdp1_init_fn(
    inner: Callable[[nn.Module], None], model: nn.Module, seed: int, device: torch.device
) -> Callable[[nn.Module], None]:
    """FSDP1's param_init_fn for a model with adapters: `inner` (the full fine-tune's) fills the
    unit's base through `base_view`, then the unit's adapters are initialized at full size."""
    names = layer_names(model)

    def init(module: nn.Module) -> None:
        if not any(p.is_meta for p in module.parameters()):
            return
        with base_view(module):
            inner(module)
        fill(module, seed, device, names=names, keep=True)

    return init


def trainable_count(model: nn.Module) -> int:
    """Trainable elements of the unsharded model (call on the meta model)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def flops_per_token(config, n_active: int, n_trainable: int, seq_len: int) -> float:
    """What a LoRA step computes per token: forward 2·N over the frozen base and the adapters,
    backward 2·N for the input gradients everywhere but weight gradients (another 2·N) only for
    the trained parameters: 4·N_base + 6·N_trained, plus attention's 12·L·H·Dh·T (forward and
    input-gradient backward, as in a full fine-tune). N_base: active base parameters."""
    attention = full_flops_per_token(config, 0, seq_len)
    return 4 * n_active + 6 * n_trainable + attention


# ---------------------------------------------------------------- the base a checkpoint was trained on
def check_base(spec: JobSpec, meta: dict[str, Any]) -> None:
    """Refuses (one line) to resume adapters on a base other than the one they were trained on."""
    if (why := peftbase.problem(spec, meta)) is not None:
        raise ModelError(why)
