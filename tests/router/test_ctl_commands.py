"""router/ctl_commands.py: routerctl's own commands: `route` on the Artemis manual's example and the
demo fleet, and `status`, `target`, `wait`, `reload` against a server running in process."""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING

import pytest
import trio

from policies import PolicyConfig
from pools import Connector, PoolConfig, PoolKind, TargetState
from router.config.settings import AcceptorConfig, Config, RouterConfig
from router.core.admin_access import AdminAccess, Level, Token
from router.ctl import main_routerctl
from router.server import ServerInfo, serve_router
from tests.conftest import free_port as pick_port
from tests.router.test_cli import DEMO, OK, SEED_EXAMPLE, UNAVAILABLE, USE_ANOTHER, _decision, _route

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence
    from pathlib import Path


class TestRouteSeedExample:
    """The four routers of the Artemis manual's example (seed 000 §6), SPEC A1 step by step."""

    @pytest.mark.parametrize(
        ("facts", "expected"),
        [
            # key-filter ^.{3} keeps the first three characters; local-target-filter ^FOO.* matches FOO.
            (["--client-id", "FOOBAR"], _decision("FOO", OK, "local", local=True)),
            # BAR misses the local filter, and the router has no pool and no policy: step 5.
            (["--client-id", "BARFOO"], _decision("BAR", USE_ANOTHER)),
            # Two characters: the filter finds nothing, so the key is NULL (step 2).
            (["--client-id", "FO"], _decision("NULL", USE_ANOTHER)),
            # No client id at all: NULL (step 1).
            (["--source-ip", "127.0.0.2"], _decision("NULL", USE_ANOTHER)),
            # Step 0: router-to-router probes go to the local target whatever the filters say.
            (
                ["--client-id", "$.artemis.internal.router.client.x"],
                _decision("$.a", OK, "local", local=True),
            ),
        ],
    )
    def test_route_local_partition(
        self, capsys: pytest.CaptureFixture[str], facts: list[str], expected: dict[str, object]
    ) -> None:
        assert _route(capsys, "--router", "local-partition", *facts) == [expected]

    def test_route_local_partition_keys_start_at_transform(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Scenario: management-lookup keys skip the key filter (SPEC A7 starts at step 3)."""
        assert _route(capsys, "--router", "local-partition", "FOOBAR", "BARFOO") == [
            _decision("FOOBAR", OK, "local", local=True),
            _decision("BARFOO", USE_ANOTHER),
        ]

    @pytest.mark.parametrize(
        ("ready", "expected_node"),
        [("all", "connector1"), ("connector2,connector3", "connector2"), ("connector3", "connector3")],
    )
    def test_route_simple_router_first_element(
        self, capsys: pytest.CaptureFixture[str], ready: str, expected_node: str
    ) -> None:
        port = {"connector1": 61617, "connector2": 61618, "connector3": 61619}[expected_node]
        got = _route(capsys, "--router", "simple-router", "--ready", ready, "--source-ip", "127.0.0.9")
        assert got == [_decision("127.0.0.9", OK, expected_node, connector=f"tcp://127.0.0.1:{port}")]

    def test_route_takes_a_value_of_two_dashes(self, capsys: pytest.CaptureFixture[str]) -> None:
        """`--user=--` is the user "--" (Python 3.11's argparse would give [])."""
        got = _route(capsys, "--router", "consistent-hash-router", "--ready", "none", "--user=--")
        assert [d["key"] for d in got] == ["--"]

    def test_route_simple_router_nothing_ready(self, capsys: pytest.CaptureFixture[str]) -> None:
        got = _route(capsys, "--router", "simple-router", "--ready", "none", "any")
        assert got == [_decision("any", UNAVAILABLE)]

    def test_route_consistent_hash_router(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Scenario: USER_NAME key; 'admin' hits the local filter; the discovery pool holds only the
        local target (local-target-enabled), which has no connector, so like routerd the dry run
        never counts it ready unless named; named, CONSISTENT_HASH picks it for everyone else."""
        assert _route(capsys, "--router", "consistent-hash-router", "--user", "admin") == [
            _decision("admin", OK, "local", local=True)
        ]
        assert _route(capsys, "--router", "consistent-hash-router", "--user", "bob") == [
            _decision("bob", UNAVAILABLE)
        ]
        assert _route(capsys, "--router", "consistent-hash-router", "--ready", "local", "--user", "bob") == [
            _decision("bob", OK, "local", local=True)
        ]
        assert _route(capsys, "--router", "consistent-hash-router", "--ready", "none", "bob") == [
            _decision("bob", UNAVAILABLE)
        ]
        assert _route(capsys, "--router", "consistent-hash-router", "--user", "admin", "--ready", "none") == [
            _decision("admin", OK, "local", local=True)  # the local filter needs no ready target
        ]

    def test_route_evenly_balance_empty_discovery_pool(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert _route(capsys, "--router", "evenly-balance", "--client-id", "ABCDEF") == [
            _decision("ABC", UNAVAILABLE)
        ]


def test_route_consistent_hash_over_demo_fleet(capsys: pytest.CaptureFixture[str]) -> None:
    """Scenario: the demo's node ids split 127.0.0.2-.9 over the three brokers (Java-checked hashes)."""
    assert (
        main_routerctl(
            [
                "route",
                "--json",
                "--config",
                str(DEMO),
                "--router",
                "demo",
                *(f"127.0.0.{i}" for i in range(2, 10)),
            ]
        )
        == 0
    )
    nodes = [json.loads(line)["node_id"] for line in capsys.readouterr().out.splitlines()]
    assert nodes == ["node9", "node20", "node4", "node4", "node9", "node9", "node20", "node20"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--router", "nope", "k"], "no connection router 'nope' in"),
        (["--router", "simple-router"], "give either KEY... or connection facts"),
        (["--router", "simple-router", "--client-id", "x", "k"], "give either KEY... or connection facts"),
        (["--router", "simple-router", "--ready", "connector9", "k"], "--ready names unknown node ids"),
        (["--router", "simple-router", "--source-ip", "not-an-ip"], "--source-ip:"),
    ],
)
def test_route_usage_errors_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: Sequence[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main_routerctl(["route", "--config", str(SEED_EXAMPLE), *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("routerctl: error: ")
    assert message in err
    assert len(err.splitlines()) == 1


def test_route_config_error_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text(DEMO.read_text().replace("<quorum-size>1</quorum-size>", "<quorum-size>0</quorum-size>"))
    with pytest.raises(SystemExit) as exit_info:
        main_routerctl(["route", "--config", str(bad), "--router", "demo", "k"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().endswith("<quorum-size>: must be > 0, got '0'")


def _admin_config() -> Config:
    """Router `r` (FIRST_ELEMENT) over two targets nothing listens on, probed once at start (the
    tests set readiness themselves), behind acceptor `a`."""
    connectors = tuple(Connector.from_url(f"b{i}", f"tcp://127.0.0.1:{pick_port()}") for i in range(2))
    router = RouterConfig(
        name="r",
        policy=PolicyConfig(name="FIRST_ELEMENT"),
        pool=PoolConfig(
            kind=PoolKind.STATIC, static_connectors=("b0", "b1"), check_period_ms=600_000, quorum_timeout_ms=0
        ),
    )
    acceptor = AcceptorConfig(name="a", host="127.0.0.1", port=0, router="r")
    return Config(source="test.xml", connectors=connectors, acceptors=(acceptor,), routers=(router,))


async def _routerctl(*argv: str) -> int:
    """`routerctl ARGV` in a thread (the server runs in this one): its exit status."""

    def run() -> int:
        try:
            return main_routerctl(list(argv))
        except SystemExit as exc:
            code = exc.code
        assert isinstance(code, int)
        return code

    return await trio.to_thread.run_sync(run)


class TestAdminCommands:
    """routerctl against a running server (in process): tables, --json, wait, exit statuses."""

    @pytest.fixture
    async def server(self, nursery: trio.Nursery) -> AsyncIterator[tuple[ServerInfo, str]]:
        shutdown = trio.Event()
        tokens = (Token(name="ops", level=Level.OPERATOR, secret="s" * 32),)
        info: ServerInfo = await nursery.start(
            lambda task_status: serve_router(
                _admin_config(),
                admin=("127.0.0.1", 0),
                shutdown=shutdown,
                admin_access=AdminAccess(tokens=tokens),
                task_status=task_status,
            )
        )
        runtime = info.runtimes["r"]
        await runtime.pool.wait_until(
            lambda: all(runtime.pool.target_state(n) is TargetState.NOT_READY for n in ("b0", "b1"))
        )
        assert info.admin is not None
        yield info, f"127.0.0.1:{info.admin[1]}"
        shutdown.set()

    @pytest.fixture(autouse=True)
    def _token(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("ROUTERCTL_TOKEN", "s" * 32)
        monkeypatch.delenv("ROUTERCTL_TOKEN_FILE", raising=False)
        monkeypatch.delenv("ROUTERCTL_ADMIN", raising=False)

    async def test_status_shows_the_process_its_acceptors_and_routers_as_tables(
        self, server: tuple[ServerInfo, str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        info, admin = server
        assert await _routerctl("status", "--admin", admin) == 0
        out = capsys.readouterr().out
        assert re.search(rf"^pid: +{os.getpid()}$", out, re.MULTILINE)
        assert re.search(r"^client connections: +0 of \d+$", out, re.MULTILINE)
        assert re.search(r"^descriptors: +\d+ of \d+$", out, re.MULTILINE)
        port = info.acceptors["a"][1]
        assert re.search(rf"^a +r +127\.0\.0\.1:{port} +proxy +fast +0 +0 +-$", out, re.MULTILINE), out
        assert re.search(r"^r +SOURCE_IP +FIRST_ELEMENT +inactive +0/2 +0/2 +-$", out, re.MULTILINE), out
        assert "\x1b[" not in out  # not a terminal: no colours

    async def test_status_json_is_the_status_document_with_the_routers(
        self, server: tuple[ServerInfo, str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        info, admin = server
        assert await _routerctl("status", "--json", "--admin", f"http://{admin}/") == 0
        document = json.loads(capsys.readouterr().out)
        assert document["process"]["pid"] == os.getpid()
        assert [(a["name"], a["port"]) for a in document["acceptors"]] == [("a", info.acceptors["a"][1])]
        assert [r["name"] for r in document["routers"]] == ["r"]

    async def test_status_of_a_router_state_and_target(
        self, server: tuple[ServerInfo, str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        _, admin = server
        assert await _routerctl("status", "--admin", admin, "r") == 0
        out = capsys.readouterr().out
        assert re.search(r"^policy: +FIRST_ELEMENT$", out, re.MULTILINE)
        # The target's line says why it is not ready, when it was last checked (and how long that
        # took) and when its state last changed.
        line = (
            r"^b0 +not-ready +ready +no +0 +\d+\.\ds ago \(\d+\.\d ms\) +\d+\.\ds ago +"
            r"tcp://127\.0\.0\.1:(\d+) +"
            r"connect to tcp://127\.0\.0\.1:(\d+) failed: Connection refused$"
        )
        found = re.search(line, out, re.MULTILINE)
        assert found is not None, out
        assert found.group(1) == found.group(2), out
        assert re.search(r"^new clients: +refused: pool below its quorum", out, re.MULTILINE), out
        assert await _routerctl("state", "--admin", admin, "r", "b1", "drain") == 0
        assert re.search(r"^b1 +not-ready +drain +no +0 ", capsys.readouterr().out, re.MULTILINE)
        assert await _routerctl("state", "--json", "--admin", admin, "r", "b1") == 0
        assert json.loads(capsys.readouterr().out)["admin_state"] == "drain"
        assert await _routerctl("target", "--admin", admin, "r", "k") == 0
        assert re.search(r"^k +REFUSED_UNAVAILABLE +- +-$", capsys.readouterr().out, re.MULTILINE)
        assert await _routerctl("target", "--json", "--admin", admin, "--dry-run", "r", "k") == 0
        assert json.loads(capsys.readouterr().out)["status"] == UNAVAILABLE

    async def test_wait_target_ready_returns_once_the_target_is_ready(
        self, server: tuple[ServerInfo, str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Scenario: `wait target r b0 ready` keeps asking until a probe (here: the test) makes
        b0 ready, then prints it and exits 0, well before its timeout."""
        info, admin = server
        status: list[int] = []

        async def wait() -> None:
            status.append(
                await _routerctl("wait", "target", "r", "b0", "ready", "--admin", admin, "--interval", "0.1")
            )

        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            await trio.sleep(0.5)
            assert status == []  # still waiting
            info.runtimes["r"].pool.record_check("b0", True)
        assert status == [0]
        assert trio.current_time() - started < 5
        assert re.search(r"^b0 +ready +ready +yes +0 ", capsys.readouterr().out, re.MULTILINE)

    async def test_wait_times_out_with_exit_status_5(
        self, server: tuple[ServerInfo, str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        _, admin = server
        started = trio.current_time()
        code = await _routerctl(
            "wait", "--timeout", "0.5", "--interval", "0.1", "--admin", admin, "target", "r", "b0", "ready"
        )
        elapsed = trio.current_time() - started
        assert code == 5
        assert 0.5 <= elapsed < 3
        assert capsys.readouterr().err.strip() == (
            "routerctl: error: wait: target 'b0' of router 'r' did not become ready within 0.5 s "
            "(last: not-ready, not open)"
        )

    async def test_wait_for_absent_targets_and_router_states(
        self, server: tuple[ServerInfo, str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        info, admin = server
        assert await _routerctl("wait", "--admin", admin, "--json", "target", "r", "gone", "absent") == 0
        assert json.loads(capsys.readouterr().out) == {"node_id": "gone", "in_pool": False}
        assert await _routerctl("wait", "--admin", admin, "router", "r", "not-ready") == 0
        assert re.search(r"^pool state: +inactive$", capsys.readouterr().out, re.MULTILINE)
        info.runtimes["r"].pool.record_check("b1", True)
        assert await _routerctl("wait", "--admin", admin, "--json", "router", "r", "ready") == 0
        assert json.loads(capsys.readouterr().out)["pool"]["active"] is True

    async def test_wait_for_an_unknown_router_exits_1_at_once(
        self, server: tuple[ServerInfo, str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        _, admin = server
        started = trio.current_time()
        assert await _routerctl("wait", "--admin", admin, "--timeout", "20", "router", "nope", "ready") == 1
        assert trio.current_time() - started < 5
        assert capsys.readouterr().err.strip().endswith("404 no connection router named 'nope'")

    async def test_a_wrong_or_missing_token_exits_4(
        self,
        server: tuple[ServerInfo, str],
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        _, admin = server
        monkeypatch.setenv("ROUTERCTL_TOKEN", "w" * 32)
        assert await _routerctl("status", "--admin", admin) == 4
        assert "401 " in capsys.readouterr().err
        monkeypatch.delenv("ROUTERCTL_TOKEN")
        assert await _routerctl("wait", "--admin", admin, "router", "r", "not-ready") == 4

    async def test_the_admin_address_comes_from_routerctl_admin(
        self,
        server: tuple[ServerInfo, str],
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        _, admin = server
        monkeypatch.setenv("ROUTERCTL_ADMIN", admin.split(":")[1])  # a bare port: 127.0.0.1
        assert await _routerctl("status", "--json") == 0
        assert json.loads(capsys.readouterr().out)["process"]["pid"] == os.getpid()
        monkeypatch.setenv("ROUTERCTL_ADMIN", "nowhere")
        assert await _routerctl("status") == 2
        assert capsys.readouterr().err.strip() == (
            "routerctl: error: ROUTERCTL_ADMIN: expected HOST:PORT, [IPV6]:PORT, :PORT, PORT or "
            "http://HOST:PORT, got 'nowhere'"
        )


def test_routerctl_without_router_running_is_one_line_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    port = pick_port()
    with pytest.raises(SystemExit) as exit_info:
        main_routerctl(["target", "--admin", f"http://127.0.0.1:{port}", "demo", "k"])
    assert exit_info.value.code == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"routerctl: error: cannot reach the router's admin API at http://127.0.0.1:{port}")
    assert len(err.splitlines()) == 1


def test_wait_keeps_asking_while_the_admin_api_cannot_be_reached(capsys: pytest.CaptureFixture[str]) -> None:
    """Scenario: routerd not up yet: wait asks again until its timeout, then exits 5 saying why."""
    port = pick_port()
    with pytest.raises(SystemExit) as exit_info:
        main_routerctl(
            ["wait", "--admin", str(port), "--timeout", "0.3", "--interval", "0.1", "router", "r", "ready"]
        )
    assert exit_info.value.code == 5
    assert capsys.readouterr().err.strip() == (
        "routerctl: error: wait: router 'r' did not become ready within 0.3 s (last: cannot reach the "
        f"router's admin API at http://127.0.0.1:{port}: [Errno 111] Connection refused)"
    )
