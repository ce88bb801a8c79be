"""router/core/ttl.py: which TTL a proxied connection gets."""

from __future__ import annotations

import math

import pytest

from keys import Sniffed, WireProtocol
from router.core.ttl import connection_ttl_s


def _mqtt(keepalive_s: int) -> Sniffed:
    return Sniffed(
        protocol=WireProtocol.MQTT, client_id="c", protocol_version="3.1.1", keepalive_s=keepalive_s
    )


@pytest.mark.parametrize(
    ("ttl_ms", "sniffed", "expected"),
    [
        pytest.param(-1, None, math.inf, id="no-ttl"),
        pytest.param(-1, _mqtt(0), math.inf, id="no-ttl-mqtt"),
        pytest.param(1500, None, 1.5, id="unknown-protocol"),
        pytest.param(1500, _mqtt(1), math.inf, id="mqtt-keepalive-below-ttl"),
        pytest.param(1500, _mqtt(0), 1.5, id="mqtt-keepalive-0"),
        pytest.param(2000, _mqtt(2), 2.0, id="mqtt-keepalive-equal-to-ttl"),
        pytest.param(1500, _mqtt(60), 1.5, id="mqtt-keepalive-above-ttl"),
        pytest.param(1500, Sniffed(protocol=WireProtocol.STOMP, keepalive_s=1), 1.5, id="not-mqtt"),
    ],
)
def test_connection_ttl_s(ttl_ms: int, sniffed: Sniffed | None, expected: float) -> None:
    assert connection_ttl_s(ttl_ms, sniffed) == expected
