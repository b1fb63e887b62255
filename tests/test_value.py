"""core/value.py: the control plane's dataclasses get repr, equality and (frozen) hashing from
one decorator (`@value`) instead of per-class generated methods (start-up, issue 25 item 3). The behaviour must be
the one `dataclasses` would have generated, and no dataclass may be left comparing by identity."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from dataclasses import dataclass, field

import pytest
from test_layout import DATA_TORCH_FREE

import clusterfsdp.control
from clusterfsdp.core.value import value


@value
class Ours:
    name: str
    sizes: list[int] = field(default_factory=list)
    hidden: float = field(default=0.0, repr=False, compare=False)


@dataclass
class Generated:
    name: str
    sizes: list[int] = field(default_factory=list)
    hidden: float = field(default=0.0, repr=False, compare=False)


@value(frozen=True)
class OursFrozen:
    key: str
    step: int = 0


@dataclass(frozen=True)
class GeneratedFrozen:
    key: str
    step: int = 0


def test_value_behaves_as_the_generated_methods():
    a, b = Ours("x", [1, 2], hidden=1.0), Ours("x", [1, 2], hidden=2.0)
    assert repr(a) == repr(Generated("x", [1, 2], 1.0)).replace("Generated", "Ours") == "Ours(name='x', sizes=[1, 2])"
    assert a == b and (a != b) is False  # `hidden` is not compared
    assert a != Ours("x", [1]) and a != Generated("x", [1, 2])  # another class is never equal
    assert a.__eq__(Generated("x", [1, 2])) is NotImplemented
    nan = float("nan")  # fields compared as one tuple: the same NaN object is equal to itself
    assert (Ours("x", [], nan) == Ours("x", [], nan)) is (Generated("x", [], nan) == Generated("x", [], nan)) is True
    assert Ours(nan).__eq__(Ours(nan)) is (Generated(nan) == Generated(nan)) is True  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unhashable"):
        hash(a)
    f = OursFrozen("k", 3)
    assert hash(f) == hash(GeneratedFrozen("k", 3)) and f == OursFrozen("k", 3) and {f, OursFrozen("k", 3)} == {f}
    assert repr(f) == "OursFrozen(key='k', step=3)" and f != OursFrozen("k", 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.step = 4  # type: ignore[misc]
    assert dataclasses.replace(f, step=5) == OursFrozen("k", 5)


def _torch_free_modules() -> list[str]:
    control = [m.name for m in pkgutil.walk_packages(clusterfsdp.control.__path__, "clusterfsdp.control.")]
    return control + [f"clusterfsdp.data.{name}" for name in DATA_TORCH_FREE]


def test_no_control_plane_dataclass_compares_by_identity():
    """Every control-plane dataclass is declared `@value` (no generated methods at start-up, and
    none left comparing by identity, as a bare `eq=False` would)."""
    missing = []
    for name in _torch_free_modules():
        module = importlib.import_module(name)
        for obj in vars(module).values():
            ours = isinstance(obj, type) and obj.__module__ == name and dataclasses.is_dataclass(obj)
            if ours and (obj.__eq__ is object.__eq__ or obj.__repr__ is object.__repr__):
                missing.append(f"{name}.{obj.__qualname__}")
    assert not missing, missing
