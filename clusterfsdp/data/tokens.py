"""Documents -> token ids, the same way for every source and every prepare process.

A text document becomes [the tokenizer's leading special tokens, e.g. BOS] + its tokens + [EOS].
A conversation (format 'chat') becomes the tokens of its chat-template rendering, with a mask
that is 1 on the tokens of assistant messages. The template needs no `{% generation %}`
markers: for each assistant message the conversation up to it is rendered twice, with the
generation prompt (the prompt) and with the message (prompt + answer); the answer is the
characters in between, and a token is trained on when it holds characters of an answer (character
offsets from the fast tokenizer). A template that renders an earlier part of the conversation
differently once later messages follow (some strip the reasoning of earlier turns) cannot be
split exactly, and is refused with the record named.

A preference pair (format 'preference', fieldmap.Pair) becomes two documents in a row, the
prompt with the chosen answer and the prompt with the rejected one, each with a mask that is 1
on its answer's tokens only (strings: prefix + prompt + answer + EOS, the answer and EOS
trained; messages: the chat template's rendering, the answer's assistant messages trained).
An unpaired example (format 'unpaired', data/unpaired.py) becomes two documents the same way:
the prompt with its completion, and the prompt with another example's completion (KTO's KL
row). `ENCODERS` names the encoding of each data.format.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import unpaired
from .fieldmap import Pair
from .sources import DataError

BYTE_VOCAB = 260  # 256 bytes + BOS, EOS, PAD (+1 spare)
BOS, EOS, PAD = 256, 257, 258
IGNORE_INDEX = -100  # a label never trained on (prompts, padding, document ends): the loss skips it


class ByteTokenizer:
    """UTF-8 bytes as token ids: needs no download and round-trips every text."""

    vocab_size = BYTE_VOCAB
    eos_token_id = EOS

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def __len__(self) -> int:
        return BYTE_VOCAB


def load_tokenizer(name: str):
    if name == "bytes":
        return ByteTokenizer()
    # transformers (heavy) only where text is tokenized
    from transformers import AutoTokenizer

    if not Path(name).is_dir():
        raise DataError(f"data.tokenizer: {name!r} is neither 'bytes' nor a local tokenizer folder")
    return AutoTokenizer.from_pretrained(name)


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


@dataclass
class Encoded:
    ids: np.ndarray
    mask: np.ndarray | None = None  # uint8, 1 = trained on (chat only)


class DocumentEncoder:
    """One tokenizer, loaded once per process, turning batches of documents into token arrays."""

    def __init__(self, tokenizer_name: str):
        self.name = tokenizer_name
        self.tok: Any = load_tokenizer(tokenizer_name)
        self.vocab_size = len(self.tok)
        self.dtype = token_dtype(self.vocab_size)
        self.is_bytes = isinstance(self.tok, ByteTokenizer)
        eos = self.tok.eos_token_id
        if eos is None:
            raise DataError(f"data.tokenizer: {tokenizer_name} has no eos_token: documents could not be separated")
        self.eos = int(eos)
        self.prefix = np.zeros(0, self.dtype) if self.is_bytes else np.asarray(self._special_prefix(), self.dtype)
        self.backend = None if self.is_bytes else self.tok.backend_tokenizer

    def _special_prefix(self) -> list[int]:
        """The special tokens the tokenizer puts before a text on its own (BOS for Llama, none for GPT-2)."""
        bare = self.tok("a", add_special_tokens=False)["input_ids"]
        full = self.tok("a", add_special_tokens=True)["input_ids"]
        for i in range(len(full) - len(bare) + 1):
            if full[i : i + len(bare)] == bare:
                return list(full[:i])
        return []

    def _ids(self, texts: list[str]) -> list[np.ndarray]:
        if self.is_bytes:
            return [np.frombuffer(t.encode("utf-8"), np.uint8).astype(self.dtype) for t in texts]
        assert self.backend is not None
        return [np.asarray(e.ids, self.dtype) for e in self.backend.encode_batch_fast(texts, add_special_tokens=False)]

    def texts(self, texts: list[str]) -> list[Encoded]:
        """Whole documents: prefix + tokens + EOS."""
        eos = np.asarray([self.eos], self.dtype)
        return [Encoded(np.concatenate([self.prefix, ids, eos])) for ids in self._ids(texts)]

    def pieces(self, texts: list[str]) -> list[np.ndarray]:
        """Parts of one long document, without special tokens."""
        return self._ids(texts)

    # ---- chat
    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def _answer_spans(
        self, messages: list[dict[str, Any]], where: object, first: int = 0
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the character spans of its assistant messages from
        message `first` on (a pair's answer: not the assistant turns of its prompt)."""
        try:
            text = self._render(messages, False)
            spans = []
            for i, m in enumerate(messages):
                if m["role"] != "assistant" or i < first:
                    continue
                prompt = self._render(messages[:i], True) if i else ""
                upto = self._render(messages[: i + 1], False)
                if not (upto.startswith(prompt) and text.startswith(upto)):
                    raise DataError(
                        f"{where}: the tokenizer's chat template renders the conversation up to message {i} "
                        "differently inside the whole conversation, so prompt and answer tokens cannot be told "
                        "apart exactly (split this conversation into one record per assistant turn)"
                    )
                spans.append((len(prompt), len(upto)))
        except DataError:
            raise
        except Exception as e:  # jinja2's TemplateError and the template's own raise_exception
            raise DataError(f"{where}: the chat template refused this conversation: {e}") from None
        return text, spans

    def chats(
        self,
        conversations: list[list[dict[str, Any]]],
        wheres: list[object],
        refused: Callable[[DataError], None] | None = None,
    ) -> list[Encoded]:
        """Conversations -> template tokens, mask 1 on the tokens that hold characters of an assistant
        message. `wheres` name the records in errors (str() is taken only then); a conversation the
        template cannot render goes to `refused` (which raises to stop; None: raise) and is left out."""
        if self.backend is None or not hasattr(self.tok, "apply_chat_template"):
            raise DataError("data.format: 'chat' needs a HF tokenizer with a chat template")
        rendered = []
        for c, w in zip(conversations, wheres, strict=True):
            try:
                rendered.append(self._answer_spans(c, w))
            except DataError as e:
                if refused is None:
                    raise
                refused(e)
        encodings = self.backend.encode_batch([t for t, _ in rendered], add_special_tokens=False)
        out = []
        for (_, spans), enc in zip(rendered, encodings, strict=True):
            offsets = np.asarray(enc.offsets, np.int64).reshape(-1, 2)
            mask = np.zeros(len(offsets), np.uint8)
            for a, b in spans:
                mask[(offsets[:, 1] > a) & (offsets[:, 0] < b)] = 1
            out.append(Encoded(np.asarray(enc.ids, self.dtype), mask))
        return out

    # ---- preference pairs
    def _masked(self, text: str, start: int) -> Encoded:
        """prefix + tokens of `text` + EOS, the mask 1 on the tokens holding characters from
        `start` on, and on EOS."""
        if self.is_bytes:
            ids = self._ids([text])[0]
            mask = np.zeros(len(ids), np.uint8)
            mask[len(text[:start].encode("utf-8")) :] = 1
        else:
            assert self.backend is not None
            enc = self.backend.encode(text, add_special_tokens=False)
            ids = np.asarray(enc.ids, self.dtype)
            offsets = np.asarray(enc.offsets, np.int64).reshape(-1, 2)
            mask = (offsets[:, 1] > start).astype(np.uint8)
        return Encoded(
            np.concatenate([self.prefix, ids, np.asarray([self.eos], self.dtype)]),
            np.concatenate([np.zeros(len(self.prefix), np.uint8), mask, np.ones(1, np.uint8)]),
        )

    def _chat_answer(self, prompt: list[dict[str, Any]], answer: list[dict[str, Any]], where: object) -> Encoded:
        assert self.backend is not None
        text, spans = self._answer_spans([*prompt, *answer], where, first=len(prompt))
        enc = self.backend.encode(text, add_special_tokens=False)
        offsets = np.asarray(enc.offsets, np.int64).reshape(-1, 2)
        mask = np.zeros(len(offsets), np.uint8)
        for a, b in spans:
            mask[(offsets[:, 1] > a) & (offsets[:, 0] < b)] = 1
        return Encoded(np.asarray(enc.ids, self.dtype), mask)

    def pairs(
        self, pairs: list[Pair], wheres: list[object], refused: Callable[[DataError], None] | None = None
    ) -> list[Encoded]:
        """Each pair as two documents (chosen, rejected); a pair the chat template refuses goes to
        `refused` (None: raise) and is left out whole."""
        out: list[Encoded] = []
        for pair, where in zip(pairs, wheres, strict=True):
            try:
                if not pair.chat:
                    prompt, answers = str(pair.prompt), (str(pair.chosen), str(pair.rejected))
                    docs = [self._masked(prompt + a, len(prompt)) for a in answers]
                elif self.backend is None or not hasattr(self.tok, "apply_chat_template"):
                    raise DataError(f"{where}: a pair of messages needs a HF tokenizer with a chat template")
                else:  # (fieldmap makes every part messages when one is)
                    answers = [a for a in (pair.chosen, pair.rejected) if not isinstance(a, str)]
                    assert not isinstance(pair.prompt, str) and len(answers) == 2
                    docs = [self._chat_answer(pair.prompt, a, where) for a in answers]
            except DataError as e:
                if refused is None:
                    raise
                refused(e)
                continue
            out += docs
        return out

    def encode(
        self, format: str, records: list[Any], wheres: list[object], refused: Callable[[DataError], None]
    ) -> list[Encoded]:
        """The documents of a batch of records of one data.format (ENCODERS)."""
        return ENCODERS[format](self, records, wheres, refused)


# How the records of each data.format become documents.
ENCODERS: dict[str, Callable[..., list[Encoded]]] = {
    "text": lambda enc, records, wheres, refused: enc.texts(records),
    "chat": DocumentEncoder.chats,
    "preference": DocumentEncoder.pairs,
    "unpaired": unpaired.encode,
}
