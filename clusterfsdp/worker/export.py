"""Export a DCP checkpoint as a HuggingFace folder that plain transformers loads and generates from:
config.json (the training config with `use_cache: true` and the tokenizer's bos/eos/pad ids),
safetensors weights in a chosen dtype, the tokenizer (for the built-in byte tokenizer, an HF
tokenizer that encodes the same ids) and generation_config.json.

`python -m clusterfsdp.worker.export RUN_DIR --step N --to DIR [--dtype D] [--force]`; the CLI's
`clusterfsdp export` runs it as a subprocess (the control plane never imports torch). It reads
only the run folder: the checkpoint, job.toml and <run>/model/ (the model's config files and the
tokenizer's files, copied there at submit), so it works after the original folders moved.
The folder is written next to DIR and renamed into place: a failed export leaves DIR as it was.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

from ..core import ckptfolder, runfolder
from ..core.spec import JobSpec, SpecError

EXIT_FAILED, EXIT_BAD_INPUT = 1, 2
BYTE_SPECIALS = ("<bos>", "<eos>", "<pad>")  # ids 256, 257, 258 (data/tokens.py)


def sources(spec: JobSpec, run: runfolder.RunFolder) -> JobSpec:
    """The spec with its tokenizer pointing at the run's kept copy when there is one."""
    kept = run.model_dir / "tokenizer"
    if spec.data.tokenizer != "bytes" and kept.is_dir():
        return dataclasses.replace(spec, data=dataclasses.replace(spec.data, tokenizer=str(kept)))
    return spec


def byte_tokenizer():
    """An HF tokenizer giving the ids of data.ByteTokenizer: UTF-8 bytes 0-255, then <bos> <eos> <pad>
    (written literally in a text they stay bytes: split_special_tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = bytes_to_unicode()  # byte -> the printable character byte-level BPE uses for it
    tok = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)  # type: ignore[assignment]
    tok.decoder = decoders.ByteLevel()  # type: ignore[assignment]
    tok.add_special_tokens(list(BYTE_SPECIALS))
    bos, eos, pad = BYTE_SPECIALS
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad, split_special_tokens=True
    )


def export_hf(
    run: runfolder.RunFolder, checkpoint_dir: Path, out: Path, dtype: str | None, force: bool, merge: bool = False
) -> Path:
    from transformers.utils import logging as hf_logging

    from . import adapter_export, adapters
    from . import model as modelmod
    from .build import token_ids
    from .progress import task

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    spec = sources(run.spec(), run)
    kept = run.model_dir if (run.model_dir / "config.json").is_file() else None
    trained = token_ids(spec)  # what the training config was built with (None for synthetic data)
    config = modelmod.build_config(spec.model, trained, kept)
    tokens = trained or token_ids(dataclasses.replace(spec, data=dataclasses.replace(spec.data, source="files")))
    lora = adapters.enabled(spec)
    tmp = out.with_name(f".{out.name}.export-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if lora and not merge:
            with task(f"writing the adapters of {checkpoint_dir.name} to {out}"):
                adapter_export.write_adapter(run, spec, config, checkpoint_dir, tmp)
            _write_tokenizer(spec, tmp)
            _generation_config(spec, kept, config, tokens).save_pretrained(tmp)
            _replace(tmp, out, force)
            return out
        with task(f"loading checkpoint {checkpoint_dir.name}" + (" and merging the adapters" if lora else "")):
            model: Any = (
                adapter_export.merged_model(spec, config, checkpoint_dir)
                if lora
                else _full_model(spec, config, checkpoint_dir)
            )
        config.use_cache = True
        assert tokens is not None  # (a tokenizer, or the byte tokenizer)
        for name in ("bos", "eos", "pad"):
            if getattr(tokens, name) is not None:
                setattr(config, f"{name}_token_id", getattr(tokens, name))
        model.to(modelmod.DTYPES[dtype or spec.base_dtype])
        with task(f"writing safetensors to {out}"):
            model.save_pretrained(tmp, safe_serialization=True)
        _write_tokenizer(spec, tmp)
        _generation_config(spec, kept, config, tokens).save_pretrained(tmp)
        _replace(tmp, out, force)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _generation_config(spec: JobSpec, kept: Path | None, config, tokens) -> Any:
    """generation_config.json of an export, the same for a full model, a merged one and a LoRA
    adapter folder: the base's own (kept in <run>/model/ at submit), else one made from the
    config, with the bos/eos/pad ids of the tokenizer the run trained with; a run on chat data
    also stops at the token that ends an answer in the chat template (`<|im_end|>` for ChatML),
    which the run trained on as part of every answer while the tokenizer's eos may be another
    (`<|endoftext|>` for a base model's tokenizer). An adapter folder carries it too, since
    `PeftModel.from_pretrained(base, DIR)` generates with the base's generation config:
    `GenerationConfig.from_pretrained(DIR)` stops it where the merged export stops."""
    from transformers import GenerationConfig

    gen = (
        GenerationConfig.from_pretrained(kept)
        if kept is not None and (kept / "generation_config.json").is_file()
        else GenerationConfig.from_model_config(config)
    )
    for name in ("bos", "eos", "pad"):
        if tokens is not None and getattr(tokens, name) is not None:
            setattr(gen, f"{name}_token_id", getattr(tokens, name))
    chat = spec.data.format == "chat" or any(s.format == "chat" for s in spec.data.sources)
    turn = _end_of_answer(spec.data.tokenizer) if chat and spec.data.tokenizer != "bytes" else None
    eos = gen.eos_token_id
    have = list(eos) if isinstance(eos, list) else [] if eos is None else [eos]
    if turn is not None and turn not in have:
        gen.eos_token_id = [*have, turn] if have else turn
    return gen


def _end_of_answer(tokenizer: str) -> int | None:
    """The first special token the chat template puts after an assistant message's text (None
    when it puts none, or the tokenizer has no template)."""
    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(tokenizer)
    answer = "clusterfsdp answer"
    messages = [{"role": "user", "content": "question"}, {"role": "assistant", "content": answer}]
    try:
        text = tok.apply_chat_template(messages, tokenize=False)
    except Exception:  # no template, or one that refuses this conversation: nothing to add
        return None
    after = text[text.rindex(answer) + len(answer) :]
    specials = set(tok.all_special_ids)
    return next((int(i) for i in tok(after, add_special_tokens=False)["input_ids"] if i in specials), None)


def _full_model(spec: JobSpec, config, checkpoint_dir: Path) -> Any:
    """The model of a full fine-tune's checkpoint, on the CPU (a transformers model)."""
    from torch.distributed.checkpoint.state_dict_loader import load

    from . import model as modelmod
    from . import safeload
    from .checkpoint import dcp_call
    from .weights import compute_buffers

    model: Any = modelmod.build_meta(spec.model, config).to_empty(device="cpu")
    compute_buffers(model)
    state = {"model": model.state_dict()}
    meta = ckptfolder.read_meta(checkpoint_dir)
    reader, planner = safeload.SafeReader(checkpoint_dir, meta), safeload.SafePlanner()
    dcp_call(f"loading {checkpoint_dir.name}", load, state, storage_reader=reader, planner=planner, no_dist=True)
    model.load_state_dict(state["model"])
    model.tie_weights()
    return model


def _write_tokenizer(spec: JobSpec, folder: Path) -> None:
    from transformers import AutoTokenizer

    if spec.data.tokenizer == "bytes":
        byte_tokenizer().save_pretrained(folder)
    else:
        AutoTokenizer.from_pretrained(spec.data.tokenizer).save_pretrained(folder)


def _replace(tmp: Path, out: Path, force: bool) -> None:
    """Move the finished export into place; with force, an existing folder is removed only after."""
    if out.exists() and any(out.iterdir()) and not force:
        raise FileExistsError(f"--to {out}: not empty (use --force to replace it)")
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


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
    raise SystemExit(main())
