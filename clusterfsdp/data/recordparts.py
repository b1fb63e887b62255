"""The parts of a record every reader of data/ shares (fieldmap's pairs, unpaired's examples):
messages, what an answer repeats of its prompt, how much text a record holds. A leaf: the
format modules import it, and fieldmap imports the format modules (READERS), never the reverse."""

from __future__ import annotations

from typing import Any


def after_prompt(prompt: list[dict[str, str]], answer: list[dict[str, str]]) -> list[dict[str, str]]:
    """`answer` without the messages it repeats of the prompt (UltraFeedback's answers are whole
    conversations)."""
    return answer[len(prompt) :] if answer[: len(prompt)] == prompt else answer


def record_chars(value: Any) -> int:
    """Characters of text a record's value holds: a string, messages, a Pair or an Unpaired."""
    if isinstance(value, list):
        return sum(len(m["content"]) for m in value)
    return len(value)


def as_messages(value: str | list[dict[str, str]], role: str) -> list[dict[str, str]]:
    """A pair's or an example's part as messages (a string: one message of `role`)."""
    return [{"role": role, "content": value}] if isinstance(value, str) else list(value)
