"""Real tokenizers and data files for the data tests: a small byte-level BPE trained here with
the `tokenizers` library on the shipped corpus and saved as a HF tokenizer folder (with a
ChatML chat template that has no {% generation %} markers), and one set of documents written
as every kind of source clusterfsdp reads."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

from procs import CORPUS

from clusterfsdp.core import spec as S

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = [
    "river", "stone", "lamp", "quiet", "north", "garden", "silver", "window", "paper", "horse", "cloud",
    "bread", "winter", "candle", "mirror", "forest", "letter", "bridge", "anchor", "meadow",
]  # fmt: skip


def make_tokenizer(folder: Path, chat_template: str | None = CHATML, vocab_size: int = 400) -> Path:
    """A byte-level BPE (GPT-2 style) trained on corpus.txt, saved with save_pretrained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([CORPUS.read_text(), " ".join(WORDS)], trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    hf.add_special_tokens({"additional_special_tokens": specials[1:]})
    if chat_template:
        hf.chat_template = chat_template
    hf.save_pretrained(folder)
    return folder


def documents(n: int = 60, seed: int = 0) -> list[str]:
    """Documents of varied length cut from the shipped corpus (some longer than a 64-token sample)."""
    text = CORPUS.read_text()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start = rng.randrange(0, len(text) - 400)
        out.append(text[start : start + rng.choice([20, 60, 150, 400])])
    return out


def conversations(n: int, seed: int = 0, answer: str = "yes") -> list[dict]:
    """Random prompts (a few random words, sometimes with a system message), one fixed answer."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        messages = [{"role": "system", "content": "Answer."}] if rng.random() < 0.3 else []
        messages.append({"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))})
        messages.append({"role": "assistant", "content": answer})
        out.append({"messages": messages})
    return out


def write_jsonl(path: Path, records: list[dict]) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in records).encode()
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text))
    elif path.name.endswith(".zst"):
        import zstandard

        # two frames: readers must continue across frames
        half = len(text) // 2
        cut = text.index(b"\n", half) + 1
        c = zstandard.ZstdCompressor()
        path.write_bytes(c.compress(text[:cut]) + c.compress(text[cut:]))
    else:
        path.write_bytes(text)
    return path


def write_parquet(path: Path, records: list[dict], row_group_size: int = 7) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records), path, row_group_size=row_group_size)
    return path


def write_saved_dataset(path: Path, records: list[dict], split: str | None = None) -> Path:
    """datasets' save_to_disk: a Dataset, or a DatasetDict with `split` (and a 'test' split)."""
    import datasets

    ds = datasets.Dataset.from_list(records)
    if split is None:
        ds.save_to_disk(str(path))
    else:
        datasets.DatasetDict({split: ds, "test": ds.select(range(2))}).save_to_disk(str(path))
    return path


def job(tmp: Path, paths: list[Path], tokenizer: str, *extra: str, cache: Path | None = None) -> S.JobSpec:
    """A 1-rank job reading `paths` (seq_len 32, micro-batch 2), its cache in tmp/cache."""
    text = f"""
[job]
run_root = "{tmp}"
[data]
source = "files"
paths = {json.dumps([str(p) for p in paths])}
tokenizer = "{tokenizer}"
seq_len = 32
cache_dir = "{cache or tmp / "cache"}"
[train]
micro_batch_size = 2
"""
    return S.loads(text, list(extra))
