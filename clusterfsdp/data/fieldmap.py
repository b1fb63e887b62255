"""How a record's fields become a document: the text of a text record, the messages of a chat
record. Pure Python (validate reads the first record of each source with it; prepare reads all).

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

from ..control import spec as specmod
from ..control.spec.templates import template_fields
from ..control.value import FrozenValue
from .sources import DataError


class MissingKey(DataError):
    """A record without a field the mapping names (validate refuses it for an explicit mapping,
    whatever data.bad_records says: every record would be skipped)."""


@dataclass(frozen=True, repr=False, eq=False)
class FieldMap(FrozenValue):
    """The fields one source's records are read through, and the job.toml keys that name them."""

    format: str  # 'text' | 'chat'
    text_key: str
    messages_key: str
    role_key: str = "role"
    content_key: str = "content"
    roles: tuple[tuple[str, str], ...] = ()
    prompt: str = ""
    response: str = ""
    system: str = ""
    where: str = "data."  # the prefix of the job.toml keys that name them ('' for a source's own)

    @staticmethod
    def of(data: specmod.DataSection) -> FieldMap:
        """The mapping of a [data] section; a part's section (cache.part_data) carries its source."""
        if len(data.sources) != 1:
            return FieldMap(data.format, data.text_key, data.messages_key)
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
        )

    @property
    def templated(self) -> bool:
        return bool(self.prompt or self.response)

    @property
    def key(self) -> str:
        """The record field read without templates: the text, or the messages."""
        return self.messages_key if self.format == "chat" else self.text_key

    @property
    def field(self) -> str:
        """The job.toml key naming it."""
        return f"{self.where}{'messages_key' if self.format == 'chat' else 'text_key'}"

    def columns(self) -> list[str]:
        """The record fields (table columns) the mapping reads."""
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
        return out

    # ---------------------------------------------------------------- reading a record
    def apply(self, record: Any, where: str) -> str | list[dict[str, str]]:
        """The text or messages of one decoded record; DataError naming `where` and the key."""
        if not isinstance(record, dict):
            raise DataError(f"{where}: not a JSON object")
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
        return check_messages(value, self.key, where, lambda: self._roles_hint(raw))

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

    def _message(self, m: Any, n: int, where: str) -> Any:
        """One message in the {role, content} form (left as it is when it is not an object:
        check_messages names it)."""
        if not isinstance(m, dict):
            return m
        here = f"{where}: {self.key}[{n}]"
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
        return check_messages(messages, self.key, where)


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


def check_messages(value: Any, key: str, where: str, hint: Callable[[], str] = str) -> list[dict[str, str]]:
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
