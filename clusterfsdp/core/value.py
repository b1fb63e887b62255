"""Value semantics for the control plane's dataclasses, written once instead of per class.

`dataclasses` (Python 3.11) writes the source of `__init__`, `__repr__`, `__eq__` and, for a
frozen class, `__hash__`, `__setattr__` and `__delattr__` anew for every class and compiles each
with its own `exec`: 0.1-0.3 ms per method. Over the forty-odd records and schema sections that
`validate` and `status` import, that was a fifth of their start-up, paid by every call (issue 25
item 3; the last three and `__init__`: issue 35). A class declared `@value` (or
`@value(frozen=True)`) is a dataclass that gets the same behaviours from the functions here
instead: `__init__` is compiled as dataclasses compiles it, but on the class's first instance
(most classes a command imports it never instantiates); a frozen value refuses assignments with
`FrozenInstanceError`; the repr lists the fields with `repr=True`; two values are equal when they
are of the same class and their fields with `compare=True` are equal; a frozen value hashes those
fields, a mutable one is unhashable. The decorator says what the class is; type checkers see a
dataclass through `dataclass_transform`. tests/test_value.py checks the behaviour against the
generated methods, and that every dataclass of core/ and control/ is a value.
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


_FACTORY = object()  # the default of a parameter whose field has a default_factory


class _InitPlan:
    """A value class's own record: the class and its field names (what `_frozen_setattr` refuses)."""

    __slots__ = ("cls", "fields")

    def __init__(self, cls: type) -> None:
        self.cls = cls
        fields = dataclasses.fields(cls)
        self.fields = frozenset(f.name for f in fields)
        defaulted = ""  # (what dataclasses checks when it compiles __init__, checked here at once)
        for f in fields:
            if not f.init:
                continue
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                defaulted = f.name
            elif defaulted:
                raise TypeError(f"non-default argument {f.name!r} follows default argument")


def _compile_init(cls: type) -> Callable[..., None]:
    """The `__init__` dataclasses generates for `cls`: a parameter per init field in order, the
    defaults (a default_factory called per instance), init=False fields set from their default,
    then `__post_init__`. So its TypeErrors are Python's own, in the same words."""
    ns: dict[str, Any] = {"__value_factory__": _FACTORY, "__value_set__": object.__setattr__}
    frozen = cls.__setattr__ is _frozen_setattr  # (assigned past it, as dataclasses does)
    params, body = [], []
    for i, f in enumerate(dataclasses.fields(cls)):
        factory, default = f.default_factory is not dataclasses.MISSING, f.default is not dataclasses.MISSING
        ns[f"__value_f{i}__"], ns[f"__value_d{i}__"] = f.default_factory, f.default
        if f.init:
            params.append(f.name + ("=__value_factory__" if factory else f"=__value_d{i}__" if default else ""))
            given = f"__value_f{i}__() if {f.name} is __value_factory__ else {f.name}" if factory else f.name
        elif factory or default:
            given = f"__value_f{i}__()" if factory else f"__value_d{i}__"
        else:
            continue  # init=False and no default: left unset, as dataclasses leaves it
        frozen_set = f"__value_set__(__value_self__, {f.name!r}, {given})"
        body.append("    " + (frozen_set if frozen else f"__value_self__.{f.name} = {given}"))
    if hasattr(cls, "__post_init__"):
        body.append("    __value_self__.__post_init__()")
    exec(f"def __init__(__value_self__, {', '.join(params)}):\n" + ("\n".join(body) or "    pass"), ns)
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    """A frozen value's fields cannot be assigned (`dataclasses.FrozenInstanceError`, as the
    generated method says it); a subclass that is no value of its own may set other attributes."""
    if "_value_init" in type(self).__dict__ or name in type(self)._value_init.fields:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
    object.__setattr__(self, name, value)


def _frozen_delattr(self: Any, name: str) -> None:
    if "_value_init" in type(self).__dict__ or name in type(self)._value_init.fields:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
    object.__delattr__(self, name)


def _init(self: Any, /, *args: Any, **kwargs: Any) -> None:
    """Every value class's `__init__` until its first instance: it compiles the class's own (the
    exec dataclasses does for every class when it is declared, done only for the classes a
    command instantiates) and runs it from then on."""
    owner = type(self)._value_init.cls
    owner.__init__ = _compile_init(owner)
    owner.__init__(self, *args, **kwargs)


@overload
def value(cls: T, /) -> T: ...
@overload
def value(*, frozen: bool = False) -> Callable[[T], T]: ...
@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def value(cls: T | None = None, /, *, frozen: bool = False) -> T | Callable[[T], T]:
    """`@value` / `@value(frozen=True)`: a dataclass (`frozen` as dataclasses means it) with the
    `__init__`, the repr, the equality and, when frozen, the hash of this module; a mutable one is
    unhashable."""

    def wrap(c: T) -> T:
        # (frozen by the functions here: dataclasses' frozen=True would compile two more methods;
        # the class's __dataclass_params__ say frozen=False, so a @dataclass(frozen=True) cannot
        # subclass a frozen value: test_value checks that none does. Between values, the rule
        # dataclasses keeps for its own frozen flag is kept here.)
        for base in c.__mro__[1:]:
            if "_value_init" in vars(base) and (base.__setattr__ is _frozen_setattr) != frozen:
                kinds = ("frozen", "non-frozen") if frozen else ("non-frozen", "frozen")
                raise TypeError("cannot inherit {} dataclass from a {} one".format(*kinds))
        out = dataclasses.dataclass(c, init=False, repr=False, eq=False)
        out._value_init = _InitPlan(out)  # type: ignore[attr-defined]
        if "__init__" not in vars(c):  # (a class's own __init__ is kept, as dataclasses keeps it)
            out.__init__ = _init  # type: ignore[misc]
        out.__repr__ = _repr  # type: ignore[method-assign]
        out.__eq__ = _eq  # type: ignore[method-assign]
        out.__hash__ = _hash if frozen else None  # type: ignore[method-assign,assignment]
        if frozen:
            out.__setattr__ = _frozen_setattr  # type: ignore[method-assign,assignment]
            out.__delattr__ = _frozen_delattr  # type: ignore[method-assign,assignment]
        return out

    return wrap if cls is None else wrap(cls)
