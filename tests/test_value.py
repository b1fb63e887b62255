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
import clusterfsdp.core
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


@value
class Checked:
    name: str
    seen: list[str] = field(default_factory=list)
    derived: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self.derived = self.name.upper()


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((), {}, "missing 1 required positional argument: 'key'"),
        (("k", 1, 2), {}, "takes from 2 to 3 positional arguments but 4 were given"),
        (("k",), {"key": "j"}, "got multiple values for argument 'key'"),
        (("k",), {"stop": 1}, "got an unexpected keyword argument 'stop'"),
    ],
)
def test_value_init_refuses_what_the_generated_init_refuses(args, kwargs, error):
    """`@value`'s one __init__ (no exec per class): the generated one's TypeErrors, in its words."""
    for cls in (OursFrozen, GeneratedFrozen):
        with pytest.raises(TypeError, match=error.replace("(", r"\(")):
            cls(*args, **kwargs)


def test_value_init_fills_fields_defaults_and_post_init():
    assert OursFrozen("k") == OursFrozen(key="k", step=0) == OursFrozen("k", step=0)
    assert (OursFrozen("k", 2).key, OursFrozen("k", 2).step) == ("k", 2)
    a, b = Checked("x"), Checked("x")
    a.seen.append("once")  # a default_factory is called for each instance
    assert b.seen == [] and a.derived == "X" and Checked(name="y", seen=["s"]).seen == ["s"]
    assert dataclasses.replace(a, name="z").derived == "Z"  # replace goes through __init__ too
    with pytest.raises(TypeError, match="cannot inherit non-frozen dataclass from a frozen one"):
        value(type("Thawed", (OursFrozen,), {}))  # as dataclasses refuses it for its own frozen flag
    with pytest.raises(TypeError, match="cannot inherit frozen dataclass from a non-frozen one"):
        value(frozen=True)(type("Frozen", (Ours,), {}))
    with pytest.raises(TypeError, match="non-default argument 'late' follows default argument"):
        value(type("Late", (), {"__annotations__": {"early": "int", "late": "int"}, "early": 0}))


def _torch_free_modules() -> list[str]:
    control = [m.name for m in pkgutil.walk_packages(clusterfsdp.control.__path__, "clusterfsdp.control.")]
    core = [m.name for m in pkgutil.walk_packages(clusterfsdp.core.__path__, "clusterfsdp.core.")]
    return control + core + [f"clusterfsdp.data.{name}" for name in DATA_TORCH_FREE]


def _dataclasses() -> list[type]:
    found = []
    for name in _torch_free_modules():
        module = importlib.import_module(name)
        found += [o for o in vars(module).values() if isinstance(o, type) and o.__module__ == name]
    return [c for c in found if dataclasses.is_dataclass(c) and isinstance(c, type)]


def test_a_frozen_value_is_subclassed_only_by_values():
    """A frozen value is frozen by value.py, not by dataclasses (whose parameters then say
    frozen=False): a `@dataclass(frozen=True)` subclass would be refused at import, and a plain
    `@dataclass` one would be mutable. So what subclasses a value is a value."""
    mixed = [
        f"{c.__module__}.{c.__qualname__}"
        for c in _dataclasses()
        if "_value_init" not in vars(c) and any("_value_init" in vars(b) for b in c.__mro__[1:])
    ]
    assert not mixed, mixed


def test_no_control_plane_dataclass_compares_by_identity():
    """No control-plane dataclass compares by identity (as a bare `eq=False` would), and those of
    core/ and control/ are declared `@value` (no methods compiled at start-up)."""
    by_identity = [f"{c.__module__}.{c.__qualname__}" for c in _dataclasses()
                   if c.__eq__ is object.__eq__ or c.__repr__ is object.__repr__]  # fmt: skip
    assert not by_identity, by_identity
    # core/ and control/ (what every command imports) declare values; data/'s records per row
    # (Pair, a unit) keep dataclasses' compiled __init__ without a first-call step
    generated = [f"{c.__module__}.{c.__qualname__}" for c in _dataclasses()
                 if c.__module__.split(".")[1] in ("core", "control") and "_value_init" not in vars(c)]  # fmt: skip
    assert not generated, generated
