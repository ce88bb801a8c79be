"""A target's limits from its connector's URL parameters (pools/limits.py); the rules that apply
them are tested in tests/pools/test_gates.py."""

from __future__ import annotations

import math
import re

import pytest

from pools import Connector
from pools.limits import TargetLimits, limits_from_params


class TestTargetLimits:
    def test_defaults_limit_nothing(self) -> None:
        assert not TargetLimits().limited

    def test_connect_burst_is_a_tenth_of_a_second_at_least_one(self) -> None:
        assert TargetLimits(connect_rate=500).connect_burst == 50
        assert TargetLimits(connect_rate=3).connect_burst == 1

    @pytest.mark.parametrize(
        ("fields", "match"),
        [
            ({"max_connections": 0}, "maxConnections must be at least 1, got 0"),
            ({"max_queue": -1, "max_connections": 1}, "maxQueue must be 0 or more, got -1"),
            ({"max_queue": 10}, "maxQueue needs maxConnections or connectRate"),
            ({"queue_timeout_s": -1.0}, "queueTimeout must be 0 or more"),
            ({"connect_rate": 0.0}, "connectRate must be a positive number, got 0.0"),
            ({"connect_rate": math.inf}, "connectRate must be a positive number"),
            ({"slow_start_s": -5.0}, "slowStart must be 0 or more"),
        ],
    )
    def test_rejects_bad_values_naming_the_option(self, fields: dict[str, float], match: str) -> None:
        with pytest.raises(ValueError, match=match):
            TargetLimits(**fields)  # type: ignore[arg-type]


class TestLimitsFromParams:
    def test_nothing_given_is_no_limits(self) -> None:
        assert limits_from_params({"nodeId": "a"}) == TargetLimits()

    def test_values_and_defaults(self) -> None:
        assert limits_from_params({"maxConnections": "100"}) == TargetLimits(
            max_connections=100, max_queue=100
        )
        assert limits_from_params({"connectRate": "50"}) == TargetLimits(connect_rate=50.0, max_queue=500)
        assert limits_from_params(
            {
                "maxConnections": "10",
                "maxQueue": "0",
                "queueTimeout": "250",
                "connectRate": "2.5",
                "slowStart": "30000",
            }
        ) == TargetLimits(
            max_connections=10, max_queue=0, queue_timeout_s=0.25, connect_rate=2.5, slow_start_s=30.0
        )
        assert limits_from_params({"slowStart": "1000"}) == TargetLimits(slow_start_s=1.0)

    @pytest.mark.parametrize(
        ("params", "message"),
        [
            ({"maxConnections": "0"}, "maxConnections must be an integer 1 or more, got '0'"),
            ({"maxConnections": "-5"}, "maxConnections must be an integer 1 or more, got '-5'"),
            ({"maxConnections": "ten"}, "maxConnections must be an integer 1 or more, got 'ten'"),
            ({"maxConnections": "1", "maxQueue": "-1"}, "maxQueue must be an integer 0 or more, got '-1'"),
            (
                {"maxQueue": "10"},
                "maxQueue needs maxConnections or connectRate: nothing would make clients wait",
            ),
            (
                {"queueTimeout": "10"},
                "queueTimeout needs maxConnections or connectRate: nothing would make clients wait",
            ),
            ({"connectRate": "0"}, "connectRate must be a positive number (per second), got '0'"),
            ({"connectRate": "nan"}, "connectRate must be a positive number (per second), got 'nan'"),
            ({"connectRate": "inf"}, "connectRate must be a positive number (per second), got 'inf'"),
            (
                {"connectRate": "1", "queueTimeout": "1.5"},
                "queueTimeout must be an integer 0 or more, got '1.5'",
            ),
            ({"slowStart": "-1"}, "slowStart must be an integer 0 or more, got '-1'"),
        ],
    )
    def test_bad_values_name_the_parameter_and_the_value(self, params: dict[str, str], message: str) -> None:
        with pytest.raises(ValueError, match=re.escape(message)):
            limits_from_params(params)


def test_connector_reads_its_limits_and_refuses_bad_ones() -> None:
    connector = Connector.from_url("b1", "tcp://127.0.0.1:1883?maxConnections=5;connectRate=20")
    assert connector.limits == TargetLimits(max_connections=5, max_queue=5, connect_rate=20.0)
    assert Connector.from_url("b2", "tcp://127.0.0.1:1883").limits == TargetLimits()
    with pytest.raises(
        ValueError, match="connector 'b3': maxConnections must be an integer 1 or more, got 'x'"
    ):
        Connector.from_url("b3", "tcp://127.0.0.1:1883?maxConnections=x")
