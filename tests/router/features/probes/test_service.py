"""The health-check loop: schedule and outcomes on trio's virtual clock; the TCP probe for real."""

from __future__ import annotations

import errno
import itertools
import logging
import os
import subprocess
import types
from typing import TYPE_CHECKING

import pytest
import trio

from policies import PolicyConfig
from pools import Connector, CountSource, PoolConfig, PoolKind, Target, TargetState
from router.config.settings import Config, RouterConfig
from router.features.probes import service as probes_service
from router.features.probes.checks import (
    LocalShortage,
    check_mqtt,
    check_stomp,
    check_target,
    probe_client_id,
)
from router.features.probes.counts import CountError
from router.features.probes.service import PROBE_TIMEOUT_CAP_S, Probes, make_check, serve_health_checks
from router.metrics import Metrics
from router.runtime import RouterRuntime

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def _runtime(check_period_ms: int, *, local_target_enabled: bool = False) -> RouterRuntime:
    connectors = (Connector.from_url("b1", "tcp://127.0.0.1:21001"),)
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name="FIRST_ELEMENT"),
        pool=PoolConfig(
            kind=PoolKind.STATIC,
            static_connectors=("b1",),
            check_period_ms=check_period_ms,
            local_target_enabled=local_target_enabled,
        ),
    )
    config = Config(source="t.xml", connectors=connectors, routers=(router,))
    return RouterRuntime(config, router, Metrics())


async def test_serve_health_checks_probes_at_once_then_every_period(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime = _runtime(check_period_ms=5000)
    start = trio.current_time()
    times: list[float] = []

    async def check(connector: Connector) -> tuple[bool, str]:
        times.append(trio.current_time() - start)
        await trio.sleep(0.25)  # a probe that takes time must not shift the schedule
        return True, ""

    with trio.move_on_after(16):
        await serve_health_checks(runtime, check=check)
    assert times == [0.0, 5.0, 10.0, 15.0]


async def test_serve_health_checks_failure_then_recovery_changes_readiness(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime = _runtime(check_period_ms=1000)
    outcomes = iter([(True, ""), (False, "refused"), (True, "")])
    states: list[TargetState] = []  # the state each probe finds, i.e. the previous probe's outcome

    async def check(connector: Connector) -> tuple[bool, str]:
        states.append(runtime.pool.target_state("b1"))
        return next(outcomes)

    with trio.move_on_after(2.5):  # probes at 0, 1 and 2 s
        await serve_health_checks(runtime, check=check)
    states.append(runtime.pool.target_state("b1"))
    assert states == [TargetState.UNKNOWN, TargetState.READY, TargetState.NOT_READY, TargetState.READY]


async def test_serve_health_checks_times_each_probe_and_a_silent_one_takes_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Scenario: a probe answering after 0.25 s, then probes that never answer (the deadline, the
    check period of 2 s, passes): the status and the metric show each one's duration."""
    runtime = _runtime(check_period_ms=2000)
    seen: list[float | None] = []  # the last probe's duration, as each probe begins
    delays = itertools.chain([0.25], itertools.repeat(60.0))

    async def check(connector: Connector) -> tuple[bool, str]:
        pool = runtime.status().pool
        assert pool is not None
        last = pool.targets[0].last_check
        seen.append(None if last is None else last.duration_s)
        await trio.sleep(next(delays))
        return True, ""

    with trio.move_on_after(4.5):  # probes at 0, 2 (no answer until 4) and 4 s
        await serve_health_checks(runtime, check=check)
    assert seen == [None, 0.25, 2.0]
    pool = runtime.status().pool
    assert pool is not None
    last_check = pool.targets[0].last_check
    assert last_check is not None
    assert (last_check.ok, last_check.duration_s, last_check.reason) == (
        False,
        2.0,
        "no answer from tcp://127.0.0.1:21001 within 2 s",
    )
    assert pool.targets[0].not_ready_reason == "no answer from tcp://127.0.0.1:21001 within 2 s"
    labels = {"router": "r", "node_id": "b1"}
    assert runtime.metrics.registry.get_sample_value("router_target_check_duration_seconds", labels) == 2.0


async def test_a_probe_that_runs_short_locally_changes_nothing(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario (hardening finding 1): at the descriptor limit a probe fails here, not at the
    broker; a ready target stays ready (its connections stay open), and the next probe counts."""
    runtime = _runtime(check_period_ms=1000)
    outcomes: list[tuple[bool, str] | None] = [(True, ""), None, None, (False, "refused")]
    states: list[TargetState] = []

    async def check(connector: Connector) -> tuple[bool, str]:
        states.append(runtime.pool.target_state("b1"))
        outcome = outcomes.pop(0)
        if outcome is None:
            raise LocalShortage("connect to tcp://127.0.0.1:21001 failed here: Too many open files")
        return outcome

    with trio.move_on_after(3.5):  # probes at 0, 1, 2 and 3 s
        await serve_health_checks(runtime, check=check)
    states.append(runtime.pool.target_state("b1"))
    assert states == [
        TargetState.UNKNOWN,
        TargetState.READY,
        TargetState.READY,
        TargetState.READY,
        TargetState.NOT_READY,
    ]
    skipped = [r.getMessage() for r in caplog.records if "probe skipped" in r.getMessage()]
    assert (
        skipped
        == [
            "router=r target=b1 probe skipped, its state stays as it was: connect to tcp://127.0.0.1:21001 "
            "failed here: Too many open files"
        ]
        * 2
    )


async def test_check_target_says_a_local_shortage_is_not_the_brokers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scenario: socket() failing with EMFILE is raised as LocalShortage; a refused connect is the
    broker's answer (not ready)."""

    def no_descriptors(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    connector = Connector.from_url("b1", "tcp://127.0.0.1:1")
    assert (await check_target(connector))[0] is False  # port 1: refused, the broker's answer
    monkeypatch.setattr(trio.socket, "socket", no_descriptors)
    with pytest.raises(LocalShortage, match="failed here: Too many open files"):
        await check_target(connector)


async def test_serve_health_checks_probe_deadline_makes_target_not_ready(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Scenario: a probe that never answers is cut at min(check period, cap) and counts as failed."""
    runtime = _runtime(check_period_ms=10_000)

    async def check(connector: Connector) -> tuple[bool, str]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: serve_health_checks(runtime, check=check))
        await runtime.pool.wait_until(lambda: runtime.pool.target_state("b1") is TargetState.NOT_READY)
        assert trio.current_time() - start == PROBE_TIMEOUT_CAP_S
        nursery.cancel_scope.cancel()


async def test_serve_health_checks_skips_local_target_without_connector(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime = _runtime(check_period_ms=1000, local_target_enabled=True)
    probed: list[str] = []

    async def check(connector: Connector) -> tuple[bool, str]:
        probed.append(connector.name)
        return True, ""

    with trio.move_on_after(0.5):
        await serve_health_checks(runtime, check=check)
    assert probed == ["b1"]
    assert runtime.pool.target_state("local") is TargetState.UNKNOWN


async def test_check_target_open_port_is_ready() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    connector = Connector.from_url("up", f"tcp://127.0.0.1:{port}")
    assert await check_target(connector) == (True, "")
    await listeners[0].aclose()


async def test_check_target_closed_port_names_url_and_reason() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()
    connector = Connector.from_url("down", f"tcp://127.0.0.1:{port}")
    ok, detail = await check_target(connector)
    assert not ok
    assert detail == f"connect to tcp://127.0.0.1:{port} failed: Connection refused"


class TestBrokerProbes:
    """MQTT probes against a real mosquitto that requires a password (the pool's credentials)."""

    @pytest.fixture
    def secured_mosquitto(self, tmp_path: Path) -> Iterator[int]:
        from tests.conftest import free_port, wait_port

        passwords = tmp_path / "passwd"
        subprocess.run(["mosquitto_passwd", "-b", "-c", str(passwords), "prober", "s3cret"], check=True)
        os.chmod(tmp_path, 0o755)
        os.chmod(passwords, 0o644)
        port = free_port()
        conf = tmp_path / "mosquitto.conf"
        conf.write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous false\npassword_file {passwords}\n"
            "persistence false\nuser root\n"
        )
        proc = subprocess.Popen(
            ["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_port(port)
            yield port
        finally:
            proc.terminate()
            proc.wait(10)

    async def test_check_mqtt_accepts_right_credentials(self, secured_mosquitto: int) -> None:
        connector = Connector.from_url("m", f"tcp://127.0.0.1:{secured_mosquitto}?probe=mqtt")
        assert await check_mqtt(connector, probe_client_id("r", "m"), "prober", "s3cret") == (True, "")

    @pytest.mark.parametrize(("user", "password"), [("prober", "wrong"), (None, None)])
    async def test_check_mqtt_rejected_credentials_are_not_ready(
        self, secured_mosquitto: int, user: str | None, password: str | None
    ) -> None:
        connector = Connector.from_url("m", f"tcp://127.0.0.1:{secured_mosquitto}?probe=mqtt")
        ok, detail = await check_mqtt(connector, probe_client_id("r", "m"), user, password)
        assert not ok
        assert detail == f"mqtt CONNACK return code 5 from tcp://127.0.0.1:{secured_mosquitto}"

    async def test_make_check_uses_pool_credentials_and_probe_kind(self, secured_mosquitto: int) -> None:
        connectors = (Connector.from_url("m", f"tcp://127.0.0.1:{secured_mosquitto}?probe=mqtt"),)
        router = RouterConfig(
            name="r",
            policy=PolicyConfig(name="FIRST_ELEMENT"),
            pool=PoolConfig(
                kind=PoolKind.STATIC, static_connectors=("m",), username="prober", password="s3cret"
            ),
        )
        runtime = RouterRuntime(
            Config(source="t", connectors=connectors, routers=(router,)), router, Metrics()
        )
        assert await make_check(runtime)(connectors[0]) == (True, "")


def test_probe_client_id_has_the_internal_prefix() -> None:
    assert probe_client_id("r", "node4") == "$.artemis.internal.router.client.r.node4"


async def _serve_stomp_answer(
    answer: bytes, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """A STOMP server that reads one CONNECT and answers `answer` (CONNECTED or ERROR)."""

    async def handler(stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\x00" not in data and (chunk := await stream.receive_some(1024)):
                data += chunk
            await stream.send_all(answer)

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handler, listeners)


async def test_check_stomp_connected_is_ready_error_is_not(nursery: trio.Nursery) -> None:
    ok_port = await nursery.start(_serve_stomp_answer, b"CONNECTED\nversion:1.2\n\n\x00")
    bad_port = await nursery.start(
        _serve_stomp_answer, b"ERROR\nmessage:User name [x] or password is invalid.\n\n\x00"
    )
    ok = Connector.from_url("s", f"tcp://127.0.0.1:{ok_port}?probe=stomp")
    bad = Connector.from_url("s", f"tcp://127.0.0.1:{bad_port}?probe=stomp")
    assert await check_stomp(ok, "u", "p") == (True, "")
    assert await check_stomp(bad, "x", "y") == (
        False,
        f"stomp ERROR from tcp://127.0.0.1:{bad_port}: User name [x] or password is invalid.",
    )


# -- targets that join and leave the pool at run time (discovery) --


def _discovery_runtime(check_period_ms: int) -> RouterRuntime:
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name="FIRST_ELEMENT"),
        pool=PoolConfig(kind=PoolKind.DISCOVERY, discovery_group="zk", check_period_ms=check_period_ms),
    )
    return RouterRuntime(Config(source="t.xml", routers=(router,)), router, Metrics())


def _discovered(node_id: str, port: int = 21001) -> Target:
    return Target(node_id=node_id, connector=Connector(name=node_id, host="127.0.0.1", port=port))


class TestServeHealthChecksMembership:
    async def test_added_target_is_probed_at_once_then_every_period(
        self, autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
    ) -> None:
        runtime = _discovery_runtime(check_period_ms=1000)
        probes: list[tuple[str, float]] = []

        async def check(connector: Connector) -> tuple[bool, str]:
            probes.append((connector.name, trio.current_time()))
            return True, ""

        await nursery.start(
            lambda task_status: serve_health_checks(runtime, check=check, task_status=task_status)
        )
        await trio.sleep(0.5)
        runtime.pool.add_target(_discovered("b1"))
        await runtime.pool.wait_until(lambda: runtime.pool.ready_count() == 1)
        await trio.sleep(2.1)
        assert probes == [("b1", 0.5), ("b1", 1.5), ("b1", 2.5)]

    async def test_removed_target_is_no_longer_probed(
        self, autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
    ) -> None:
        runtime = _discovery_runtime(check_period_ms=1000)
        probes: list[str] = []

        async def check(connector: Connector) -> tuple[bool, str]:
            probes.append(connector.name)
            return True, ""

        runtime.pool.add_target(_discovered("b1"))
        runtime.pool.add_target(_discovered("b2"))
        await nursery.start(
            lambda task_status: serve_health_checks(runtime, check=check, task_status=task_status)
        )
        await trio.sleep(0.5)
        runtime.pool.remove_target("b1")
        await trio.sleep(2)
        assert sorted(probes) == ["b1", "b2", "b2", "b2"]  # b1 once, at 0 s; b2 at 0, 1 and 2 s

    @pytest.mark.parametrize("outcome", ["answer", "timeout"])
    async def test_target_removed_while_its_probe_runs_records_nothing(
        self, autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, outcome: str
    ) -> None:
        """Scenario: the target leaves the pool in the same instant its probe answers (or times
        out): the result is dropped, nothing raises, the pool no longer knows the target."""
        runtime = _discovery_runtime(check_period_ms=10_000)
        runtime.pool.add_target(_discovered("b1"))
        finish = PROBE_TIMEOUT_CAP_S if outcome == "timeout" else 1.0

        async def check(connector: Connector) -> tuple[bool, str]:
            await trio.sleep(finish if outcome == "answer" else PROBE_TIMEOUT_CAP_S + 1)
            return True, ""

        async def remove_at(when: float) -> None:
            await trio.sleep_until(when)
            runtime.pool.remove_target("b1")

        nursery.start_soon(remove_at, trio.current_time() + finish)  # scheduled before the probe
        await nursery.start(
            lambda task_status: serve_health_checks(runtime, check=check, task_status=task_status)
        )
        await trio.sleep(finish + 1)
        assert runtime.pool.targets() == ()
        assert runtime.pool.ready_count() == 0

    async def test_target_replaced_under_its_node_id_is_probed_at_once(
        self, autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
    ) -> None:
        runtime = _discovery_runtime(check_period_ms=1000)
        probes: list[tuple[int, float]] = []

        async def check(connector: Connector) -> tuple[bool, str]:
            probes.append((connector.port, trio.current_time()))
            return True, ""

        runtime.pool.add_target(_discovered("b1", 21001))
        await nursery.start(
            lambda task_status: serve_health_checks(runtime, check=check, task_status=task_status)
        )
        await trio.sleep(0.5)
        runtime.pool.remove_target("b1")
        runtime.pool.add_target(_discovered("b1", 21002))
        await trio.sleep(1.1)
        assert probes == [(21001, 0.0), (21002, 0.5), (21002, 1.5)]


async def test_probes_serve_router_probes_the_router_at_once() -> None:
    """Scenario: the feature's service for one router probes its target at once (for real: a TCP
    connect to a port nothing listens on, so it is not ready), not a check period later."""
    from tests.conftest import free_port

    connectors = (Connector.from_url("b1", f"tcp://127.0.0.1:{free_port()}"),)
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name="FIRST_ELEMENT"),
        pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=("b1",), check_period_ms=60_000),
    )
    runtime = RouterRuntime(
        Config(source="t.xml", connectors=connectors, routers=(router,)), router, Metrics()
    )
    assert runtime.pool.target_state("b1") is TargetState.UNKNOWN
    async with trio.open_nursery() as nursery:
        await nursery.start(Probes().serve_router, runtime)
        with trio.fail_after(5):
            await runtime.pool.wait_until(lambda: runtime.pool.target_state("b1") is not TargetState.UNKNOWN)
        nursery.cancel_scope.cancel()
    assert runtime.pool.target_state("b1") is TargetState.NOT_READY


# --- broker-reported connection counts read beside the probes (connectionCount=) ----------------


def _count_runtime(urls: dict[str, str], *, check_period_ms: int = 1000) -> RouterRuntime:
    """A LEAST_CONNECTIONS router over brokers whose connectors read their counts (`urls`: node id
    -> connector URL); pool user admin/secret."""
    connectors = tuple(Connector.from_url(name, url) for name, url in urls.items())
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name="LEAST_CONNECTIONS"),
        pool=PoolConfig(
            kind=PoolKind.STATIC,
            static_connectors=tuple(urls),
            check_period_ms=check_period_ms,
            username="admin",
            password="secret",
        ),
    )
    runtime = RouterRuntime(
        Config(source="t.xml", connectors=connectors, routers=(router,)), router, Metrics()
    )
    Probes().router_added(runtime)  # the status shows the counts (status.py)
    return runtime


async def _ready(connector: Connector) -> tuple[bool, str]:
    return True, ""


def _broker_count(runtime: RouterRuntime, node_id: str) -> dict[str, object]:
    document = runtime.status().to_json()
    pool = document["pool"]
    assert isinstance(pool, dict)
    (target,) = (t for t in pool["targets"] if t["node_id"] == node_id)
    broker_count = target["broker_count"]
    assert isinstance(broker_count, dict)
    return {**broker_count, "connections": target["connections"], "state": target["state"]}


class TestServeHealthChecksCounts:
    async def test_counts_are_read_at_once_then_every_period_with_the_pool_credentials(
        self, autojump_clock: trio.testing.MockClock
    ) -> None:
        runtime = _count_runtime({"a": "tcp://127.0.0.1:21001?connectionCount=artemis-jolokia"})
        start = trio.current_time()
        reads: list[tuple[float, str | None, str | None, str | None]] = []

        async def read(source: CountSource, user: str | None, password: str | None) -> int:
            reads.append((trio.current_time() - start, source.url, user, password))
            await trio.sleep(0.25)  # a read that takes time must not shift the schedule
            return len(reads)

        with trio.move_on_after(2.5):
            await serve_health_checks(runtime, check=_ready, read=read)
        url = "http://127.0.0.1:8161/console/jolokia"
        assert reads == [
            (0.0, url, "admin", "secret"),
            (1.0, url, "admin", "secret"),
            (2.0, url, "admin", "secret"),
        ]
        report = _broker_count(runtime, "a")
        assert (report["source"], report["count"], report["connections"]) == ("artemis-jolokia", 3, 3)
        assert report["last_error"] is None
        assert isinstance(report["age_s"], float)

    async def test_prometheus_reads_without_credentials_unless_given(
        self, autojump_clock: trio.testing.MockClock
    ) -> None:
        runtime = _count_runtime(
            {
                "r1": "tcp://127.0.0.1:21001?connectionCount=rabbitmq-prometheus",
                "r2": "tcp://127.0.0.1:21002?connectionCount=rabbitmq-prometheus;connectionCountUser=m;"
                "connectionCountPassword=p",
            }
        )
        seen: dict[str, tuple[str | None, str | None]] = {}

        async def read(source: CountSource, user: str | None, password: str | None) -> int:
            seen[source.user or "none"] = (user, password)
            return 0

        with trio.move_on_after(0.5):
            await serve_health_checks(runtime, check=_ready, read=read)
        assert set(seen.values()) == {(None, None), ("m", "p")}

    async def test_a_failed_read_forgets_the_count_never_the_readiness(
        self,
        autojump_clock: trio.testing.MockClock,
        caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """Scenario: reads give 5, fail twice (an error, then no answer within the deadline), give
        7: the count falls back to the router's own meanwhile, the target stays ready, the status
        keeps the last good read's time and the last error, and the log says it once each way."""
        caplog.set_level(logging.INFO, "router.health")
        # The reads' times (the wall clock) follow the virtual one: the test takes under 1 ms.
        wall = types.SimpleNamespace(time=lambda: 1_800_000_000 + trio.current_time())
        monkeypatch.setattr(probes_service, "time", wall)
        runtime = _count_runtime(
            {"a": "tcp://127.0.0.1:21001?connectionCount=activemq-jolokia"}, check_period_ms=2000
        )
        outcomes = iter([5, CountError("HTTP status 401"), None, 7])
        snapshots: list[dict[str, object]] = []

        async def read(source: CountSource, user: str | None, password: str | None) -> int:
            if trio.current_time() > 0:
                snapshots.append(_broker_count(runtime, "a"))
            outcome = next(outcomes)
            if isinstance(outcome, CountError):
                raise outcome
            if outcome is None:
                await trio.sleep_forever()  # the deadline (2 s) ends it
            assert isinstance(outcome, int)
            return outcome

        with trio.move_on_after(7):  # reads at 0, 2, 4, 6 s
            await serve_health_checks(runtime, check=_ready, read=read)
        snapshots.append(_broker_count(runtime, "a"))
        counts = [(s["count"], s["connections"], s["state"]) for s in snapshots]
        assert counts == [(5, 5, "ready"), (None, 0, "ready"), (None, 0, "ready"), (7, 7, "ready")]
        assert snapshots[1]["last_error"] == "HTTP status 401"
        assert snapshots[2]["last_error"] == "no answer from http://127.0.0.1:8161/api/jolokia within 2 s"
        assert snapshots[3]["read_at"] is not None
        assert snapshots[3]["read_at"] != snapshots[2]["read_at"]  # read again at 6 s
        assert snapshots[3]["last_error"] == snapshots[2]["last_error"]  # kept after the success
        warnings = [m for m in caplog.messages if "broker connection count" in m]
        assert warnings == [
            "router=r target=a broker connection count (activemq-jolokia) not read, LEAST_CONNECTIONS "
            "counts this router's own connections until it is: HTTP status 401",
            "router=r target=a broker connection count (activemq-jolokia) read again: 7",
        ]

    async def test_a_not_ready_target_still_has_its_count_read(
        self, autojump_clock: trio.testing.MockClock
    ) -> None:
        runtime = _count_runtime({"a": "tcp://127.0.0.1:21001?connectionCount=rabbitmq-prometheus"})

        async def down(connector: Connector) -> tuple[bool, str]:
            return False, "refused"

        async def read(source: CountSource, user: str | None, password: str | None) -> int:
            return 4

        with trio.move_on_after(0.5):
            await serve_health_checks(runtime, check=down, read=read)
        report = _broker_count(runtime, "a")
        assert (report["state"], report["count"]) == ("not-ready", 4)

    async def test_ha_pair_records_the_active_members_count_only(
        self, autojump_clock: trio.testing.MockClock
    ) -> None:
        """Scenario: the primary is ready (active), the backup passive: the backup's Jolokia answers
        too, but its count (of a broker nobody uses) is never the target's."""
        runtime = _count_runtime(
            {"p": "(tcp://127.0.0.1:21001,tcp://127.0.0.2:21001)?connectionCount=artemis-jolokia"}
        )

        async def check(connector: Connector) -> tuple[bool, str]:
            return (True, "") if connector.host == "127.0.0.1" else (False, "passive")

        async def read(source: CountSource, user: str | None, password: str | None) -> int:
            await trio.sleep(
                0.1 if source.url and "127.0.0.2" in source.url else 0.2
            )  # the backup answers first
            return 10 if source.url and "127.0.0.1" in source.url else 99

        with trio.move_on_after(2.5):
            await serve_health_checks(runtime, check=check, read=read)
        assert _broker_count(runtime, "p")["count"] == 10

    async def test_mqtt_sys_count_missing_is_an_error_in_the_status(self) -> None:
        """Scenario: mosquitto's `$SYS` value does not come (the MQTT probe reports None)."""
        runtime = _count_runtime({"m": "tcp://127.0.0.1:21001?probe=mqtt;probeConnectionCount=true"})
        with runtime.held() as state:
            state.connections.report_broker_count("m", 3)
        from router.features.probes.service import _report_broker_count

        _report_broker_count(runtime, "m", "mqtt-sys", None)
        report = _broker_count(runtime, "m")
        assert report["count"] is None
        assert str(report["last_error"]).startswith("no $SYS/broker/clients/connected value")


async def test_a_connector_without_connection_count_forgets_a_count_read_before(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Scenario: a reload took `connectionCount=` off a connector: the count its broker reported
    before leaves LEAST_CONNECTIONS's sum once the target's probes start again."""
    runtime = _count_runtime({"a": "tcp://127.0.0.1:21001"})
    with runtime.held() as state:
        state.connections.report_broker_count("a", 40)
        state.history.counted("a", 40, 1_700_000_000.0)
    with trio.move_on_after(0.5):
        await serve_health_checks(runtime, check=_ready)
    pool = runtime.status().pool
    assert pool is not None
    assert [t.connections for t in pool.targets] == [0]
    with runtime.held() as state:
        assert state.history.count_report("a").count is None
