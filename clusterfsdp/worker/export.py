"""Export a DCP checkpoint as a HuggingFace folder that plain transformers loads and generates from:
config.json (the training config with `use_cache: true` and the tokenizer's bos/eos/pad ids),
safetensors weights in a chosen dtype, the tokenizer (for the built-in byte tokenizer, an HF
tokenizer that encodes the same ids) and generation_config.json.

`python -m clusterfsdp.worker.export RUN_DIR --step N --to DIR [--dtype D] [--force]`; the CLI's
`clusterfsdp export` runs it as a subprocess (the control plane never imports torch). It reads
only the run folder: the checkpoint, job.toml and <run>/model/ (the model's config files and the
tokenizer's files, copied there at submit), so it works after the original folders moved.
The folder is written next to DIR and renamed into place: a failed export leaves DIR as it was.

This module is the entry point: it answers a bad argument or a missing checkpoint without
importing torch or transformers; the export itself is `hfexport.py`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path

from ..core import ckptfolder, runfolder
from ..core.spec import SpecError
from . import warmstart

EXIT_FAILED, EXIT_BAD_INPUT = 1, 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m clusterfsdp.worker.export", description=(__doc__ or "").split("\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--step", type=int, help="checkpoint step (default: the newest complete one)")
    p.add_argument("--to", required=True)
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="default: model.dtype (LoRA --merge: peft.base_dtype when set)",
    )
    p.add_argument("--force", action="store_true", help="replace a non-empty --to folder")
    p.add_argument(
        "--merge", action="store_true", help="LoRA runs: a full model with the adapters merged (default: the adapters)"
    )
    args = p.parse_args(argv)

    warnings.simplefilter("ignore")  # torch/transformers warnings would bury the one-line result
    logging.disable(logging.CRITICAL)  # and so would their logged errors: DCP logs each failed read with its traceback

    run = runfolder.RunFolder(Path(args.run_dir))
    out = Path(args.to).expanduser().absolute()
    if problem := runfolder.export_refusal(run, out):
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not args.force)):
        problem = "not a folder" if not out.is_dir() else "not empty (use --force to replace it)"
        print(f"error: --to {out}: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        info = ckptfolder.find(run.checkpoints_dir(), args.step)
    except SpecError as e:
        print(f"error: {run.job_toml}: {e.errors[0]}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if info is None:
        at = f" at step {args.step}" if args.step is not None else ""
        print(f"error: run {run.id}: no complete checkpoint{at}", file=sys.stderr)
        return EXIT_BAD_INPUT
    lora = run.spec().peft.method == "lora"
    if args.merge and not lora:
        print(f"error: --merge: run {run.id} is a full fine-tune (its export is a full model already)", file=sys.stderr)
        return EXIT_BAD_INPUT
    # Here, not at the top: the refusals above answer in a fraction of a second, and the filters
    # above silence what torch and transformers say while they are imported; as a cold rank
    # imports them (the collector off, then frozen: worker/warmstart.py).
    with warmstart.frozen_imports():
        from .hfexport import export_hf

    try:
        export_hf(run, info.path, out, args.dtype, args.force, args.merge)
    except Exception as e:  # one line, no traceback: a corrupt checkpoint, a missing tokenizer, a full disk
        reason = " ".join(str(e).split())[:500]
        print(
            f"error: exporting step {info.step} of run {run.id} failed: {type(e).__name__}: {reason}", file=sys.stderr
        )
        return EXIT_FAILED
    loads = (
        "peft.PeftModel.from_pretrained(base, DIR), its generation config GenerationConfig.from_pretrained(DIR)"
        if lora and not args.merge
        else "AutoModelForCausalLM"
    )
    print(f"exported step {info.step} to {out} ({loads} / AutoTokenizer.from_pretrained)")
    return 0


if __name__ == "__main__":
    # It reads only the run folder, never the hub (and an export a warm launcher forks has its
    # modules imported under this too: core/warmlaunch.py). Not in `main`: worker/bench.py calls
    # it in a process whose lm-eval may still need the hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
