"""Value semantics for the control plane's dataclasses, written once instead of per class.

`dataclasses` (Python 3.11) writes the source of `__repr__`, `__eq__` and, for a frozen class,
`__hash__` anew for every class and compiles each with its own `exec`: about a third of a
millisecond per method. Over the forty-odd records and schema sections that `validate` and
`status` import, that was a fifth of their start-up, paid by every call (issue 25 item 3). A class
declared `@value` (or `@value(frozen=True)`) is a dataclass that gets the same three behaviours
from the functions here instead: the repr lists the fields with `repr=True`; two values are equal
when they are of the same class and their fields with `compare=True` are equal; a frozen value
hashes those fields, a mutable one is unhashable. The decorator says what the class is; type
checkers see a dataclass through `dataclass_transform`. tests/test_value.py checks the behaviour
against the generated methods and that no control-plane dataclass compares by identity.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

T = TypeVar("T", bound=type)


def _compared(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.compare)


def _repr(self: Any) -> str:
    shown = (f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr)
    return f"{type(self).__qualname__}({', '.join(shown)})"


def _eq(self: Any, other: object) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _compared(self) == _compared(other)


def _hash(self: Any) -> int:
    return hash(_compared(self))


@overload
def value(cls: T, /) -> T: ...
@overload
def value(*, frozen: bool = False) -> Callable[[T], T]: ...
@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def value(cls: T | None = None, /, *, frozen: bool = False) -> T | Callable[[T], T]:
    """`@value` / `@value(frozen=True)`: a dataclass (`frozen` as dataclasses means it) with the
    repr, the equality and, when frozen, the hash of this module; a mutable one is unhashable."""

    def wrap(c: T) -> T:
        out = dataclasses.dataclass(c, repr=False, eq=False, frozen=frozen)
        out.__repr__ = _repr  # type: ignore[method-assign]
        out.__eq__ = _eq  # type: ignore[method-assign]
        out.__hash__ = _hash if frozen else None  # type: ignore[method-assign,assignment]
        return out

    return wrap if cls is None else wrap(cls)
