"""Export of a LoRA run (`[peft] method = "lora"`; `clusterfsdp export RUN --to DIR [--merge]`).

Without --merge: a PEFT adapter folder, what `PeftModel.save_pretrained` writes and
`PeftModel.from_pretrained(base, DIR)` loads: adapter_config.json (peft's LoraConfig with
`base_model_name_or_path`: the base folder the run trained on, or its hub id) and
adapter_model.safetensors (keys `base_model.model.<module>.lora_A.weight`, as PeftModel names
them), plus the tokenizer and the generation config of the merged export (hfexport.py: the
tokenizer's eos, which the base's own generation config may lack). Only the adapters are read
from the checkpoint; the base is never loaded.

With --merge: the base loaded once on the CPU (the run's base folder, through the same loader as
training, in the dtype it trained in: peft.base_dtype), the adapters loaded beside it and merged
into its weights in place (peft's `LoraLayer.merge`, in model.dtype, the adapters' dtype), then
written as a plain HF model folder in the chosen dtype (default: the base's). One copy of the
base at any time.

peft is imported at the top here, not in adapters.py: `hfexport` imports this module only for a
LoRA run's export.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from peft import get_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from peft.utils import ModulesToSaveWrapper
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict_loader import load

from ..core import ckptfolder, runfolder
from ..core.modelsource import SOURCES_FILE
from ..core.spec import JobSpec
from . import adapters, safeload, weights
from . import model as modelmod
from .checkpoint import dcp_call

ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # how PeftModel names the wrapped model's modules


def _load_trained(model: nn.Module, checkpoint_dir: Path) -> None:
    """The checkpoint's trained tensors (adapters and trained copies) into `model`'s trainable
    parameters, in place (no process group: the export is one process)."""
    state = {"model": {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}}
    meta = ckptfolder.read_meta(checkpoint_dir)
    reader, planner = safeload.SafeReader(checkpoint_dir, meta), safeload.SafePlanner()
    dcp_call(f"loading {checkpoint_dir.name}", load, state, storage_reader=reader, planner=planner, no_dist=True)


def _adapted_meta(spec: JobSpec, config) -> nn.Module:
    model = modelmod.build_meta(spec.model, config, spec.base_dtype)
    adapters.inject(model, spec.peft, modelmod.DTYPES[spec.model.dtype])
    return model


def base_name(run: runfolder.RunFolder, spec: JobSpec) -> str:
    """What adapter_config.json names as the base: the hub id the run resolved, else its folder."""
    try:
        sources = json.loads((run.model_dir / SOURCES_FILE).read_text())
    except (OSError, ValueError):
        sources = []
    for s in sources if isinstance(sources, list) else []:
        if isinstance(s, dict) and s.get("key") == "model.name_or_path" and s.get("repo_id"):
            return str(s["repo_id"])
    return spec.model.name_or_path


def write_adapter(run: runfolder.RunFolder, spec: JobSpec, config, checkpoint_dir: Path, tmp: Path) -> None:
    """adapter_config.json + adapter_model.safetensors into `tmp` (the adapters only)."""
    model: Any = _adapted_meta(spec, config)  # a transformers model with peft layers
    for m in model.modules():  # storage for the trained tensors only; the base stays on meta
        for key, p in m._parameters.items():
            if p is not None and p.requires_grad:
                m._parameters[key] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype), requires_grad=True)
    _load_trained(model, checkpoint_dir)
    trained = {n: p.detach() for n, p in model.state_dict().items() if not p.is_meta}
    state = get_peft_model_state_dict(model, state_dict=trained, adapter_name=adapters.ADAPTER)
    tmp.mkdir(parents=True, exist_ok=True)
    save_file({PEFT_PREFIX + k: v.contiguous() for k, v in state.items()}, str(tmp / ADAPTER_WEIGHTS),
              metadata={"format": "pt"})  # fmt: skip
    lora = adapters.lora_config(spec.peft, base_name(run, spec))
    lora.revision = spec.model.revision or None
    lora.save_pretrained(str(tmp))


def merged_model(spec: JobSpec, config, checkpoint_dir: Path) -> nn.Module:
    """The base (loaded from the run's base folder, as in training) with the adapters merged in."""
    adapters.check_base(spec, ckptfolder.read_meta(checkpoint_dir))  # (merged onto another base they mean nothing)
    base, trained = modelmod.DTYPES[spec.base_dtype], modelmod.DTYPES[spec.model.dtype]
    meta = modelmod.build_meta(spec.model, config, spec.base_dtype)
    plan = weights.plan(meta, base)
    adapters.inject(meta, spec.peft, trained)
    with adapters.base_view(meta):
        weights.load_pretrained(meta, Path(spec.model.name_or_path), plan, "cpu", base)
    adapters.freeze_base(meta)  # (the loader made new parameters)
    adapters.fill(meta, spec.job.seed, torch.device("cpu"))  # storage (then overwritten by the checkpoint)
    _load_trained(meta, checkpoint_dir)
    meta.to(trained)  # merged in the adapters' dtype (a bf16 base goes up to fp32 exactly, a tensor at a time)
    for parent in list(meta.modules()):
        for key, child in list(parent.named_children()):
            if isinstance(child, LoraLayer):
                child.merge(safe_merge=True)
                setattr(parent, key, child.get_base_layer())
            elif isinstance(child, ModulesToSaveWrapper):
                setattr(parent, key, child.modules_to_save[adapters.ADAPTER])
    for p in meta.parameters():
        p.requires_grad_(False)
    if hasattr(meta, "peft_config"):
        del meta.peft_config
    return meta
