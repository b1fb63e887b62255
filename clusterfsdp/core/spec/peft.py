"""Checks of the [peft] section (LoRA with Hugging Face peft), torch-free.

`errors(spec)`: the section's own values and what they exclude (cross-field, run by `crossfield`).
`module_problems(spec, config, weight_names)`: the module names of `target_modules` and
`modules_to_save` against the model, before queueing: a pretrained folder's safetensors header
names every module that has weights (exact, whatever the family); a config alone is enough for
the families of `LINEAR_MODULES` (the names transformers gives their linear layers, checked
against transformers in tests/test_lora.py). Other families are checked by peft in the job.
"""

from __future__ import annotations

import math
from typing import Any

from .schema import JobSpec, short

ALL_LINEAR = "all-linear"
# Modules the fused lm_head + cross-entropy (worker/loss.py) reads directly: an adapter or a
# trained copy there would be silently left out of the loss.
OUTPUT_LAYERS = ("lm_head", "embed_out", "output")

_LLAMA_LIKE = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LINEAR_MODULES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2"), _LLAMA_LIKE),
    "mixtral": ("q_proj", "k_proj", "v_proj", "o_proj"),  # experts are fused parameters, not linear layers
    "qwen2_moe": (*_LLAMA_LIKE, "shared_expert_gate"),
    "phi3": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"),
    "gpt_neox": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
    "starcoder2": ("q_proj", "k_proj", "v_proj", "o_proj", "c_fc", "c_proj"),
}


def errors(spec: JobSpec) -> list[str]:
    """The [peft] values alone and against the rest of the job."""
    p = spec.peft
    if p.method == "none":
        if p.base_dtype:
            return ["peft.base_dtype: a full fine-tune trains every weight in model.dtype (set peft.method = 'lora')"]
        return []
    out = []
    if p.r < 1:
        out.append(f"peft.r: must be >= 1, found {p.r!r}")
    if not p.alpha > 0:
        out.append(f"peft.alpha: must be > 0, found {p.alpha!r}")
    if not 0 <= p.dropout < 1:
        out.append(f"peft.dropout: expected a number in [0, 1), found {p.dropout!r}")
    targets = p.target_modules
    if isinstance(targets, str):
        if targets != ALL_LINEAR:
            out.append(
                f"peft.target_modules: expected a list of module names or {ALL_LINEAR!r}, found {short(targets)}"
            )
        targets = []
    elif not targets:
        out.append(f"peft.target_modules: name at least one module (or {ALL_LINEAR!r})")
    for key, names in (("peft.target_modules", targets), ("peft.modules_to_save", p.modules_to_save)):
        for name in names:
            if not name or any(c.isspace() for c in name):
                out.append(f"{key}: {short(name)} is not a module name")
            elif name.split(".")[-1] in OUTPUT_LAYERS:
                out.append(
                    f"{key}: {name!r} is the output layer, which the fused loss reads directly; adapters and "
                    "trained copies go on the decoder's modules"
                )
    if p.use_dora:
        out.append(
            "peft.use_dora: DoRA is not supported (its magnitude vector needs each whole base weight, which "
            "sharding splits); use plain LoRA or use_rslora"
        )
    if spec.base_dtype != spec.model.dtype and spec.fsdp.version == 1:
        out.append(
            f"peft.base_dtype: {p.base_dtype!r} beside model.dtype = {spec.model.dtype!r} needs fsdp.version = 2 "
            "(FSDP1 flattens each unit's parameters into one tensor of one dtype)"
        )
    if not spec.model.name_or_path:
        out.append("peft.method: 'lora' needs a pretrained base model (model.name_or_path)")
    return out


def weight_modules(weight_names: list[str]) -> set[str]:
    """Every module name segment of a checkpoint's tensor names ('model.layers.0.mlp.up_proj.weight'
    gives model, layers, 0, mlp, up_proj)."""
    return {part for name in weight_names for part in name.split(".")[:-1]}


def module_problems(spec: JobSpec, config: dict[str, Any] | None, weight_names: list[str] | None) -> list[str]:
    """Names in target_modules / modules_to_save the model does not have, when that can be known
    without building it (weight names of a pretrained folder, or a family of LINEAR_MODULES)."""
    p = spec.peft
    if p.method == "none" or config is None:
        return []
    model_type = str(config.get("model_type", ""))
    linear = LINEAR_MODULES.get(model_type)
    known = weight_modules(weight_names) if weight_names else None
    out = []
    if isinstance(p.target_modules, list):
        have = set(linear) if linear is not None else known
        for name in p.target_modules:
            if have is not None and name.split(".")[-1] not in have:
                what = f"linear layers of {model_type}" if linear is not None else "modules of the model's weights"
                out.append(f"peft.target_modules: {name!r} is not one of the {what} ({', '.join(sorted(have)[:12])})")
    for name in p.modules_to_save:
        if known is not None and name.split(".")[-1] not in known:
            out.append(f"peft.modules_to_save: the model's weights have no module {name!r}")
    return out


def _names(module: str, names: list[str]) -> bool:
    """peft's match of a module name against target_modules: the name itself or a dotted suffix."""
    return any(module == n or module.endswith("." + n) for n in names)


def _saved(module: str, names: list[str]) -> bool:
    """Whether a module is (inside) one of modules_to_save: peft matches a plain suffix of the
    module's name ('norm' is also 'input_layernorm')."""
    parts = module.split(".")
    return any(".".join(parts[:i]).endswith(n) for i in range(1, len(parts) + 1) for n in names)


def trainable_params(spec: JobSpec, config: dict[str, Any], shapes: dict[str, list[int]]) -> tuple[int, bool]:
    """The parameters a LoRA job trains, counted from the base's tensor shapes as peft adds them,
    and whether the count is exact: r x (in + out) per adapted linear layer (its weight is out x
    in; GPT-2's Conv1D in x out, the same sum), plus every tensor of modules_to_save, which train
    in full. `all-linear` adapts every linear layer but the output layer: for the families of
    LINEAR_MODULES their names, otherwise every 2-D weight that is no embedding (not exact:
    a family may have other 2-D weights). A mixture of experts is never exact: transformers
    fuses its experts on loading (other names and shapes than the files'), and peft adapts them
    and the router with a layout of its own; the count is of the rest."""
    p = spec.peft
    model_type = str(config.get("model_type", ""))
    linear = LINEAR_MODULES.get(model_type)
    vocab = config.get("vocab_size")
    targets = p.target_modules
    experts = any(config.get(k) for k in ("num_local_experts", "num_experts", "n_routed_experts"))
    total, exact = 0, not experts and (isinstance(targets, list) or linear is not None)
    for name, shape in shapes.items():
        module, _, kind = name.rpartition(".")
        if _saved(module, p.modules_to_save):
            total += math.prod(shape)
            continue
        leaf = module.rpartition(".")[2]
        if kind != "weight" or len(shape) != 2 or leaf in OUTPUT_LAYERS:
            continue
        if isinstance(targets, list):
            adapted = _names(module, targets)
        elif linear is not None:
            adapted = leaf in linear
        else:
            adapted = "emb" not in leaf and leaf not in ("wte", "wpe") and vocab not in shape
        total += p.r * (shape[0] + shape[1]) if adapted else 0
    return total, exact
