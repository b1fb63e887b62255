"""Value semantics for the control plane's dataclasses, written once instead of per class.

`dataclasses` (Python 3.11) writes the source of `__repr__`, `__eq__` and, for a frozen class,
`__hash__` anew for every class and compiles each with its own `exec`: about a third of a
millisecond per method. Over the forty-odd records and schema sections that `validate` and
`status` import, that was a fifth of their start-up, paid by every call (issue 25 item 3). A class
declared `@dataclass(repr=False, eq=False)` (with `frozen=True` where it is immutable) and based on
`Value` (or `FrozenValue`) gets the same three behaviours from here: the repr lists the fields
with `repr=True`; two values are equal when they are of the same class and their fields with
`compare=True` are equal; a frozen value hashes those fields, a mutable one is unhashable.
tests/test_layout.py checks that no control-plane dataclass is left without value equality.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar


class Value:
    """Base of a mutable dataclass declared with `repr=False, eq=False`."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]  # set by @dataclass on each subclass

    def __repr__(self) -> str:
        shown = (f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr)
        return f"{type(self).__qualname__}({', '.join(shown)})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._compared() == other._compared()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable and compared by value: unhashable

    def _compared(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.compare)


class FrozenValue(Value):
    """Base of a frozen dataclass declared with `frozen=True, repr=False, eq=False`: hashable."""

    __slots__ = ()

    def __hash__(self) -> int:
        return hash(self._compared())
