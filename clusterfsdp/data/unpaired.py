"""Unpaired examples (data.format = 'unpaired'), what train.objective = 'kto' trains on: a prompt,
a completion and a label, true when the completion is desirable, false when not (KTO's data
shape: TRL's `prompt` / `completion` / `label`). Pure Python; listed in
fieldmap.READERS (reading a record) and tokens.ENCODERS (its documents).

An example is prepared as two documents, like a pair (packing 'pairs', one sample two rows):
the prompt with its completion, and the prompt with the completion of the example before it in
its encode batch (the first takes the last's) - the mismatched pair KTO's KL term is estimated
from. That is TRL's construction (`KTOTrainer` rotates the completions by one within each
batch of `per_device_train_batch_size` when it prepares the dataset), with the prepare batch of
about 1 MiB of records in place of the device batch; being fixed at prepare time, the KL row's
reference log-prob is computed once with the completion's (worker/preference.ReferenceTable).
The label is kept in the loss mask: the completion's trained tokens are 1 when desirable,
`UNDESIRABLE` (2) when not (every reader of the mask takes nonzero as trained).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .recordparts import after_prompt, as_messages, record_chars
from .sources import DataError

if TYPE_CHECKING:
    from .fieldmap import FieldMap

UNDESIRABLE = 2  # the mask value of an undesirable completion's trained tokens


@dataclass(frozen=True)
class Unpaired:
    """An unpaired example: all strings (text, joined) or all messages (the chat template)."""

    prompt: str | list[dict[str, str]]
    completion: str | list[dict[str, str]]
    desirable: bool

    @property
    def chat(self) -> bool:
        return not isinstance(self.prompt, str)

    def __len__(self) -> int:
        """Characters of text (what a batch of records to encode is measured in)."""
        return record_chars(self.prompt) + record_chars(self.completion)


def read(fm: FieldMap, record: dict, where: str) -> Unpaired:
    """An unpaired record (fieldmap.READERS['unpaired']): the prompt and completion as a pair's
    parts are read (a string, or messages; with messages anywhere both become messages, the
    completion without the prompt's messages it repeats), the label a JSON true or false."""
    completion_key, label_key = fm.unpaired_keys
    if not fm.pair_keys[0]:
        raise DataError(f"{where}: format 'unpaired' reads a prompt: set {fm.where}prompt_key to its field")
    prompt = fm._pair_part(record, 0, where)
    completion = fm._pair_part(record, 1, where, completion_key, "completion_key")
    label = fm._get(record, label_key, f"{fm.where}label_key", where)
    if not isinstance(label, bool):
        raise DataError(
            f"{where}: {label_key!r} is {type(label).__name__} {str(label)[:30]!r}, not true or false "
            f"({fm.where}label_key: true for a desirable completion, false for an undesirable one)"
        )
    if isinstance(prompt, str) and isinstance(completion, str):
        return Unpaired(prompt, completion, label)
    p = as_messages(prompt, "user")
    c = after_prompt(p, as_messages(completion, "assistant"))
    if not any(m["role"] == "assistant" for m in c):
        raise DataError(f"{where}: {completion_key!r} has no 'assistant' message after the prompt: nothing to train on")
    return Unpaired(p, c, label)


def _document(enc: Any, prompt: Any, completion: Any, where: object) -> Any:
    """prompt + completion as one document (tokens.Encoded), the mask 1 on the completion."""
    if isinstance(prompt, str):
        return enc._masked(prompt + str(completion), len(prompt))
    if enc.backend is None or not hasattr(enc.tok, "apply_chat_template"):
        raise DataError(f"{where}: an example of messages needs a HF tokenizer with a chat template")
    return enc._chat_answer(prompt, completion, where)


def encode(
    enc: Any, examples: list[Unpaired], wheres: list[object], refused: Callable[[DataError], None] | None
) -> list[Any]:
    """tokens.ENCODERS['unpaired']: each example as two documents, (prompt + its completion, the
    label in the mask) and (prompt + the previous example's completion: the KL row). An example
    the chat template refuses goes to `refused` (None: raise) and is left out whole; the rotation
    is over the examples kept."""
    kept: list[tuple[Unpaired, object, Any]] = []
    for example, where in zip(examples, wheres, strict=True):
        try:
            if kept and example.chat != kept[0][0].chat:
                raise DataError(
                    f"{where}: unpaired records mix strings and message lists (the record before it in this file "
                    "has the other kind): a completion is put after another record's prompt for the KL term"
                )
            doc = _document(enc, example.prompt, example.completion, where)
        except DataError as e:
            if refused is None:
                raise
            refused(e)
            continue
        if not example.desirable:
            doc = dataclasses.replace(doc, mask=doc.mask * UNDESIRABLE)
        kept.append((example, where, doc))
    if len(kept) == 1:
        raise DataError(
            f"{kept[0][1]}: the only unpaired example read with it (its file, or what is left of it): KTO puts each "
            "prompt with another example's completion for its KL term; give each file 2 examples at least"
        )
    out: list[Any] = []
    for k, (example, where, doc) in enumerate(kept):
        other = kept[k - 1][0].completion  # k = 0: the last one's
        try:
            kl = _document(enc, example.prompt, other, where)
        except DataError as e:
            if refused is None:
                raise
            refused(e)
            continue
        out += [doc, kl]
    return out
