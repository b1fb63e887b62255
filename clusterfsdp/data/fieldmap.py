"""How a record's fields become a document: the text of a text record, the messages of a chat
record. Pure Python (validate reads the first record of each source with it; prepare reads all).

A preference pair (format 'preference') is a prompt and two answers (`Pair`), each a string or a
list of messages (data.prompt_key, chosen_key, rejected_key); an unpaired example (format
'unpaired', data/unpaired.py) a prompt, a completion and a desirability label (prompt_key,
completion_key, label_key). The readers of each format are looked up in `READERS`.

The plain form is `data.text_key` / `data.messages_key` with {role, content} messages. A
`[[data.sources]]` entry may map other shapes onto it: messages under another key with other
field names and role values (ShareGPT: `conversations` of {from, value}, human/gpt), or
templates of a record's columns (Alpaca: prompt '{instruction}\\n\\n{input}', response
'{output}') that become a user and an assistant message (or one text). The mapping is part of
the prepared dataset's key (`key_payload`), so changing it prepares the data again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core import spec as specmod
from ..core.spec.templates import template_fields
from ..core.value import value
from . import unpaired
from .recordparts import after_prompt, as_messages, record_chars
from .sources import DataError


class MissingKey(DataError):
    """A record without a field the mapping names (validate refuses it for an explicit mapping,
    whatever data.bad_records says: every record would be skipped)."""


@value(frozen=True)
class FieldMap:
    """The fields one source's records are read through, and the job.toml keys that name them."""

    format: str  # 'text' | 'chat' | 'preference' | 'unpaired'
    text_key: str
    messages_key: str
    role_key: str = "role"
    content_key: str = "content"
    roles: tuple[tuple[str, str], ...] = ()
    prompt: str = ""
    response: str = ""
    system: str = ""
    where: str = "data."  # the prefix of the job.toml keys that name them ('' for a source's own)
    pair_keys: tuple[str, str, str] = ("prompt", "chosen", "rejected")  # format 'preference'
    unpaired_keys: tuple[str, str] = ("completion", "label")  # format 'unpaired' (and pair_keys[0], the prompt)

    @staticmethod
    def of(data: specmod.DataSection) -> FieldMap:
        """The mapping of a [data] section; a part's section (cache.part_data) carries its source."""
        keys = (data.prompt_key, data.chosen_key, data.rejected_key)
        example_keys = (data.completion_key, data.label_key)
        if len(data.sources) != 1:
            return FieldMap(data.format, data.text_key, data.messages_key, pair_keys=keys, unpaired_keys=example_keys)
        s = data.sources[0]
        return FieldMap(
            data.format,
            data.text_key,
            data.messages_key,
            s.role_key,
            s.content_key,
            tuple(sorted(s.roles.items())),
            s.prompt,
            s.response,
            s.system,
            "",  # errors name the source already (data.sources[i].path: file:line)
            keys,
            example_keys,
        )

    @property
    def templated(self) -> bool:
        return bool(self.prompt or self.response)

    @property
    def key(self) -> str:
        """The record field read without templates: the text, the messages, or a pair's answer."""
        keys = {"chat": self.messages_key, "preference": self.pair_keys[1], "unpaired": self.unpaired_keys[0]}
        return keys.get(self.format, self.text_key)

    @property
    def field(self) -> str:
        """The job.toml key naming it."""
        name = {"chat": "messages_key", "preference": "chosen_key", "unpaired": "completion_key"}.get(
            self.format, "text_key"
        )
        return f"{self.where}{name}"

    def columns(self) -> list[str]:
        """The record fields (table columns) the mapping reads."""
        if self.format == "preference":
            return [k for k in self.pair_keys if k]
        if self.format == "unpaired":
            return [k for k in (self.pair_keys[0], *self.unpaired_keys) if k]
        if not self.templated:
            return [self.key]
        names = [n for t in (self.system, self.prompt, self.response) for n in template_fields(t)]
        return list(dict.fromkeys(names))

    def key_payload(self) -> dict[str, Any]:
        """What the prepared dataset's key holds of the mapping beyond the record key (nothing for
        the plain form, so datasets prepared before mappings existed keep their keys)."""
        out: dict[str, Any] = {}
        if (self.role_key, self.content_key) != ("role", "content") or self.roles:
            out.update(role_key=self.role_key, content_key=self.content_key, roles=list(self.roles))
        if self.templated:
            out.update(prompt=self.prompt, response=self.response, system=self.system)
        if self.format == "preference":
            out.update(pair_keys=list(self.pair_keys))
        if self.format == "unpaired":
            out.update(prompt_key=self.pair_keys[0], unpaired_keys=list(self.unpaired_keys))
        return out

    # ---------------------------------------------------------------- reading a record
    def apply(self, record: Any, where: str) -> Any:
        """The text, messages or Pair of one decoded record (READERS[format]); DataError naming
        `where` and the key."""
        if not isinstance(record, dict):
            raise DataError(f"{where}: not a JSON object")
        return READERS[self.format](self, record, where)

    def _document(self, record: dict, where: str) -> str | list[dict[str, str]]:
        """The text or the messages of a text or chat record."""
        if self.templated:
            return self._templates(record, where)
        value = self._get(record, self.key, self.field, where)
        if self.format == "text":
            if not isinstance(value, str):
                raise DataError(f"{where}: {self.key!r} is {type(value).__name__}, not a string")
            return value
        if not isinstance(value, list) or not value:
            raise DataError(f"{where}: {self.key!r} must be a non-empty list of {{role, content}} messages")
        raw = value
        if (self.role_key, self.content_key) != ("role", "content") or self.roles:
            value = [self._message(m, n, where) for n, m in enumerate(value)]
        return checkas_messages(value, self.key, where, lambda: self._roles_hint(raw))

    def _roles_hint(self, messages: list[Any]) -> str:
        """For a conversation without an 'assistant' message: the role values it has, and the
        `roles` mapping that would make one of them the assistant (ShareGPT's human/gpt...)."""
        found = list(dict.fromkeys(m[self.role_key] for m in messages if isinstance(m, dict) and self.role_key in m))
        found = [r for r in found if isinstance(r, str)]
        if not found or set(found) <= CHAT_ROLES:  # chat roles already: the conversation lacks an answer
            return ""
        guesses = {r: ROLE_GUESSES.get(r.lower(), dict(self.roles).get(r, "")) for r in found}
        mapping = ", ".join(f'{_toml_key(r)} = "{g}"' for r, g in guesses.items() if g)
        where = (
            "in this [[data.sources]] entry" if not self.where else "in a [[data.sources]] entry for it (docs/data.md)"
        )
        roles = ", ".join(repr(r) for r in found)
        if "assistant" not in guesses.values():
            return f" (its roles: {roles}; map the role of the answers to 'assistant' with roles = {{ ... }} {where})"
        return f" (its roles: {roles}; map them with roles = {{ {mapping} }} {where})"

    def _get(self, record: dict, key: str, field: str, where: str) -> Any:
        if key not in record:
            has = ", ".join(sorted(map(str, record))[:8]) or "none"
            raise MissingKey(f"{where}: no {key!r} key ({field}; the record has: {has})")
        value = record[key]
        if value is None:
            raise DataError(f"{where}: {key!r} is null")
        return value

    def _message(self, m: Any, n: int, where: str, key: str = "") -> Any:
        """One message (of the list under `key`, default the record key) in the {role, content}
        form (left as it is when it is not an object: check_messages names it)."""
        if not isinstance(m, dict):
            return m
        here = f"{where}: {key or self.key}[{n}]"
        for key, name in ((self.role_key, "role_key"), (self.content_key, "content_key")):
            if key not in m:
                has = ", ".join(sorted(map(str, m))[:8]) or "none"
                raise MissingKey(f"{here}: no {key!r} key ({self.where}{name}; the message has: {has})")
        role = m[self.role_key]
        return {
            "role": dict(self.roles).get(role, role) if isinstance(role, str) else role,
            "content": m[self.content_key],
        }

    def _render(self, template: str, record: dict, where: str) -> str:
        values = {}
        for name in template_fields(template):
            if name not in record:
                has = ", ".join(sorted(map(str, record))[:8]) or "none"
                raise MissingKey(
                    f"{where}: no {name!r} key (a template of {self.where or 'the source'}; the record has: {has})"
                )
            v = record[name]
            values[name] = "" if v is None else v
        return template.format_map(values).strip()

    def _templates(self, record: dict, where: str) -> str | list[dict[str, str]]:
        prompt, response = self._render(self.prompt, record, where), self._render(self.response, record, where)
        if self.format == "text":
            return prompt + response
        messages = []
        if self.system and (system := self._render(self.system, record, where)):
            messages.append({"role": "system", "content": system})
        if prompt:
            messages.append({"role": "user", "content": prompt})
        messages.append({"role": "assistant", "content": response})
        return checkas_messages(messages, self.key, where)

    # ---------------------------------------------------------------- preference pairs
    def _pair_part(
        self, record: dict, index: int, where: str, key: str = "", name: str = ""
    ) -> str | list[dict[str, str]]:
        """One field of a pair (pair_keys[index], or `key` named by the job.toml key `name`): a
        non-empty string, or messages in the {role, content} form."""
        key = key or self.pair_keys[index]
        name = name or ("prompt_key", "chosen_key", "rejected_key")[index]
        value = self._get(record, key, f"{self.where}{name}", where)
        if isinstance(value, str):
            return value
        if not isinstance(value, list) or not value:
            raise DataError(f"{where}: {key!r} must be a string or a non-empty list of {{role, content}} messages")
        if (self.role_key, self.content_key) != ("role", "content") or self.roles:
            value = [self._message(m, n, where, key) for n, m in enumerate(value)]
        for n, m in enumerate(value):
            if not isinstance(m, dict) or not all(isinstance(m.get(k), str) for k in ("role", "content")):
                raise DataError(f"{where}: {key}[{n}] is not an object with string 'role' and 'content'")
        return value

    def _pair(self, record: dict, where: str) -> Pair:
        """A preference record as a Pair: strings stay text; with messages anywhere every part
        becomes messages (a string prompt a user message, a string answer an assistant one), and
        the messages an answer begins with that are the prompt's (or, without data.prompt_key,
        that both answers begin with) are the prompt."""
        chosen, rejected = self._pair_part(record, 1, where), self._pair_part(record, 2, where)
        prompt = self._pair_part(record, 0, where) if self.pair_keys[0] else None
        if prompt is not None and all(isinstance(v, str) for v in (prompt, chosen, rejected)):
            return Pair(prompt, chosen, rejected)
        if prompt is None and isinstance(chosen, str) and isinstance(rejected, str):
            raise DataError(
                f"{where}: the answers are strings and no prompt is named: set {self.where}prompt_key to the "
                "field holding the prompt"
            )

        c, r = as_messages(chosen, "assistant"), as_messages(rejected, "assistant")
        if prompt is None:
            n = 0
            while n < min(len(c), len(r)) - 1 and c[n] == r[n]:
                n += 1
            p = c[:n]
        else:
            p = as_messages(prompt, "user")
        c, r = after_prompt(p, c), after_prompt(p, r)
        if not p:
            raise DataError(f"{where}: the pair has no prompt (the answers have no leading messages in common)")
        for key, answer in ((self.pair_keys[1], c), (self.pair_keys[2], r)):
            if not any(m["role"] == "assistant" for m in answer):
                raise DataError(f"{where}: {key!r} has no 'assistant' message after the prompt: nothing to train on")
        return Pair(p, c, r)


@dataclass(frozen=True)
class Pair:
    """A preference record: the prompt and the preferred (chosen) and dispreferred (rejected)
    answers; all strings (text, joined) or all messages (rendered with the chat template)."""

    prompt: str | list[dict[str, str]]
    chosen: str | list[dict[str, str]]
    rejected: str | list[dict[str, str]]

    @property
    def chat(self) -> bool:
        return not isinstance(self.prompt, str)

    def __len__(self) -> int:
        """Characters of text (what a batch of records to encode is measured in)."""
        return sum(record_chars(v) for v in (self.prompt, self.chosen, self.rejected))


# How a record of each data.format is read (a format of its own module: one import, one entry).
READERS: dict[str, Callable[[FieldMap, dict, str], Any]] = {
    "text": FieldMap._document,
    "chat": FieldMap._document,
    "preference": FieldMap._pair,
    "unpaired": unpaired.read,
}


CHAT_ROLES = {"system", "user", "assistant", "tool"}
# Role values of common conversation formats (ShareGPT, OpenAssistant, Gemini...) and the chat
# roles they stand for: what the refusal of a conversation without an 'assistant' suggests.
ROLE_GUESSES = {
    **dict.fromkeys(("human", "user", "prompter", "question", "usr", "instruction"), "user"),
    **dict.fromkeys(("gpt", "assistant", "bot", "model", "chatgpt", "ai", "answer", "gpt4", "response"), "assistant"),
    "system": "system",
}


def _toml_key(name: str) -> str:
    return name if name and all(c.isalnum() or c in "_-" for c in name) and name.isascii() else json.dumps(name)


def checkas_messages(value: Any, key: str, where: str, hint: Callable[[], str] = str) -> list[dict[str, str]]:
    """`value` as {role, content} messages with an 'assistant' one; DataError naming `where`
    otherwise (`hint`: what to add to the missing-assistant refusal)."""
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: {key!r} must be a non-empty list of {{role, content}} messages")
    for n, m in enumerate(value):
        if not isinstance(m, dict) or not all(isinstance(m.get(k), str) for k in ("role", "content")):
            has = (
                f" (it has: {', '.join(sorted(map(str, m))[:8])}; role_key and content_key of a [[data.sources]] entry "
                "name others)"
                if isinstance(m, dict) and not {"role", "content"} & set(m)
                else ""
            )
            raise DataError(f"{where}: {key}[{n}] is not an object with string 'role' and 'content'{has}")
    if not any(m["role"] == "assistant" for m in value):
        raise DataError(f"{where}: {key!r} has no 'assistant' message: nothing to train on{hint()}")
    return value
