"""routerd's /metrics against Prometheus's own linter: a real routerd over real mosquitto brokers,
with traffic (proxied MQTT clients, a management lookup, a broker that dies), scraped over HTTP
and piped to `promtool check metrics` (the Debian package `prometheus`), which must find no
problem. The families of issue 13's point 7 are in that scrape (every kind of event is driven
in tests/deploy/grafana/test_connection_router.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from typing import TYPE_CHECKING

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.conftest import eventually, free_port
from tests.router.conftest import ROUND_ROBIN_NODE_IDS, mqtt_round_trip, round_robin_config

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.router.conftest import Mosquitto, Routerd


def promtool_check_metrics(exposition: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is not installed: run ./run-tests, which installs the prometheus package")
    return subprocess.run(
        [binary, "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_promtool_check_metrics_finds_the_problems_it_should() -> None:
    """The linter itself: a counter without _total and a gauge in milliseconds are problems."""
    checked = promtool_check_metrics("# HELP x_count c\n# TYPE x_count counter\nx_count 1\n")
    assert checked.returncode != 0
    assert 'counter metrics should have "_total" suffix' in checked.stderr


@pytest.mark.integration
def test_routerd_metrics_with_traffic_pass_promtool_check_metrics(
    mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd]
) -> None:
    port = free_port()
    router = start_routerd(
        round_robin_config(mosquitto_fleet, port, "<cache><timeout>60000</timeout></cache>")
    )
    router.wait_for_log(r"router=rr pool is active")
    assert eventually(
        lambda: (
            router.metrics().count("router_target_state{") >= 3 * 4
            and all(
                f'router_target_state{{node_id="{n}",router="rr",state="up"}} 1.0' in router.metrics()
                for n in ROUND_ROBIN_NODE_IDS
            )
        )
    )
    for i in range(6):
        assert mqtt_round_trip(port, client_id=f"lint-{i}", topic=f"lint/{i}")
    assert router.get("/api/v1/routers/rr/target?key=lint-0")
    mosquitto_fleet[0].kill()  # probed every 200 ms
    router.wait_for_log(r"router=rr target=b0 is not ready")
    text = router.metrics()
    checked = promtool_check_metrics(text)
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", "")
    for family in (
        "router_target_state",
        "router_target_check_duration_seconds",
        "router_target_last_change_timestamp_seconds",
        "router_target_connect_duration_seconds_bucket",
        "router_client_connections",
        "router_client_connection_budget",
        "process_open_fds",
        "process_max_fds",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
    ):
        assert re.search(rf"^{family}(\{{.*\}})? ", text, re.MULTILINE), family
    assert 'router_target_state{node_id="b0",router="rr",state="down"} 1.0' in text
    assert "# TYPE router_target_connect_failures_total counter" in text
    assert "# TYPE router_routing_refusals_total counter" in text


def _proxied_bytes(text: str, direction: str) -> float:
    """Router rr's bytes one way, every target's together."""
    series = re.escape(f'router_proxied_bytes_total{{direction="{direction}",node_id="') + r'[^"]+",'
    series += re.escape('router="rr"}')
    return sum(float(value) for value in re.findall(rf"^{series} (\S+)$", text, re.MULTILINE))


@pytest.mark.integration
@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "trio-path"])
def test_bytes_of_a_connection_still_open_show_in_the_metrics(
    mosquitto_fleet: list[Mosquitto], start_routerd: Callable[..., Routerd], fast_path: bool
) -> None:
    """Scenario: an MQTT client stays connected after publishing 200 kB to itself through the
    router: the scrape counts those bytes each way while the connection lives, not at its close."""
    port = free_port()
    acceptor = f"router=rr;mode=proxy;fastPath={str(fast_path).lower()}"
    router = start_routerd(round_robin_config(mosquitto_fleet, port, "", acceptor))
    router.wait_for_log(r"router=rr pool is active")
    payload = bytes(200_000)
    got, subscribed = threading.Event(), threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="long-lived")
    client.on_message = lambda *_a: got.set()
    client.on_subscribe = lambda *_a: subscribed.set()
    client.connect("127.0.0.1", port, keepalive=60)
    client.loop_start()
    try:
        client.subscribe("bytes/live", qos=1)
        assert subscribed.wait(15)
        client.publish("bytes/live", payload, qos=1)
        assert got.wait(15)
        assert eventually(
            lambda: (
                min(_proxied_bytes(router.metrics(), d) for d in ("client_to_target", "target_to_client"))
                >= len(payload)
            )
        )
        open_now = re.findall(
            r'^router_proxied_connections\{node_id="b\d",router="rr"\} (\S+)$', router.metrics(), re.M
        )
        assert sum(map(float, open_now)) == 1.0  # still open
    finally:
        client.disconnect()
        client.loop_stop()
