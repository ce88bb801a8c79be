"""The admin listener over real HTTP: lookup API, status, run-time filters, /metrics."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

import pytest
import trio

from cache import CacheConfig
from policies import PolicyConfig
from pools import AdminState, Connector, PoolConfig, PoolKind, TargetState
from router.config import ConfigError
from router.config.settings import AcceptorConfig, Config, EventLogConfig, RouterConfig
from router.core.admin_access import ADMIN_MAX_CONNECTIONS, ADMIN_MAX_PER_SOURCE
from router.ctl import main_routerctl
from router.features.cache.service import cache_entries
from router.server import ServerInfo, serve_router

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


def _request(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def _call(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes]:
    return await trio.to_thread.run_sync(_request, url, method, body)


def _config() -> Config:
    # Node ids broker1..3; CONSISTENT_HASH points 774970719 < 791748338 < 808525957 (Java-checked).
    connectors = tuple(
        Connector.from_url(f"c{i}", f"tcp://127.0.0.1:{21000 + i}?nodeId=broker{i}") for i in (1, 2, 3)
    )
    router = RouterConfig(
        name="hash",
        local_target_filter="admin",
        cache=CacheConfig(timeout_ms=0),
        policy=PolicyConfig(name="CONSISTENT_HASH"),
        pool=PoolConfig(kind=PoolKind.STATIC, static_connectors=("c1", "c2", "c3"), quorum_timeout_ms=0),
    )
    bare = RouterConfig(name="bare")
    acceptor = AcceptorConfig(name="a", host="127.0.0.1", port=0, router="hash")
    return Config(source="t.xml", connectors=connectors, acceptors=(acceptor,), routers=(router, bare))


@pytest.fixture
async def base(nursery: trio.Nursery) -> AsyncIterator[tuple[ServerInfo, str]]:
    """The server of `_config()` with its admin listener, and the listener's base URL."""
    shutdown = trio.Event()
    info: ServerInfo = await nursery.start(
        lambda task_status: serve_router(
            _config(), admin=("127.0.0.1", 0), shutdown=shutdown, task_status=task_status
        )
    )
    assert info.admin is not None
    yield info, f"http://{info.admin[0]}:{info.admin[1]}"
    shutdown.set()


class TestAdmin:
    @pytest.fixture
    async def server(self, base: tuple[ServerInfo, str]) -> tuple[ServerInfo, str]:
        info, _ = base
        runtime = info.runtimes["hash"]
        # Nothing listens on the connectors' ports: wait for the first probes to fail, then mark
        # the targets ready by hand (the next probes are a check period, 5 s, away).
        nodes = ("broker1", "broker2", "broker3")
        await runtime.pool.wait_until(
            lambda: all(runtime.pool.target_state(n) is TargetState.NOT_READY for n in nodes)
        )
        for node in nodes:
            runtime.pool.record_check(node, True)
        return base

    async def test_admin_target_returns_engine_decision(self, server: tuple[ServerInfo, str]) -> None:
        _, base = server
        # artemis_hash("client-42") = 696160687 < every point: wraps to the smallest, broker1.
        status, body = await _call(f"{base}/api/v1/routers/hash/target?key=client-42")
        assert status == 200
        assert json.loads(body) == {
            "key": "client-42",
            "status": "OK",
            "node_id": "broker1",
            "local": False,
            "connector": "tcp://127.0.0.1:21001",
        }

    async def test_admin_target_local_filter_without_connector(self, server: tuple[ServerInfo, str]) -> None:
        _, base = server
        status, body = await _call(f"{base}/api/v1/routers/hash/target?key=admin")
        assert status == 200
        assert json.loads(body) == {
            "key": "admin",
            "status": "OK",
            "node_id": "local",
            "local": True,
            "connector": None,
        }

    async def test_admin_target_without_pool_is_refused_use_another(
        self, server: tuple[ServerInfo, str]
    ) -> None:
        _, base = server
        status, body = await _call(f"{base}/api/v1/routers/bare/target?key=x")
        assert status == 200
        assert json.loads(body)["status"] == "REFUSED_USE_ANOTHER"

    async def test_admin_target_dry_run_changes_nothing(self, server: tuple[ServerInfo, str]) -> None:
        info, base = server
        status, body = await _call(f"{base}/api/v1/routers/hash/target?key=client-42&dry-run=true")
        assert (status, json.loads(body)["node_id"]) == (200, "broker1")
        assert cache_entries(info.runtimes["hash"]) == {}
        status, body = await _call(f"{base}/api/v1/routers/hash/target?key=k&dry-run=yes")
        assert (status, json.loads(body)) == (400, {"error": "dry-run must be true or false, got 'yes'"})

    async def test_admin_target_updates_cache(self, server: tuple[ServerInfo, str]) -> None:
        info, base = server
        await _call(f"{base}/api/v1/routers/hash/target?key=client-42")
        assert cache_entries(info.runtimes["hash"]) == {"client-42": "broker1"}

    @pytest.mark.parametrize(
        ("path", "status", "error"),
        [
            ("/api/v1/routers/nope/target?key=x", 404, "no connection router named 'nope'"),
            ("/api/v1/routers/hash/target", 400, "query parameter 'key' is required"),
            ("/elsewhere", 404, "no such resource '/elsewhere'"),
        ],
    )
    async def test_admin_errors_are_json(
        self, server: tuple[ServerInfo, str], path: str, status: int, error: str
    ) -> None:
        _, base = server
        got_status, body = await _call(base + path)
        assert (got_status, json.loads(body)) == (status, {"error": error})

    @pytest.mark.parametrize(
        ("method", "path", "body", "status", "error"),
        [
            ("GET", "/cache?key=absent", None, 404, "no cache entry for key 'absent'"),
            ("GET", "/cache?limit=0", None, 400, "limit must be an integer 1-10000, got '0'"),
            ("GET", "/cache?limit=x", None, 400, "limit must be an integer 1-10000, got 'x'"),
            ("GET", "/cache?key=a&key=b", None, 400, "query parameter 'key' given 2 times"),
            ("DELETE", "/cache", None, 400, "DELETE needs exactly one of ?key=K, ?node_id=N, ?all=true"),
            (
                "DELETE",
                "/cache?key=a&all=true",
                None,
                400,
                "DELETE needs exactly one of ?key=K, ?node_id=N, ?all=true",
            ),
            (
                "DELETE",
                "/cache?all=yes",
                None,
                400,
                "DELETE needs exactly one of ?key=K, ?node_id=N, ?all=true",
            ),
            (
                "DELETE",
                "/cache?node_id=",
                None,
                400,
                "DELETE needs exactly one of ?key=K, ?node_id=N, ?all=true",
            ),
            (
                "PUT",
                "/cache",
                b'{"key": "k"}',
                400,
                """body must be {"key": K, "node_id": N, "duration_s": seconds or null}, got {'key': 'k'}""",
            ),
            (
                "PUT",
                "/cache",
                b'{"key": "k", "node_id": "broker1", "duration_s": -1}',
                400,
                "a pin's duration must be > 0 seconds, got -1.0",
            ),
            (
                "POST",
                "/cache",
                None,
                405,
                "POST /api/v1/routers/hash/cache is not supported (only GET, PUT, DELETE)",
            ),
        ],
    )
    async def test_admin_cache_errors(
        self,
        server: tuple[ServerInfo, str],
        method: str,
        path: str,
        body: bytes | None,
        status: int,
        error: str,
    ) -> None:
        _, base = server
        got_status, answer = await _call(f"{base}/api/v1/routers/hash{path}", method, body)
        assert (got_status, json.loads(answer)) == (status, {"error": error})

    async def test_admin_cache_of_a_router_without_one_is_404(self, server: tuple[ServerInfo, str]) -> None:
        _, base = server
        got_status, answer = await _call(f"{base}/api/v1/routers/bare/cache")
        assert (got_status, json.loads(answer)) == (404, {"error": "connection router 'bare' has no <cache>"})

    async def test_admin_cache_pin_overrides_the_policy_until_evicted(
        self, server: tuple[ServerInfo, str]
    ) -> None:
        _, base = server
        await _call(f"{base}/api/v1/routers/hash/target?key=client-42")  # broker1 by the hash
        pin = b'{"key": "client-42", "node_id": "broker3"}'
        got_status, answer = await _call(f"{base}/api/v1/routers/hash/cache", "PUT", pin)
        assert got_status == 200
        assert json.loads(answer) == {
            "key": "client-42",
            "node_id": "broker3",
            "idle_s": 0.0,
            "expires_in_s": None,
            "pinned": True,
        }
        _, looked_up = await _call(f"{base}/api/v1/routers/hash/target?key=client-42")
        assert json.loads(looked_up)["node_id"] == "broker3"
        _, evicted = await _call(f"{base}/api/v1/routers/hash/cache?key=client-42", "DELETE")
        assert json.loads(evicted) == {"evicted": 1}
        _, looked_up = await _call(f"{base}/api/v1/routers/hash/target?key=client-42")
        assert json.loads(looked_up)["node_id"] == "broker1"

    async def test_admin_target_admin_state_is_set_and_kept(
        self, server: tuple[ServerInfo, str], tmp_path
    ) -> None:
        info, base = server
        got_status, answer = await _call(
            f"{base}/api/v1/routers/hash/targets/broker1", "PUT", b'{"admin_state": "drain"}'
        )
        assert got_status == 200
        assert json.loads(answer)["admin_state"] == "drain"
        _, looked_up = await _call(f"{base}/api/v1/routers/hash/target?key=client-42")  # broker1 by the hash
        assert json.loads(looked_up)["node_id"] != "broker1"
        _, one = await _call(f"{base}/api/v1/routers/hash/targets/broker1")
        assert (json.loads(one)["state"], json.loads(one)["admin_state"]) == ("ready", "drain")
        assert info.runtimes["hash"].pool.admin_states() == {"broker1": AdminState.DRAIN}

    async def test_admin_target_shows_why_not_ready_its_last_probe_and_last_change(
        self, base: tuple[ServerInfo, str]
    ) -> None:
        """Scenario: nothing listens on broker1's port: its document says why it is down, when it
        was probed, for how long, and since when it is down."""
        info, url = base
        runtime = info.runtimes["hash"]
        await runtime.pool.wait_until(lambda: runtime.pool.target_state("broker1") is TargetState.NOT_READY)
        _, body = await _call(f"{url}/api/v1/routers/hash/targets/broker1")
        target = json.loads(body)
        reason = "connect to tcp://127.0.0.1:21001 failed: Connection refused"
        assert (target["state"], target["operational_state"], target["not_ready_reason"]) == (
            "not-ready",
            "down",
            reason,
        )
        check = target["last_check"]
        assert (check["ok"], check["reason"]) == (False, reason)
        assert 0 <= check["duration_s"] < 3
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", check["at"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", target["last_change"])
        runtime.pool.record_check("broker1", True, duration_s=0.25)
        _, body = await _call(f"{url}/api/v1/routers/hash/targets/broker1")
        target = json.loads(body)
        assert (
            target["operational_state"],
            target["not_ready_reason"],
            target["last_check"]["duration_s"],
        ) == (
            "up",
            None,
            0.25,
        )
        assert target["last_change"] >= check["at"]  # RFC 3339 UTC strings sort as times

    @pytest.mark.parametrize(
        ("method", "path", "body", "status", "error"),
        [
            ("GET", "/targets/nobody", None, 404, "no target with node id 'nobody' in the pool of 'hash'"),
            (
                "PUT",
                "/targets/nobody",
                b'{"admin_state": "drain"}',
                404,
                "no target with node id 'nobody' in the pool of 'hash' "
                "(has ['broker1', 'broker2', 'broker3'])",
            ),
            (
                "PUT",
                "/targets/broker1",
                b'{"admin_state": "off"}',
                400,
                'body must be {"admin_state": one of '
                "['ready', 'drain', 'maint']}, got {'admin_state': 'off'}",
            ),
            (
                "DELETE",
                "/targets/broker1",
                None,
                405,
                "DELETE /api/v1/routers/hash/targets/broker1 is not supported (only GET, PUT)",
            ),
        ],
    )
    async def test_admin_target_errors(
        self,
        server: tuple[ServerInfo, str],
        method: str,
        path: str,
        body: bytes | None,
        status: int,
        error: str,
    ) -> None:
        _, base = server
        got_status, answer = await _call(f"{base}/api/v1/routers/hash{path}", method, body)
        assert (got_status, json.loads(answer)) == (status, {"error": error})

    async def test_admin_status_lists_pool(self, server: tuple[ServerInfo, str]) -> None:
        _, base = server
        status, body = await _call(f"{base}/api/v1/routers/hash")
        doc = json.loads(body)
        assert status == 200
        assert doc["pool"]["active"] is True
        assert [t["node_id"] for t in doc["pool"]["targets"]] == ["broker1", "broker2", "broker3"]
        assert {t["state"] for t in doc["pool"]["targets"]} == {"ready"}

    async def test_admin_put_filters_changes_routing(self, server: tuple[ServerInfo, str]) -> None:
        """Scenario: SPEC A7, the local-target filter is changed at run time, then disabled."""
        _, base = server
        body = json.dumps({"local_target_filter": "client-.*"}).encode()
        status, _ = await _call(f"{base}/api/v1/routers/hash/filters", "PUT", body)
        assert status == 200
        _, got = await _call(f"{base}/api/v1/routers/hash/target?key=client-42")
        assert json.loads(got)["local"] is True
        await _call(f"{base}/api/v1/routers/hash/filters", "PUT", b'{"local_target_filter": ""}')
        _, got = await _call(f"{base}/api/v1/routers/hash/target?key=client-42")
        assert json.loads(got)["node_id"] == "broker1"

    async def test_admin_put_filters_rejects_bad_regex(self, server: tuple[ServerInfo, str]) -> None:
        _, base = server
        status, body = await _call(f"{base}/api/v1/routers/hash/filters", "PUT", b'{"key_filter": "("}')
        assert status == 400
        assert "key-filter '(' is not a valid regular expression" in json.loads(body)["error"]

    async def test_admin_metrics_exposes_router_metrics(self, server: tuple[ServerInfo, str]) -> None:
        _, base = server
        await _call(f"{base}/api/v1/routers/hash/target?key=client-42")
        status, body = await _call(f"{base}/metrics")
        text = body.decode()
        assert status == 200
        assert 'router_lookups_total{router="hash",status="OK"} 1.0' in text
        # Lookups are not connections: the decisions counter stays at the 0 it starts with.
        assert 'router_routing_decisions_total{router="hash",status="OK"} 0.0' in text
        assert 'router_target_ready{node_id="broker2",router="hash"} 1.0' in text
        assert 'router_pool_active{router="hash"} 1.0' in text

    async def test_admin_healthz(self, server: tuple[ServerInfo, str]) -> None:
        _, base = server
        assert await _call(f"{base}/healthz") == (200, b"ok\n")

    async def test_admin_readyz_once_the_pool_has_its_quorum(self, server: tuple[ServerInfo, str]) -> None:
        """Scenario: the targets were marked ready (the fixture); router `bare` has no pool, which
        needs no quorum."""
        _, base = server
        assert await _call(f"{base}/readyz") == (200, b"ready\n")
        assert await _call(f"{base}/readyz", "HEAD") == (200, b"")


async def test_admin_readyz_names_the_router_below_its_quorum(base: tuple[ServerInfo, str]) -> None:
    info, url = base
    runtime = info.runtimes["hash"]
    nodes = ("broker1", "broker2", "broker3")  # nothing listens on their ports
    await runtime.pool.wait_until(
        lambda: all(runtime.pool.target_state(n) is TargetState.NOT_READY for n in nodes)
    )
    assert await _call(url + "/readyz") == (
        503,
        b"not ready: router 'hash': pool below its quorum, 0 of 3 target(s) ready, quorum-size 1\n",
    )
    runtime.pool.record_check("broker2", True)
    assert await _call(url + "/readyz") == (200, b"ready\n")
    runtime.pool.set_admin_state("broker2", AdminState.MAINT)  # a target in maintenance counts for nothing
    assert await _call(url + "/readyz") == (
        503,
        b"not ready: router 'hash': pool below its quorum, 0 of 3 target(s) ready, quorum-size 1\n",
    )


class TestAdminRobustness:
    """The admin API answers oddities and never takes routerd down (a HEAD once did)."""

    async def test_admin_head_has_headers_and_no_body(self, base: tuple[ServerInfo, str]) -> None:
        _, url = base
        for path in ("/healthz", "/metrics", "/api/v1/routers/hash"):
            status, body = await _call(url + path, "HEAD")
            assert (status, body) == (200, b"")
        assert await _call(url + "/healthz") == (200, b"ok\n")  # still serving

    async def test_admin_wrong_method_on_metrics_is_405(self, base: tuple[ServerInfo, str]) -> None:
        _, url = base
        status, body = await _call(url + "/metrics", "POST", b"x")
        assert (status, json.loads(body)) == (405, {"error": "POST /metrics is not supported (only GET)"})
        status, body = await _call(url + "/readyz", "POST", b"x")
        assert (status, json.loads(body)) == (405, {"error": "POST /readyz is not supported (only GET)"})

    async def test_admin_wrong_method_on_the_router_list_is_405(self, base: tuple[ServerInfo, str]) -> None:
        _, url = base
        status, body = await _call(url + "/api/v1/routers", "PUT", b"{}")
        assert (status, json.loads(body)) == (
            405,
            {"error": "PUT /api/v1/routers is not supported (only GET)"},
        )

    async def test_admin_oversized_body_gets_413(self, base: tuple[ServerInfo, str]) -> None:
        _, url = base
        status, body = await _call(url + "/api/v1/routers/hash/filters", "PUT", b"x" * (70 * 1024))
        assert status == 413
        assert json.loads(body) == {"error": "request body over 65536 bytes (Content-Length 71680)"}

    async def test_admin_garbage_request_is_dropped_and_service_continues(
        self, base: tuple[ServerInfo, str]
    ) -> None:
        info, url = base
        assert info.admin is not None
        async with await trio.open_tcp_stream(*info.admin) as stream:
            await stream.send_all(b"\x16\x03\x01 not http at all\r\n\r\n")
            with trio.fail_after(5):
                while await stream.receive_some(1024):
                    pass
        assert await _call(url + "/healthz") == (200, b"ok\n")


async def test_admin_connections_without_a_request_give_their_place_to_new_ones(
    base: tuple[ServerInfo, str],
) -> None:
    """Scenario (hardening review, then the security review of issue #30): admin connections share
    the descriptor reserve, so they are capped, but silent ones must not keep a health check out:
    from one address only ADMIN_MAX_PER_SOURCE stay open, the older ones are closed as new ones
    come, and /healthz answers while they are held."""
    info, url = base
    assert info.admin is not None
    silent = [await trio.open_tcp_stream(*info.admin) for _ in range(ADMIN_MAX_CONNECTIONS)]
    try:
        with trio.fail_after(5):
            for stream in silent[:-ADMIN_MAX_PER_SOURCE]:  # displaced, oldest first
                assert await stream.receive_some(1024) == b""
        assert await _call(url + "/healthz") == (200, b"ok\n")
        _, metrics = await _call(url + "/metrics")
        displaced = re.search(rb"^router_admin_connections_displaced_total (\d+)", metrics, re.MULTILINE)
        assert displaced is not None
        assert int(displaced[1]) >= ADMIN_MAX_CONNECTIONS - ADMIN_MAX_PER_SOURCE
    finally:
        for stream in silent:
            await stream.aclose()


async def test_admin_event_log_is_404_when_off(base: tuple[ServerInfo, str]) -> None:
    _, url = base
    status, body = await _call(f"{url}/api/v1/event-log")
    assert status == 404
    assert "the event log is off" in json.loads(body)["error"]


async def test_admin_event_log_status_and_ring_resize(nursery: trio.Nursery, tmp_path, capsys) -> None:
    config = dataclasses.replace(
        _config(), event_log=EventLogConfig(directory=str(tmp_path), router_id="edge-1", ring_size=100)
    )
    shutdown = trio.Event()
    info: ServerInfo = await nursery.start(
        lambda task_status: serve_router(
            config, admin=("127.0.0.1", 0), shutdown=shutdown, task_status=task_status
        )
    )
    assert info.admin is not None
    url = f"http://{info.admin[0]}:{info.admin[1]}/api/v1/event-log"
    status, body = await _call(url)
    assert status == 200
    shown = json.loads(body)
    assert (shown["router_id"], shown["ring_size"], shown["directory"]) == ("edge-1", 100, str(tmp_path))
    status, body = await _call(url, "PUT", b'{"ring_size": 7}')
    assert status == 200
    assert json.loads(body)["ring_size"] == 7
    for bad in (b'{"ring_size": 0}', b'{"ring_size": true}', b'{"ring": 5}', b"[1]", b"x"):
        status, body = await _call(url, "PUT", bad)
        assert status == 400, bad
    assert json.loads((await _call(url))[1])["ring_size"] == 7
    status, _ = await _call(url, "POST", b"{}")
    assert status == 405
    admin = f"http://{info.admin[0]}:{info.admin[1]}"
    assert (
        await trio.to_thread.run_sync(
            main_routerctl, ["event-log", "--json", "--admin", admin, "--ring-size", "9"]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["ring_size"] == 9  # routerctl event-log
    shutdown.set()


class TestReloadEndpoint:
    """`POST /api/v1/reload` and `routerctl reload` against serve_router's reload."""

    @pytest.fixture
    async def reloading(self, nursery: trio.Nursery) -> AsyncIterator[tuple[list[Config | Exception], str]]:
        """A server whose reload reads the last item of the list (an exception: a bad file)."""
        files: list[Config | Exception] = [_config()]

        def load() -> Config:
            last = files[-1]
            if isinstance(last, Exception):
                raise last
            return last

        shutdown = trio.Event()
        info: ServerInfo = await nursery.start(
            functools.partial(
                serve_router, _config(), admin=("127.0.0.1", 0), shutdown=shutdown, load=load, grace_s=0
            )
        )
        assert info.admin is not None
        yield files, f"http://{info.admin[0]}:{info.admin[1]}"
        shutdown.set()

    async def test_admin_reload_answers_what_changed(
        self, reloading: tuple[list[Config | Exception], str]
    ) -> None:
        files, url = reloading
        status, body = await _call(url + "/api/v1/reload", "POST")
        assert (status, json.loads(body)["summary"]) == (200, "nothing changed")
        config = _config()
        files.append(dataclasses.replace(config, routers=(*config.routers, RouterConfig(name="extra"))))
        status, body = await _call(url + "/api/v1/reload", "POST")
        assert status == 200
        answer = json.loads(body)
        assert answer["changed"] is True
        assert answer["routers"] == {"added": ["extra"], "removed": [], "changed": []}
        assert answer["summary"] == "routers added: extra"
        status, body = await _call(url + "/api/v1/routers")
        assert [r["name"] for r in json.loads(body)] == ["hash", "bare", "extra"]

    async def test_admin_reload_of_a_bad_file_is_400_with_the_reason(
        self, reloading: tuple[list[Config | Exception], str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        files, url = reloading
        files.append(ConfigError("t.xml", 7, "policy", "unknown policy 'NOPE'"))
        status, body = await _call(url + "/api/v1/reload", "POST")
        assert (status, json.loads(body)) == (400, {"error": "t.xml:7: <policy>: unknown policy 'NOPE'"})
        status, body = await _call(url + "/api/v1/routers")
        assert [r["name"] for r in json.loads(body)] == ["hash", "bare"]
        with pytest.raises(SystemExit) as exited:
            await trio.to_thread.run_sync(main_routerctl, ["reload", "--admin", url])
        assert exited.value.code == 1
        assert capsys.readouterr().err == (
            f"routerctl: error: {url}/api/v1/reload: 400 t.xml:7: <policy>: unknown policy 'NOPE'\n"
        )

    async def test_admin_reload_is_post_only(self, reloading: tuple[list[Config | Exception], str]) -> None:
        _, url = reloading
        status, body = await _call(url + "/api/v1/reload")
        assert status == 405
        assert "POST" in json.loads(body)["error"]

    async def test_routerctl_reload_prints_what_changed(
        self, reloading: tuple[list[Config | Exception], str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        files, url = reloading
        config = _config()
        files.append(dataclasses.replace(config, routers=config.routers[:1]))
        assert await trio.to_thread.run_sync(main_routerctl, ["reload", "--admin", url]) == 0
        assert capsys.readouterr().out == "reloaded: routers removed: bare\n"
        assert await trio.to_thread.run_sync(main_routerctl, ["reload", "--admin", url, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["summary"] == "nothing changed"
