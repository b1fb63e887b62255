"""HF causal LMs of any `AutoModelForCausalLM` family: the config (pretrained folder, config
folder, preset or `model_type` + keys), the model built on the meta device, its decoder-layer
classes, and its parameter and FLOP counts. Filling the weights (random init or pretrained
load, shard by shard) is `weights.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from ..core.presets import PRESETS
from ..core.spec import ModelSection

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelError(RuntimeError):
    """A model the worker cannot build or load exactly; the message is one line naming the key
    or the model type. Raised before the first training step, never after."""


@dataclass(frozen=True)
class TokenIds:
    """What the training data's tokenizer needs from the model config."""

    vocab: int
    bos: int | None
    eos: int | None
    pad: int | None


@dataclass(frozen=True)
class ParamCount:
    """Counted on the unsharded (meta) model, so every world size and FSDP version agree."""

    total: int  # tied weights counted once
    active: int  # per token: a mixture of experts counts only the experts a token is routed to
    trainable: int = 0  # LoRA: the adapters (and trained copies) beside the frozen base; 0: all of `total`


def source_folder(cfg: ModelSection, kept: Path | None = None) -> Path | None:
    """The folder the config comes from: the copy kept in the run folder (`kept`, <run>/model) when
    there is one, else name_or_path or config; None for presets and model_type + keys."""
    if kept is not None and (kept / "config.json").is_file():
        return kept
    value = cfg.name_or_path or cfg.config
    if not value:
        return None
    key = "model.name_or_path" if cfg.name_or_path else "model.config"
    if not (Path(value) / "config.json").is_file():
        raise FileNotFoundError(
            f"{key}: {value!r} is not a local folder with a config.json (compute nodes never download: "
            "`clusterfsdp submit` resolves hub ids on the submitting host; was the folder moved?)"
        )
    return Path(value)


def build_config(cfg: ModelSection, tokens: TokenIds | None = None, kept: Path | None = None):
    """The HF config of the job's model, with from_config applied.

    Random init (no name_or_path) grows the vocabulary to fit the data's tokenizer and takes its
    special token ids, so that an exported model generates with the right ones."""
    folder = source_folder(cfg, kept)
    try:
        if folder is not None:
            config = AutoConfig.from_pretrained(str(folder), **cfg.from_config)
        else:
            keys = {**(PRESETS[cfg.preset] if cfg.preset else {}), **cfg.from_config}
            config = AutoConfig.for_model(keys.pop("model_type"), **keys)
    except Exception as e:  # ValueError, KeyError, huggingface_hub's config validation errors, ...
        key = "model.name_or_path" if cfg.name_or_path else "model.config" if cfg.config else "model.from_config"
        raise ModelError(
            f"{key}: transformers {transformers.__version__} cannot build this config ({_one_line(e)})"
        ) from None
    if not cfg.name_or_path and tokens is not None:
        if "vocab_size" not in cfg.from_config:
            config.vocab_size = max(config.vocab_size, tokens.vocab)
        for name in ("bos", "eos", "pad"):
            if f"{name}_token_id" not in cfg.from_config and getattr(tokens, name) is not None:
                setattr(config, f"{name}_token_id", getattr(tokens, name))
    config._attn_implementation = cfg.attn_implementation
    config.use_cache = False
    return config


def _one_line(e: BaseException) -> str:
    """The first sentence of an exception's message (transformers appends long lists of choices)."""
    return " ".join(str(e).split()).split(". ")[0][:300]


def build_meta(cfg: ModelSection, config, dtype: str = "") -> nn.Module:
    """The model with every parameter on the meta device (no memory, no init), in `dtype`
    (default model.dtype; a LoRA job's frozen base: JobSpec.base_dtype)."""
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(
                config, attn_implementation=cfg.attn_implementation, dtype=DTYPES[dtype or cfg.dtype]
            )
    except ValueError as e:
        raise ModelError(
            f"model type {config.model_type!r}: transformers {transformers.__version__} has no causal-LM class "
            f"for it or cannot build it ({_one_line(e)})"
        ) from None
    layer_classes(model)  # fail here, not while sharding, for a model without decoder-layer classes
    return model


def layer_classes(model: nn.Module) -> set[type]:
    """Decoder-layer classes named by the model's `_no_split_modules` (not hard-coded names)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    classes = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not classes:
        model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise ModelError(f"model type {model_type!r} names no decoder layer class in _no_split_modules")
    return classes


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    classes = tuple(layer_classes(model))
    return [m for m in model.modules() if isinstance(m, classes)]


def canonical(name: str) -> str:
    """Parameter or module name without wrapper segments (activation checkpointing, compile, FSDP1)."""
    for junk in ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module."):
        name = name.replace(junk, "")
    return name.removesuffix("._checkpoint_wrapped_module").removesuffix("._fsdp_wrapped_module")


def num_experts(config) -> tuple[int, int]:
    """(routed experts, experts per token) of a mixture of experts; (0, 0) for a dense model."""
    experts = next(
        (
            getattr(config, k)
            for k in ("num_local_experts", "num_experts", "n_routed_experts")
            if getattr(config, k, None)
        ),
        0,
    )
    top_k = next(
        (getattr(config, k) for k in ("num_experts_per_tok", "moe_topk", "top_k") if getattr(config, k, None)), 0
    )
    return int(experts or 0), int(top_k or 0)


def param_count(model: nn.Module, config) -> ParamCount:
    """Parameters of the unsharded model (call it on the meta model, before sharding).

    Active parameters per token: every parameter under a module path segment named `experts`
    (the routed experts, fused or one module per expert) counts top_k / num_experts of its size;
    routers and shared experts (`shared_expert`, `shared_experts`) count fully."""
    total = sum(p.numel() for p in model.parameters())
    experts, top_k = num_experts(config)
    routed = sum(p.numel() for n, p in model.named_parameters() if "experts" in n.split("."))
    if not (experts and top_k and routed):
        return ParamCount(total, total)
    return ParamCount(total, total - routed + routed * top_k // experts)


def flops_per_token(config, n_active: int, seq_len: int) -> float:
    """6·N for the matmuls of forward + backward (N: active parameters), plus 12·L·H·Dh·T for attention scores."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 6 * n_active + 12 * config.num_hidden_layers * heads * head_dim * seq_len
