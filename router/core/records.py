"""`quick_init`: a cheaper `__init__` for the frozen dataclasses made for every connection.

The records of a connection (its reference, its events, its opening, its plan's action, the
routing decision) are frozen, slotted, keyword-only dataclasses (STYLE R5). CPython 3.11's
generated `__init__` of a frozen dataclass sets each field through `object.__setattr__`, which
looks the field's slot up on the class anew every time; with half a dozen such records per
connection that was a measurable part of the fast path's cost. `quick_init` replaces the generated
`__init__` by one with the same signature that sets each slot through its own descriptor, bound
once (a 7-field record: 1.15 µs to build with the generated `__init__`, 0.79 µs with this; the
rest is the call itself). Everything else (frozen, slots, equality, repr, hash, `__post_init__`
validation) is the dataclass's own.

Those `__init__`s are written ahead of time, not made at import: `python -m tools.generate` writes
one per decorated class into `router/core/_generated_inits.py` (STYLE R13), and `quick_init`
installs its class's. A class whose generated `__init__` is missing, or was made for other fields
(a field added and the command not run again), keeps the dataclass's own `__init__`: the same
behaviour at the old speed. `stale_classes` names such classes, and
tests/router/core/test__generated_inits.py fails until the command has been run.

Pure: no I/O. Only slotted dataclasses with keyword-only fields with plain defaults or default
factories are supported; anything else is a TypeError at import, never a silent difference.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from router.core._generated_inits import INITS

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = ["InitFactory", "Setter", "class_key", "init_shape", "init_source", "quick_init", "stale_classes"]

_T = TypeVar("_T")

Setter: TypeAlias = "Callable[[object, object], None]"
"""A slot's `__set__`: (instance, value)."""
Factory: TypeAlias = "Callable[[], object]"
InitFactory: TypeAlias = (
    "Callable[[tuple[Setter, ...], tuple[object, ...], tuple[Factory, ...]], Callable[..., None]]"
)
"""A generated `__init__`'s maker: given the class's slot setters (one per field, in order), its
plain defaults and its default factories (in field order), the `__init__`."""

_stale: list[str] = []


def class_key(cls: type) -> str:
    """The name a class's generated `__init__` is filed under: its module and qualified name."""
    return f"{cls.__module__}.{cls.__qualname__}"


def init_shape(cls: type) -> tuple[str, ...]:
    """What a generated `__init__` of `cls` depends on: each field's name, with `=` when it has a
    default and `=()` when it has a default factory, then `__post_init__` when the class validates
    itself. Empty for a class without fields.

    Raises:
        TypeError: `cls` is not a dataclass `quick_init` supports (module docstring).
    """
    params = getattr(cls, "__dataclass_params__", None)
    if not dataclasses.is_dataclass(cls) or params is None or not params.frozen:
        raise TypeError(f"quick_init wants a frozen dataclass, got {cls.__name__}")
    if "__slots__" not in cls.__dict__:
        raise TypeError(f"quick_init wants a slotted dataclass (slots=True), got {cls.__name__}")
    shape = []
    for field in dataclasses.fields(cls):
        if not field.init or not field.kw_only:
            raise TypeError(
                f"quick_init: field {cls.__name__}.{field.name} must be keyword-only and in __init__"
            )
        if field.default is not dataclasses.MISSING:
            shape.append(f"{field.name}=")
        elif field.default_factory is not dataclasses.MISSING:
            shape.append(f"{field.name}=()")
        else:
            shape.append(field.name)
    if shape and hasattr(cls, "__post_init__"):
        shape.append("__post_init__")
    return tuple(shape)


def quick_init(
    cls: type[_T], *, inits: Mapping[str, tuple[tuple[str, ...], InitFactory]] = INITS
) -> type[_T]:
    """Give a frozen, slotted, keyword-only dataclass its generated `__init__`, which sets its
    fields more cheaply (module docstring).

    Args:
        cls: the dataclass.
        inits: class key (`class_key`) -> (the `init_shape` it was generated for, its maker);
            the generated ones.

    Raises:
        TypeError: `cls` is not such a dataclass, or has a field this does not reproduce
            (`init=False`, `InitVar`), or a field that is not a slot.
    """
    shape = init_shape(cls)
    if not shape:
        return cls  # nothing to set
    generated = inits.get(class_key(cls))
    if generated is None or generated[0] != shape:
        _stale.append(class_key(cls))
        return cls
    assert dataclasses.is_dataclass(cls)  # init_shape checked it
    fields = dataclasses.fields(cls)
    setters = tuple(_slot_setter(cls, field.name) for field in fields)
    defaults = tuple(f.default for f in fields if f.default is not dataclasses.MISSING)
    factories = tuple(f.default_factory for f in fields if f.default_factory is not dataclasses.MISSING)
    init = generated[1](setters, defaults, factories)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[method-assign]  # replacing it is the point of this helper
    return cls


def init_source(name: str, cls: type) -> str:
    """The source of the function `name` that makes `cls`'s `__init__` (an `InitFactory`), as
    `python -m tools.generate` writes it into `_generated_inits.py`: the `__init__` has the
    dataclass's keyword-only signature, sets each slot with its own setter (calling the default
    factory of a field not given), then calls `__post_init__`.

    Raises:
        TypeError: `cls` is not a dataclass `quick_init` supports.
    """
    init_shape(cls)
    assert dataclasses.is_dataclass(cls)  # init_shape checked it
    fields = dataclasses.fields(cls)
    defaults = [f.name for f in fields if f.default is not dataclasses.MISSING]
    factories = [f.name for f in fields if f.default_factory is not dataclasses.MISSING]
    validated = hasattr(cls, "__post_init__")
    lines = [f"def {name}(setters: Setters, defaults: Values, factories: Factories) -> Init:"]
    lines.append(f"    {_names([f'set_{f.name}' for f in fields])} = setters")
    if defaults:
        lines.append(f"    {_names([f'default_{n}' for n in defaults])} = defaults")
    if factories:
        lines.append(f"    {_names([f'factory_{n}' for n in factories])} = factories")
    params = []
    body = []
    for field in fields:
        if field.name in defaults:
            params.append(f"{field.name}: object = default_{field.name}")
        elif field.name in factories:
            params.append(f"{field.name}: object = MISSING")
            body += [f"    if {field.name} is MISSING:", f"        {field.name} = factory_{field.name}()"]
        else:
            params.append(f"{field.name}: object")
        body.append(f"    set_{field.name}(self, {field.name})")
    if validated:
        body.append("    self.__post_init__()")
    self_type = "_Validated" if validated else "object"
    lines.append(f"    def __init__(self: {self_type}, *, {', '.join(params)}) -> None:")
    lines += [f"    {line}" for line in body]
    lines.append("    return __init__")
    return "\n".join(lines) + "\n"


def _names(names: Sequence[str]) -> str:
    """The target of a tuple unpacking: `a, b` (`(a,)` for one name)."""
    return f"({names[0]},)" if len(names) == 1 else ", ".join(names)


def stale_classes() -> tuple[str, ...]:
    """The classes given to `quick_init` so far that kept the dataclass's `__init__` because no
    generated one fits them (`class_key`s): `python -m tools.generate` is due."""
    return tuple(_stale)


def _slot_setter(cls: type, name: str) -> Setter:
    """The `__set__` of the slot `name` of `cls` (or of the base class that declares it): it
    writes the slot directly, past the frozen class's `__setattr__`."""
    for klass in cls.__mro__:
        slot = klass.__dict__.get(name)
        if slot is not None and type(slot).__name__ == "member_descriptor":
            setter: Setter = slot.__set__
            return setter
    raise TypeError(f"quick_init: {cls.__name__}.{name} is not a slot")
