"""Export a DCP checkpoint as a plain HuggingFace model folder (config.json + safetensors)
that `from_pretrained` loads on one machine without FSDP or torch.distributed."""

from __future__ import annotations

from pathlib import Path

from ..control.spec import JobSpec


def export_hf(spec: JobSpec, checkpoint_dir: Path, out: Path) -> Path:
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
    from transformers import AutoModelForCausalLM

    from .data import data_vocab
    from .model import DTYPES, build_config

    config = build_config(spec.model, data_vocab(spec))
    model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[spec.model.dtype])
    state = {"model": model.state_dict()}
    dcp_load(state, checkpoint_id=str(checkpoint_dir), no_dist=True)
    model.load_state_dict(state["model"])
    model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    return out
