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


def main(argv: list[str] | None = None) -> int:
    """`python -m clusterfsdp.worker.export RUN_DIR CHECKPOINT_DIR TO` (what `clusterfsdp export`
    runs, so that the control plane never imports torch)."""
    import argparse

    from ..control.runfolder import RunFolder

    p = argparse.ArgumentParser(prog="python -m clusterfsdp.worker.export")
    p.add_argument("run_dir")
    p.add_argument("checkpoint")
    p.add_argument("to")
    args = p.parse_args(argv)
    checkpoint = Path(args.checkpoint)
    out = export_hf(RunFolder(Path(args.run_dir)).spec(), checkpoint, Path(args.to))
    print(f"exported {checkpoint.name} to {out} (load with AutoModelForCausalLM.from_pretrained)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
