"""router/core/_generated_inits.py: the `__init__` every `@quick_init` class runs. That the file is
what `python -m tools.generate` writes now is checked in tests/tools/test_generate.py."""

from __future__ import annotations

import importlib

import pytest

from router.core import _generated_inits
from router.core.records import init_shape, stale_classes


def test_generated_inits_are_installed_on_their_classes():
    assert len(_generated_inits.INITS) >= 15  # engine, plan, events: the check sees what it checks
    for key, (shape, _) in _generated_inits.INITS.items():
        module, _, name = key.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        assert init_shape(cls) == shape, key
        assert cls.__init__.__code__.co_filename == _generated_inits.__file__, key
    assert [key for key in stale_classes() if not key.startswith("tests.")] == []


def test_a_generated_init_sets_what_the_dataclass_sets_and_validates():
    from router.core.engine import DecisionReason, RouteDecision, RouteStatus

    decision = RouteDecision(key="k", status=RouteStatus.REFUSED_UNAVAILABLE, reason=DecisionReason.POLICY)
    assert (decision.key, decision.target, decision.connector) == ("k", None, None)
    with pytest.raises(TypeError):
        RouteDecision(key="k", status=RouteStatus.OK)  # type: ignore[call-arg]
