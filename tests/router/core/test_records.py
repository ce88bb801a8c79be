"""router/core/records.py: quick_init builds what the dataclass's own __init__ builds."""

from __future__ import annotations

import dataclasses
from typing import TypeVar

import pytest

from router.core import _generated_inits
from router.core.records import class_key, init_shape, init_source, quick_init, stale_classes

_T = TypeVar("_T")


def generated(cls: type[_T]) -> type[_T]:
    """`quick_init` with the `__init__` maker `python -m tools.generate` would write for `cls` (a
    class of this file: the command writes only the source packages' makers)."""
    namespace = {**vars(_generated_inits), "MISSING": dataclasses.MISSING}
    exec(init_source("make", cls), namespace)
    return quick_init(cls, inits={class_key(cls): (init_shape(cls), namespace["make"])})


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Plain:
    a: int
    b: str = "b"
    c: tuple[int, ...] = dataclasses.field(default_factory=lambda: (1, 2))

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError(f"a must be >= 0, got {self.a!r}")


@generated
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Quick:
    a: int
    b: str = "b"
    c: tuple[int, ...] = dataclasses.field(default_factory=lambda: (1, 2))

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError(f"a must be >= 0, got {self.a!r}")


@pytest.mark.parametrize(
    "kwargs", [{"a": 1}, {"a": 2, "b": "x"}, {"a": 3, "c": (4,)}, {"a": 0, "b": "", "c": ()}]
)
def test_quick_init_sets_what_the_dataclass_sets(kwargs: dict[str, object]) -> None:
    plain, quick = Plain(**kwargs), Quick(**kwargs)  # type: ignore[arg-type]
    assert (quick.a, quick.b, quick.c) == (plain.a, plain.b, plain.c)
    assert repr(quick) == repr(plain).replace("Plain", "Quick")
    assert quick == Quick(**kwargs)  # type: ignore[arg-type]
    assert hash(quick) == hash(Quick(**kwargs))  # type: ignore[arg-type]


def test_quick_init_keeps_validation_frozenness_and_keyword_only() -> None:
    with pytest.raises(ValueError, match="a must be >= 0, got -1"):
        Quick(a=-1)
    quick = Quick(a=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        quick.a = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        Quick(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Quick()  # type: ignore[call-arg]
    assert Quick.__init__.__qualname__ == "Quick.__init__"
    assert "set_a" in Quick.__init__.__code__.co_freevars  # the generated one: a setter per slot
    assert "set_a" not in Plain.__init__.__code__.co_freevars


def test_quick_init_without_a_generated_init_keeps_the_dataclass_s_and_says_so() -> None:
    """Scenario: a field was added and `python -m tools.generate` not run again."""

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Changed:
        a: int
        b: int = 0

    dataclass_init = Changed.__init__
    stale_maker = (("a",), _generated_inits.INITS["router.core.events.Accepted"][1])
    assert quick_init(Changed, inits={class_key(Changed): stale_maker}) is Changed
    assert Changed.__init__ is dataclass_init
    assert Changed(a=1) == Changed(a=1, b=0)
    assert stale_classes()[-1] == class_key(Changed)
    assert quick_init(Changed, inits={}) is Changed
    assert Changed.__init__ is dataclass_init


def test_init_shape_names_what_a_generated_init_depends_on() -> None:
    assert init_shape(Plain) == ("a", "b=", "c=()", "__post_init__")


def test_quick_init_refuses_what_it_does_not_reproduce() -> None:
    @dataclasses.dataclass(slots=True, kw_only=True)
    class Mutable:
        a: int

    with pytest.raises(TypeError, match="wants a frozen dataclass, got Mutable"):
        quick_init(Mutable)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Positional:
        a: int

    with pytest.raises(TypeError, match=r"Positional\.a must be keyword-only"):
        quick_init(Positional)


def test_quick_init_wants_slots() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Unslotted:
        a: int

    with pytest.raises(TypeError, match=r"wants a slotted dataclass \(slots=True\), got Unslotted"):
        quick_init(Unslotted)


def test_quick_init_sets_slots_declared_by_a_base_class() -> None:
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Base:
        a: int

    @generated
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Derived(Base):
        b: str

    derived = Derived(a=1, b="x")
    assert "set_a" in Derived.__init__.__code__.co_freevars
    assert (derived.a, derived.b) == (1, "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        derived.b = "y"  # type: ignore[misc]
