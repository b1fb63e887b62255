"""The model of a training run, in the one order that works for every option and every
`AutoModelForCausalLM` family: build on meta -> parallelize -> fill (pretrained load, random
init, or only the buffers when a checkpoint follows). Used by the Trainer (which builds the
optimizer beside it, optimizer.py), the preference run's live reference, export and the benches.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any  # models: transformers PreTrainedModels wrapped by FSDP

import torch

from ..core.spec import JobSpec
from ..data.tokens import BOS, BYTE_VOCAB, EOS, PAD, load_tokenizer
from . import adapters, parallelize, weights
from . import model as modelmod


def build_model(
    spec: JobSpec, device: torch.device, world_size: int, tokens: modelmod.TokenIds | None, *,
    kept: Path | None = None, resume: bool = False, frozen: bool = False,
) -> tuple[Any, Any, modelmod.ParamCount]:  # fmt: skip
    """The sharded, filled model: (model, config, ParamCount). Build on meta -> shard -> fill
    (pretrained load, random init, or only buffers when a checkpoint follows, `resume`).

    `kept`: the run's copy of the model's config (<run>/model), used when present so that a
    resume does not need the original folder.
    `frozen`: every parameter with requires_grad False from the meta model on (before FSDP
    flattens or shards it), in eval mode: the in-training reference of a preference run
    (train.preference.reference = 'live', worker/preference.py), built by the same steps as
    the policy, so it is sharded like it and starts from the same weights."""
    config = modelmod.build_config(spec.model, tokens, kept)
    meta = modelmod.build_meta(spec.model, config, spec.base_dtype)  # 1. build on meta
    counts = modelmod.param_count(meta, config)  # (unsharded: the same on every world size)
    if frozen:
        meta.requires_grad_(False)
    dtype = modelmod.DTYPES[spec.base_dtype]  # (LoRA: the frozen base's; the adapters train in model.dtype)
    lora = adapters.enabled(spec)  # a LoRA checkpoint holds only the adapters: the base is loaded again
    mode = "buffers" if resume and not lora else "pretrained" if spec.model.name_or_path else "init"
    filler = weights.Filler(
        weights.plan(meta, dtype),  # (conversion mapping: before sharding renames the class)
        mode,
        spec.job.seed,
        device,
        Path(spec.model.name_or_path) if spec.model.name_or_path else None,
        dtype,
    )
    if lora:
        adapters.inject(meta, spec.peft, modelmod.DTYPES[spec.model.dtype])
        counts = dataclasses.replace(counts, trainable=adapters.trainable_count(meta))
    base = adapters.base_view if lora else contextlib.nullcontext  # the base under its own names
    mesh = parallelize.build_mesh(spec, device.type, world_size)
    if spec.fsdp.activation_checkpointing and spec.fsdp.version == 2:  # 2. parallelize
        parallelize.apply_activation_checkpointing(meta)
    if spec.fsdp.version == 1:  # FSDP1 materializes and fills (3.) each unit as it wraps it
        with base(meta):
            init_fn = filler.fsdp1_init_fn(meta, lambda: modelmod.build_meta(spec.model, config, spec.base_dtype))
        if lora:
            init_fn = adapters.fsdp1_init_fn(init_fn, meta, spec.job.seed, device)
        model = parallelize.fsdp1(meta, spec, mesh, device, init_fn)
        weights.check_materialized(model, filler.plan.model_type)
        if spec.fsdp.activation_checkpointing:  # inside each unit: the names torch's state dict expects
            parallelize.apply_activation_checkpointing(model)  # (outside, a LoRA save failed: KeyError)
    else:
        if spec.fsdp.compile:
            parallelize.apply_compile(meta)
        with base(meta):
            dims = weights.shard_dims(meta, filler.plan, parallelize.shard_group_size(spec, mesh))
        model = parallelize.fsdp2(meta, spec, mesh, dims)
        with base(model):
            filler.fsdp2(model, spec.fsdp.cpu_offload)  # 3. fill
        if lora:
            adapters.fill(model, spec.job.seed, torch.device("cpu") if spec.fsdp.cpu_offload else device)
            weights.check_materialized(model, filler.plan.model_type)
    _check_tied(model, config)
    if frozen:
        model.eval()
    return model, config, counts


def _check_tied(model, config) -> None:
    if getattr(config, "tie_word_embeddings", False):
        out, inp = model.get_output_embeddings(), model.get_input_embeddings()
        if out is not None and out.weight is not inp.weight:
            raise RuntimeError("tied embeddings came apart during sharding")


def token_ids(spec: JobSpec) -> modelmod.TokenIds | None:
    """What the data's tokenizer needs from the model config (vocab, special ids); None for synthetic data."""
    if spec.data.source != "files":
        return None
    if spec.data.tokenizer == "bytes":
        return modelmod.TokenIds(BYTE_VOCAB, BOS, EOS, PAD)
    tok: Any = load_tokenizer(spec.data.tokenizer)  # a transformers tokenizer
    return modelmod.TokenIds(len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
