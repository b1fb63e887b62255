"""Export a DCP checkpoint as a plain HuggingFace model folder (config.json + safetensors)
that `from_pretrained` loads on one machine without FSDP or torch.distributed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..control.spec import JobSpec


def export_hf(spec: JobSpec, checkpoint_dir: Path, out: Path, log: Callable[[str], None] = print) -> Path:
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    from .model import DTYPES, build_config
    from .progress import task
    from .train import _data_vocab

    with task("building the model", log=log):
        config = build_config(spec.model, _data_vocab(spec))
        model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[spec.model.dtype])
    with task(f"loading checkpoint {checkpoint_dir.name}", log=log):
        state = {"model": model.state_dict()}
        dcp.load(state, checkpoint_id=str(checkpoint_dir), no_dist=True)  # pyright: ignore[reportPrivateImportUsage]
        model.load_state_dict(state["model"])
        model.tie_weights()
    with task(f"writing safetensors to {out}", log=log):
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
