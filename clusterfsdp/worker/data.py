"""Training data: a built-in byte tokenizer or a local HF tokenizer, text/jsonl files tokenized
once and cached, or synthetic tokens; a global sample order that every data-parallel rank
slices disjointly.

The data position is one integer, `consumed` (global samples used so far). Batch k of any
world size takes the next `world * micro_batch` samples of the same global order, so a
resume on a different number of GPUs neither repeats nor skips a sample.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

from ..control.spec import DataSection

BYTE_VOCAB = 260  # 256 bytes + BOS, EOS, PAD (+1 spare)
BOS, EOS, PAD = 256, 257, 258


class ByteTokenizer:
    """UTF-8 bytes as token ids: needs no download and round-trips every text."""

    vocab_size = BYTE_VOCAB
    eos_token_id = EOS

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def load_tokenizer(name: str):
    if name == "bytes":
        return ByteTokenizer()
    from transformers import AutoTokenizer

    if not Path(name).is_dir():
        raise FileNotFoundError(f"data.tokenizer: {name!r} is neither 'bytes' nor a local tokenizer folder")
    return AutoTokenizer.from_pretrained(name)


def _files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        matches = sorted(glob.glob(os.path.expanduser(p))) if any(c in p for c in "*?[") else [os.path.expanduser(p)]
        if not matches:
            raise FileNotFoundError(f"data.paths: {p!r} matches no file")
        out += [Path(m) for m in matches]
    for f in out:
        if not f.is_file():
            raise FileNotFoundError(f"data.paths: {f} is not a file")
    return out


def _documents(path: Path, text_key: str):
    if path.suffix == ".jsonl":
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield json.loads(line)[text_key]
                    except (json.JSONDecodeError, KeyError, TypeError) as e:
                        raise ValueError(f"{path}:{n}: not a JSON object with a {text_key!r} string ({e})") from None
    else:
        yield path.read_text(encoding="utf-8", errors="replace")


def tokenize_files(cfg: DataSection, cache_dir: Path, log: Callable[[str], None] | None = None) -> torch.Tensor:
    """All documents as one int32 token stream (EOS between documents), cached by content key.
    `log`: where progress goes (rank 0's log); None: quietly (the other ranks)."""
    from .progress import task

    files = _files(cfg.paths)
    key = hashlib.sha256(
        json.dumps(
            [cfg.tokenizer, cfg.text_key] + [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
        ).encode()
    ).hexdigest()[:20]
    cached = cache_dir / f"{key}.pt"
    if cached.is_file():
        return torch.load(cached)
    tok = load_tokenizer(cfg.tokenizer)
    eos = tok.eos_token_id if tok.eos_token_id is not None else 0
    ids: list[int] = []
    total = sum(f.stat().st_size for f in files)
    label = f"tokenizing {len(files)} file(s), {total / 2**20:.1f} MB"
    with task(label, total, log, every_s=30.0) as progress:
        for f in files:
            for doc in _documents(f, cfg.text_key):
                ids += [*tok.encode(doc), eos]
                progress.advance(len(doc.encode("utf-8", errors="replace")) + 1)
    stream = torch.tensor(ids, dtype=torch.int32)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(f".{cached.name}.{os.getpid()}")
    torch.save(stream, tmp)
    os.replace(tmp, cached)  # several ranks may race here; each writes the same bytes
    return stream


class Samples:
    """Fixed-length samples (seq_len + 1 tokens: inputs and shifted labels) in a seeded global order."""

    def __init__(
        self, cfg: DataSection, vocab_size: int, seed: int, cache_dir: Path, log: Callable[[str], None] | None = None
    ):
        self.seq_len, self.seed, self.vocab = cfg.seq_len, seed, vocab_size
        self.stream = tokenize_files(cfg, cache_dir, log) if cfg.source == "files" else None
        if self.stream is not None:
            self.count = (len(self.stream) - 1) // self.seq_len
            if self.count < 1:
                raise ValueError(f"data: {len(self.stream)} tokens is fewer than one sample of seq_len {self.seq_len}")
            top = int(self.stream.max())
            if top >= vocab_size:
                raise ValueError(f"data: token id {top} does not fit the model's vocab_size {vocab_size}")
        else:
            self.count = 1 << 30
        self._epoch, self._order = -1, torch.empty(0, dtype=torch.long)

    def _sample(self, index: int) -> torch.Tensor:
        if self.stream is None:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
            return torch.randint(0, self.vocab, (self.seq_len + 1,), generator=g)
        epoch, pos = divmod(index, self.count)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed + 7919 * epoch)
            self._epoch, self._order = epoch, torch.randperm(self.count, generator=g)
        start = int(self._order[pos]) * self.seq_len
        return self.stream[start : start + self.seq_len + 1].long()

    def batch(self, consumed: int, dp_rank: int, dp_size: int, micro_batch: int) -> torch.Tensor:
        """This rank's micro-batch of the global batch that starts at sample `consumed`."""
        first = consumed + dp_rank * micro_batch
        return torch.stack([self._sample(first + i) for i in range(micro_batch)])
