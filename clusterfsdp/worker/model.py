"""HF causal LMs: built on the meta device, then (after sharding) materialized and either
initialized deterministically or loaded from a local `from_pretrained` folder.

Initialization generates each parameter's full tensor from a generator seeded by
(seed, parameter name) and keeps only this rank's shard, so the weights are identical for
every world size and sharding: a 1-process run and a 4-process HSDP run start equal.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import torch
from torch import nn

from ..control.presets import PRESETS
from ..control.spec import ModelSection

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_config(cfg: ModelSection, vocab_size: int | None = None):
    from transformers import AutoConfig, LlamaConfig

    if cfg.name_or_path:
        if not Path(cfg.name_or_path).is_dir():
            raise FileNotFoundError(
                f"model.name_or_path: {cfg.name_or_path!r} is not a local folder (compute nodes are offline: "
                "download the model to the shared filesystem first)"
            )
        config = AutoConfig.from_pretrained(cfg.name_or_path)
    else:
        kwargs = {**PRESETS[cfg.preset], **cfg.from_config}
        if vocab_size is not None and "vocab_size" not in cfg.from_config:
            kwargs["vocab_size"] = max(kwargs["vocab_size"], vocab_size)
        config = LlamaConfig(**kwargs)
    config._attn_implementation = cfg.attn_implementation
    config.use_cache = False
    return config


def build_meta(cfg: ModelSection, config) -> nn.Module:
    """The model with every parameter on the meta device (no memory, no init)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation=cfg.attn_implementation, dtype=DTYPES[cfg.dtype]
        )
    return model


def layer_classes(model: nn.Module) -> set[type]:
    """Decoder-layer classes named by the model's `_no_split_modules` (not hard-coded names)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not classes:
        raise ValueError(f"{type(model).__name__} names no decoder layer class in _no_split_modules")
    return classes


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    classes = tuple(layer_classes(model))
    return [m for m in model.modules() if isinstance(m, classes)]


def _full_init(name: str, shape: torch.Size, dtype: torch.dtype, std: float, seed: int, device) -> torch.Tensor:
    """HF's Llama init (normal(0, std) for matrices, ones for norms, zeros for biases), keyed by name."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return torch.zeros(shape, dtype=dtype, device=device)
    if "norm" in name:
        return torch.ones(shape, dtype=dtype, device=device)
    g = torch.Generator(device=device).manual_seed(seed * 2_147_483_647 + zlib.crc32(name.encode()))
    return torch.empty(shape, dtype=torch.float32, device=device).normal_(0.0, std, generator=g).to(dtype)


@torch.no_grad()
def init_weights(model: nn.Module, seed: int, std: float) -> None:
    """Deterministic init of a materialized (possibly sharded) model, independent of world size."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for name, param in model.named_parameters(remove_duplicate=True):
        full = _full_init(_canonical(name), param.shape, param.dtype, std, seed, param.device)
        if isinstance(param, DTensor):
            param.copy_(distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None))
        else:
            param.copy_(full)


def _canonical(name: str) -> str:
    """Parameter name without wrapper prefixes (activation checkpointing, compile, FSDP1)."""
    for junk in ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module."):
        name = name.replace(junk, "")
    return name


@torch.no_grad()
def reset_buffers(model: nn.Module, device: torch.device) -> None:
    """Recompute non-persistent buffers (rotary inv_freq) that `to_empty` left uninitialized."""
    for module in model.modules():
        if "inv_freq" in module._buffers and hasattr(module, "config"):
            with torch.device("cpu"):  # a fresh module computes its buffers in __init__
                fresh = type(module)(module.config)
            for key, buf in fresh._buffers.items():
                module._buffers[key] = buf.to(device)


def load_pretrained_state(path: str) -> dict[str, torch.Tensor]:
    """The full state dict of a local HF model folder (safetensors or torch .bin shards)."""
    folder = Path(path)
    files = sorted(folder.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for f in files:
            state.update(load_file(str(f)))
    else:
        for f in sorted(folder.glob("pytorch_model*.bin")):
            state.update(torch.load(f, map_location="cpu", weights_only=True))
    if not state:
        raise FileNotFoundError(f"model.name_or_path: no *.safetensors or pytorch_model*.bin in {folder}")
    return state


def param_count(model: nn.Module) -> int:
    """Parameters with tied weights counted once (the MFU convention of the reference benchmark)."""
    return sum(p.numel() for p in model.parameters())


def flops_per_token(config, n_params: int, seq_len: int) -> float:
    """6·N for the matmuls of forward + backward, plus 12·L·H·Dh·T for attention scores."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 6 * n_params + 12 * config.num_hidden_layers * heads * head_dim * seq_len
