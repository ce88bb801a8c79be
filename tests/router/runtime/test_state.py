"""RouterState: entering it takes the router's lock, leaving releases it, errors included."""

from __future__ import annotations

import pytest

from tests.router.runtime.test_kernel import make_runtime


def test_entering_the_state_holds_the_routers_lock() -> None:
    runtime = make_runtime()
    state = runtime.held()
    with state as entered:
        assert entered is state
        assert state.lock.locked()
        assert entered.engine.cache is None
    assert not state.lock.locked()


def test_an_error_inside_releases_the_lock() -> None:
    state = make_runtime().held()
    with pytest.raises(KeyError), state:
        raise KeyError("no such target")
    assert not state.lock.locked()
