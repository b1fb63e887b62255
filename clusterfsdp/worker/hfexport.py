"""The export itself (`export.py` is its entry point): a DCP checkpoint as a HuggingFace folder,
config.json, safetensors weights, the tokenizer and generation_config.json, written next to the
target and renamed into place. LoRA runs go through `adapter_export.py` (the adapter folder, or
the merged model), imported only for them: it imports peft."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from torch.distributed.checkpoint.state_dict_loader import load
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode
from transformers.utils import logging as hf_logging

from ..core import ckptfolder, runfolder
from ..core.spec import JobSpec
from . import adapters, safeload
from . import model as modelmod
from .build import token_ids
from .checkpoint import dcp_call
from .progress import task
from .weights import compute_buffers

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
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    spec = sources(run.spec(), run)
    kept = run.model_dir if (run.model_dir / "config.json").is_file() else None
    trained = token_ids(spec)  # what the training config was built with (None for synthetic data)
    config = modelmod.build_config(spec.model, trained, kept)
    tokens = trained or token_ids(dataclasses.replace(spec, data=dataclasses.replace(spec.data, source="files")))
    lora = adapters.enabled(spec)
    if lora:  # peft: imported for a LoRA run's export only
        from . import adapter_export
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
