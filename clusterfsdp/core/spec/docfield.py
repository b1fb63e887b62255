"""`F`, the schema's field specifier: a dataclass field with its docstring (and its TOML key
when that is not a Python name). Every section module makes its fields with it; `clusterfsdp
schema`, `init`'s starter file and the TUI's compose form read the docstrings back
(`docs.py`). Apart from `schema` so that the section modules and `schema` import it without
a cycle; ruff's RUF009 accepts `F` in dataclass defaults by its qualified name
(pyproject.toml, flake8-bugbear's extend-immutable-calls)."""

import copy
import dataclasses
from dataclasses import field
from typing import Any


def F(default: Any, doc: str, *, key: str | None = None) -> Any:
    """A schema field with its docstring (and TOML key when it is not a valid Python name)."""
    meta = {"doc": doc, "key": key}
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return field(default_factory=lambda d=default: copy.deepcopy(d), metadata=meta)
    return field(default=default, metadata=meta)
