"""`[eval] samples`: at every evaluation, a few prompts generated greedily by the model being
trained; rank 0 writes them to `<run>/samples/step-N.jsonl` (core.evalsamples) and the
trackers (TensorBoard text, a W&B table, an MLflow artifact).

Every rank runs the same generation on the *sharded* model, in lockstep: each forward is FSDP's
own, which gathers one decoder layer's weights at a time and frees them after, so generating
needs no more memory than an evaluation batch and no full copy of the weights anywhere, whatever
the model's size (FSDP1 and FSDP2 alike). Rank 0's greedy choice of each token is broadcast, so
the ranks stay in step even where their logits would differ in the last bit, and stop together.

The prompts are the same on every rank: the first lines of `eval.samples_file` (a chat run
renders each as a user message with the chat template's generation prompt, as training
rendered its conversations), or the first samples of the fixed eval order: a conversation up to
its first trained token (the template's assistant header included), a text's first half (at most
PROMPT_TOKENS tokens). A completion stops at the first special token (EOS, `<|im_end|>`).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..core import evalsamples as records
from ..core.spec import JobSpec
from ..data.mixsamples import MixtureSamples
from ..data.samples import PreparedSamples
from ..data.tokens import IGNORE_INDEX, DocumentEncoder

PROMPT_TOKENS = 32  # a text prompt taken from the eval set: its first half, at most this many tokens


class PromptError(ValueError):
    """eval.samples_file cannot give the prompts; one line naming the file."""


class SampleGenerator:
    """Made once by the Trainer on every rank; `generate(model, step)` at every evaluation
    (collective) returns the samples (the same on every rank)."""

    def __init__(self, spec: JobSpec, eval_set: PreparedSamples | MixtureSamples | None):
        self.spec, self.max_new = spec, spec.eval.samples_max_new_tokens
        self.encoder = DocumentEncoder(spec.data.tokenizer)
        tok: Any = self.encoder.tok  # a transformers tokenizer or the byte tokenizer
        self.stop = set(range(256, len(tok))) if self.encoder.is_bytes else set(tok.all_special_ids)
        if spec.eval.samples_file:
            self.prompts = [self._encode(p) for p in read_prompts(Path(spec.eval.samples_file), spec.eval.samples)]
        else:
            assert eval_set is not None  # spec checks: eval.samples needs an eval set
            # a mixture's eval set: its sources in turn, each its first samples
            parts = eval_set.parts if isinstance(eval_set, MixtureSamples) else [eval_set]
            n = min(spec.eval.samples, sum(part.count for part in parts))
            picks = [(parts[i % len(parts)], i // len(parts)) for i in range(n)]
            self.prompts = [eval_prompt(part, part.index_of(k)) for part, k in picks if k < part.count]
        # at most seq_len tokens: the end of a longer prompt, which the completion follows
        self.prompts = [ids[-spec.data.seq_len :] for ids in self.prompts]

    def _encode(self, text: str) -> list[int]:
        enc = self.encoder
        if self.spec.data.format == "chat":
            tok: Any = enc.tok
            user = [{"role": "user", "content": text}]
            text = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
            return [int(x) for x in enc.pieces([text])[0]]
        return [int(x) for x in np.concatenate([enc.prefix, enc.pieces([text])[0]])]

    def decode(self, ids: list[int]) -> str:
        tok: Any = self.encoder.tok
        return tok.decode(ids) if self.encoder.is_bytes else tok.decode(ids, skip_special_tokens=False)

    def generate(self, model, step: int, device: torch.device) -> list[records.EvalSample]:
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                out = [greedy(model, ids, self.max_new, self.stop, device) for ids in self.prompts]
        finally:
            model.train(was_training)
        pairs = zip(self.prompts, out, strict=True)
        return [records.EvalSample(step, self.decode(p), self.decode(c)) for p, c in pairs]


def greedy(model, prompt: list[int], max_new: int, stop: set[int], device: torch.device) -> list[int]:
    """Greedy decoding with the model's KV cache; rank 0's token broadcast at every step."""
    x = torch.tensor([prompt], dtype=torch.long, device=device)
    past, out = None, []
    inner = getattr(model, "module", model)  # FSDP1 wraps the transformers model
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(inner.forward).parameters else {}
    for _ in range(max_new):
        result = model(input_ids=x, past_key_values=past, use_cache=True, **last_only)
        token = result.logits[0, -1].argmax().reshape(1)
        if dist.is_initialized():
            dist.broadcast(token, src=0)
        chosen = int(token)
        if chosen in stop:
            break
        out.append(chosen)
        past, x = result.past_key_values, token.view(1, 1)
    return out


def eval_prompt(eval_set: PreparedSamples, k: int) -> list[int]:
    """Sample k's first document as a prompt: up to its first trained token when it has a loss
    mask (a conversation's prompt), else its first half (at most PROMPT_TOKENS)."""
    sample = eval_set.sample(k)
    ids, labels = sample.input_ids, sample.labels
    end = len(ids)
    if sample.positions is not None:  # packed documents: the first one
        restarts = np.flatnonzero(sample.positions[1:] == 0)
        end = int(restarts[0]) + 1 if len(restarts) else end
    trained = np.flatnonzero(labels[:end] != IGNORE_INDEX)
    if eval_set.mask is not None and len(trained):
        end = int(trained[0]) + 1  # labels[j] is the token at j + 1: the prompt ends before it
    else:
        end = max(1, min(end // 2, PROMPT_TOKENS))
    return [int(t) for t in ids[:end]]


def read_prompts(file: Path, n: int) -> list[str]:
    """The first n prompts of a .txt (one a line, blank lines skipped) or .jsonl ({"prompt": ...})."""
    try:
        lines = [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()][:n]
    except (OSError, UnicodeDecodeError) as e:
        raise PromptError(f"eval.samples_file: cannot read {file}: {e}") from None
    if file.suffix == ".txt":
        prompts = lines
    else:
        prompts = []
        for i, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise PromptError(f'eval.samples_file: {file}: line {i} is not a JSON object with a "prompt" string')
            prompts.append(row["prompt"])
    if not prompts:
        raise PromptError(f"eval.samples_file: {file} holds no prompt")
    return prompts
