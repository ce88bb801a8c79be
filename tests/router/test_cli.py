"""The command line: `routerctl route` on the seed's example routers, `routerctl target/status`
against a running server, and `routerd`'s one-line errors."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from policies import PolicyConfig
from pools import Connector, PoolConfig, PoolKind, TargetState
from router.cli import _routerctl_parser, _routerd_parser, main_routerctl, main_routerd
from router.config.settings import AcceptorConfig, Config, RouterConfig
from router.core.admin_access import AdminAccess, Level, Token
from router.ctl_output import EXIT_CODES_HELP
from router.server import ServerInfo, serve_router
from tests.conftest import free_port as pick_port
from tests.router.conftest import Mosquitto, acceptors_xml, mqtt_round_trip, static_connectors

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator, Sequence

    from tests.router.conftest import Routerd

ROOT = Path(__file__).resolve().parents[2]
SEED_EXAMPLE = ROOT / "deploy" / "examples" / "artemis-manual.xml"
DEMO = ROOT / "deploy" / "examples" / "demo.xml"


def _route(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, object]]:
    assert main_routerctl(["route", "--json", "--config", str(SEED_EXAMPLE), *args]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _decision(
    key: str, status: str, node_id: str | None = None, *, local: bool = False, connector: str | None = None
) -> dict[str, object]:
    return {"key": key, "status": status, "node_id": node_id, "local": local, "connector": connector}


def _routerd_process(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m router ARGS...` in a process of its own, its output captured as text."""
    return subprocess.run([sys.executable, "-m", "router", *args], capture_output=True, text=True, timeout=60)


OK, USE_ANOTHER, UNAVAILABLE = "OK", "REFUSED_USE_ANOTHER", "REFUSED_UNAVAILABLE"


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
        await runtime.wait_until(
            lambda: all(runtime.target_state(n) is TargetState.NOT_READY for n in ("b0", "b1"))
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
        assert re.search(r"^r +SOURCE_IP +FIRST_ELEMENT +inactive +0/2 +-$", out, re.MULTILINE), out
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
        assert re.search(r"^b0 +not-ready +ready +0 +tcp://127\.0\.0\.1:\d+$", out, re.MULTILINE), out
        assert await _routerctl("state", "--admin", admin, "r", "b1", "drain") == 0
        assert re.search(r"^b1 +not-ready +drain +0 ", capsys.readouterr().out, re.MULTILINE)
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
            info.runtimes["r"].record_check("b0", True)
        assert status == [0]
        assert trio.current_time() - started < 5
        assert re.search(r"^b0 +ready +ready +0 ", capsys.readouterr().out, re.MULTILINE)

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
            "(last: not-ready)"
        )

    async def test_wait_for_absent_targets_and_router_states(
        self, server: tuple[ServerInfo, str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        info, admin = server
        assert await _routerctl("wait", "--admin", admin, "--json", "target", "r", "gone", "absent") == 0
        assert json.loads(capsys.readouterr().out) == {"node_id": "gone", "in_pool": False}
        assert await _routerctl("wait", "--admin", admin, "router", "r", "not-ready") == 0
        assert re.search(r"^pool state: +inactive$", capsys.readouterr().out, re.MULTILINE)
        info.runtimes["r"].record_check("b1", True)
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


def _actions(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    """Every action of a parser and of its subcommands, with the command path it belongs to."""
    for action in parser._actions:
        yield path, action
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield f"{path} {choice.dest}", choice
            for name, subparser in action.choices.items():
                yield from _actions(subparser, f"{path} {name}")


def test_routerctl_every_command_and_option_has_help() -> None:
    """Scenario: the real argparse tree (routerctl's commands and the pipeline's), walked: every
    command, subcommand, option and positional says what it is for."""
    walked = list(_actions(_routerctl_parser(), "routerctl"))
    missing = [
        f"{path}: {action.option_strings or action.dest}" for path, action in walked if not action.help
    ]
    assert missing == []
    commands = {path for path, _ in walked}
    assert {
        "routerctl wait target",
        "routerctl wait router",
        "routerctl cache pin",
        "routerctl simulate",
    } <= commands


def test_routerd_every_option_has_help() -> None:
    missing = [str(a.option_strings) for _, a in _actions(_routerd_parser(), "routerd") if not a.help]
    assert missing == []


@pytest.mark.parametrize("program", ["routerctl", "routerd"])
def test_version_is_the_package_version(program: str, capsys: pytest.CaptureFixture[str]) -> None:
    main = main_routerctl if program == "routerctl" else main_routerd
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"{program} {importlib.metadata.version('connection-router')}\n"


def test_routerctl_help_lists_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main_routerctl(["--help"])
    out = capsys.readouterr().out
    assert EXIT_CODES_HELP in out
    assert "ROUTERCTL_ADMIN" in out


def test_routerd_and_routerctl_share_the_admin_address_syntax(capsys: pytest.CaptureFixture[str]) -> None:
    """Scenario: the same wrong --admin is the same usage error (exit 2) in both programs."""
    for main, prog in ((main_routerd, "routerd"), (main_routerctl, "routerctl status")):
        argv = (
            ["--config", str(DEMO), "--admin", "::1:80"]
            if prog == "routerd"
            else ["status", "--admin", "::1:80"]
        )
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"{prog}: error: argument --admin: an IPv6 address goes in brackets, [::1]:80; got '::1:80'"
        )


class TestRouterd:
    def test_routerd_config_error_is_one_line_exit_2(self, tmp_path: Path) -> None:
        bad = tmp_path / "bad.xml"
        bad.write_text(DEMO.read_text().replace("CONSISTENT_HASH", "CONSISTENT_HASHX"))
        proc = _routerd_process("--config", str(bad))
        assert proc.returncode == 2
        assert proc.stderr.startswith(f"routerd: error: {bad}:")
        assert "<policy>: unknown policy 'CONSISTENT_HASHX'" in proc.stderr
        assert "Traceback" not in proc.stderr

    def test_routerd_without_routed_acceptor_exit_2(self, tmp_path: Path) -> None:
        # A process of its own: routerd installs log limiters on the process's handlers.
        cfg = tmp_path / "noacc.xml"
        cfg.write_text(DEMO.read_text().replace("?router=demo;", "?"))
        proc = _routerd_process("--config", str(cfg))
        assert proc.returncode == 2
        assert "no <acceptor> names a router" in proc.stderr

    def test_routerd_port_in_use_is_one_line_exit_1(self, tmp_path: Path) -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            cfg = tmp_path / "busy.xml"
            cfg.write_text(DEMO.read_text().replace("127.0.0.1:21880", f"127.0.0.1:{port}"))
            proc = _routerd_process("--config", str(cfg), "--no-admin")
        assert proc.returncode == 1
        last = proc.stderr.strip().splitlines()[-1]
        assert last == (
            f"routerd: error: acceptor 'mqtt' on 127.0.0.1:{port} cannot listen: Address already in use"
        )
        assert "Traceback" not in proc.stderr


def _demo_with(tmp_path: Path, params: str) -> tuple[Path, int]:
    """The demo configuration with `params` added to its acceptor's URL; the file and that line."""
    text = DEMO.read_text().replace("mode=proxy", f"mode=proxy;{params}")
    cfg = tmp_path / "router.xml"
    cfg.write_text(text)
    return cfg, text[: text.index('<acceptor name="mqtt">')].count("\n") + 1


class TestRouterdRefusesBadInput:
    """Findings of the hardening review: each is one line and exit status 2, never a traceback."""

    @staticmethod
    def _error_line(*args: str) -> str:
        proc = _routerd_process(*args)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        return proc.stderr.strip().splitlines()[-1]

    @pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "soon"])
    def test_routerd_rejects_a_grace_period_that_is_not_finite_and_non_negative(self, value: str) -> None:
        assert self._error_line("--config", str(DEMO), f"--grace-period={value}") == (
            f"routerd: error: argument --grace-period: must be a finite number of seconds >= 0, got {value!r}"
        )

    def test_routerd_rejects_an_endless_configuration_file(self) -> None:
        assert self._error_line("--config", "/dev/zero", "--no-admin") == (
            "routerd: error: /dev/zero: the configuration file must be a regular file of at most 16 MiB "
            "(16777216 bytes), got a character device"
        )

    def test_routerd_rejects_an_unknown_protocol(self, tmp_path: Path) -> None:
        cfg, line = _demo_with(tmp_path, "protocols=MQTT,FOO")
        assert self._error_line("--config", str(cfg), "--no-admin") == (
            f"routerd: error: {cfg}:{line}: <acceptor>: acceptor 'mqtt': protocols: each name must be one of "
            "AMQP, CORE, HORNETQ, MQTT, OPENWIRE, STOMP, got 'FOO' in 'MQTT,FOO'"
        )

    def test_routerd_rejects_a_missing_key_store_at_its_line(self, tmp_path: Path) -> None:
        missing = tmp_path / "missing.pem"
        cfg, line = _demo_with(tmp_path, f"sslEnabled=true;keyStorePath={missing}")
        assert self._error_line("--config", str(cfg), "--no-admin") == (
            f"routerd: error: {cfg}:{line}: <acceptor>: acceptor 'mqtt': keyStorePath '{missing}' "
            "cannot be read: No such file or directory"
        )

    def test_routerd_says_a_key_store_has_no_private_key(self, tmp_path: Path) -> None:
        import trustme

        certificate = tmp_path / "cert.pem"
        certificate.write_bytes(trustme.CA().issue_cert("router.example").cert_chain_pems[0].bytes())
        cfg, _ = _demo_with(tmp_path, f"sslEnabled=true;keyStorePath={certificate}")
        assert self._error_line("--config", str(cfg), "--no-admin") == (
            f"routerd: error: acceptor 'mqtt': keyStorePath '{certificate}' has a certificate "
            "but no private key"
        )


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    """One running mosquitto broker, stopped afterwards."""
    broker = Mosquitto(tmp_path, "mosquitto")
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()


@pytest.mark.integration
def _one_broker(broker: Mosquitto, port: int, *, check_period_ms: int = 5000) -> str:
    """Router `r` (FIRST_ELEMENT) over one broker `m1`, behind an MQTT acceptor on `port`."""
    connectors, refs = static_connectors([("m1", broker.port)])
    acceptors = acceptors_xml({"mqtt": "router=r;protocols=MQTT"}, {"mqtt": port})
    return f"""<core>
  <connectors>{connectors}</connectors>
  <acceptors>{acceptors}</acceptors>
  <connection-routers><connection-router name="r"><policy name="FIRST_ELEMENT"/>
    <pool><check-period>{check_period_ms}</check-period><static-connectors>{refs}</static-connectors></pool>
  </connection-router></connection-routers>
</core>"""


def test_routerd_sighup_reloads_the_file_and_keeps_serving(
    mosquitto: Mosquitto,
    start_routerd: Callable[[Callable[[int], str]], Routerd],
    free_port: Callable[[], int],
) -> None:
    """Scenario: SIGHUP (a reload habit, or a closed terminal) used to end routerd at once with no
    log line; it reloads the configuration file (here the same one: nothing changes)."""
    port = free_port()
    router = start_routerd(lambda _admin_port: _one_broker(mosquitto, port, check_period_ms=200))
    router.wait_for_log(r"router=r target=m1 is ready")
    assert router.proc is not None
    for _ in range(2):
        router.proc.send_signal(signal.SIGHUP)
        router.wait_for_log(re.escape(f"INFO routerd: SIGHUP received: reloading {router.config}"))
        router.wait_for_log(
            re.escape(f"INFO router.server: configuration {router.config} reloaded: nothing changed")
        )
    assert router.proc.poll() is None
    assert mqtt_round_trip(port, client_id=f"c-{uuid.uuid4()}", topic="sighup/still-proxied")
    routers: Any = router.get("/api/v1/routers")
    assert [r["name"] for r in routers] == ["r"]  # the admin API answers too
    assert router.stop() == 0
    assert not any("Traceback" in line for line in router.lines)


class TestRegister:
    """`routerctl register` errors a person can fix: one line, no traceback (the registration
    itself runs against a real ZooKeeper in test_discovery.py and test_routerd_zookeeper.py)."""

    BASE = ("register", "--zookeeper", "127.0.0.1:2181", "--path", "/fleet", "--node-id", "b1")

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["--path", "fleet"], "register: path must be an absolute znode path below /, got 'fleet'"),
            (["--zookeeper", "localhost"], "register: connect string must be host:port"),
            (
                ["--connector", "amqp://h:1"],
                "register: connector must be a tcp://host:port URL, got 'amqp://h:1'",
            ),
            (["--connector", "tcp://h:1?probe=x"], "register: connector: probe must be one of"),
            (["--backup", "h:2"], "register: backup must be a tcp://host:port URL, got 'h:2'"),
            (["--weight", "0"], "register: weight must be an integer 1-1000000, got 0"),
            (["--node-id", ""], "register: node_id must be 1-255 characters, got ''"),
        ],
    )
    def test_register_usage_errors_exit_2_with_one_line(
        self, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
    ) -> None:
        args = [*self.BASE, "--connector", "tcp://127.0.0.1:1883", *argv]
        with pytest.raises(SystemExit) as exit_info:
            main_routerctl(args)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"routerctl: error: {message}")
        assert len(err.splitlines()) == 1

    @pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
    def test_register_rejects_a_connect_timeout_that_is_not_finite_and_positive(
        self, capsys: pytest.CaptureFixture[str], value: str
    ) -> None:
        with pytest.raises(SystemExit) as exit_info:
            main_routerctl([*self.BASE, "--connector", "tcp://127.0.0.1:1883", f"--connect-timeout={value}"])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            "routerctl register: error: argument --connect-timeout: must be a finite number of seconds > 0, "
            f"got {value!r}"
        )

    @pytest.mark.parametrize("value", ["0", "2147483648", "1e3", "soon"])
    def test_register_rejects_a_session_timeout_zookeeper_cannot_take(
        self, capsys: pytest.CaptureFixture[str], value: str
    ) -> None:
        """Scenario: above 2^31-1 ms (ZooKeeper's int) kazoo's connection loop died with a traceback."""
        with pytest.raises(SystemExit) as exit_info:
            main_routerctl([*self.BASE, "--connector", "tcp://127.0.0.1:1883", f"--session-timeout={value}"])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            "routerctl register: error: argument --session-timeout: must be an integer 1-2147483647, "
            f"got {value!r}"
        )

    def test_register_unreachable_zookeeper_exits_1_without_traceback(self) -> None:
        with socket.socket() as unused:  # a port nothing listens on
            unused.bind(("127.0.0.1", 0))
            port = unused.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "from router.cli import routerctl_main; routerctl_main()",
                "register",
                "--zookeeper",
                f"127.0.0.1:{port}",
                "--path",
                "/fleet",
                "--node-id",
                "b1",
                "--connector",
                "tcp://127.0.0.1:1883",
                "--connect-timeout",
                "0.5",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 1
        assert (
            proc.stderr.strip()
            == f"routerctl: error: register: cannot reach zookeeper 127.0.0.1:{port} within 0.5 s"
        )


def _may_raise_the_hard_limit() -> bool:
    """Whether a process may raise its hard descriptor limit (CAP_SYS_RESOURCE; root in a container
    may lack it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> _CAP_SYS_RESOURCE & 1)
    return False


_CAP_SYS_RESOURCE = 24


@pytest.mark.parametrize("wanted", [100, 15_000])
def test_routerd_max_connections_sets_the_budget_and_raises_the_limit_to_fit(
    mosquitto: Mosquitto,
    start_routerd: Callable[..., Routerd],
    free_port: Callable[[], int],
    wanted: int,
) -> None:
    """Scenario (hardening review): --max-connections is HAProxy's maxconn. Below what the limit
    allows it caps the budget; above it routerd raises its hard descriptor limit to fit (as root
    or with CAP_SYS_RESOURCE: 10,000 sessions need more than this machine's 20,000), or says it
    cannot and serves what the limit allows."""
    config = _one_broker(mosquitto, free_port())
    router = start_routerd(lambda _admin_port: config, "--max-connections", str(wanted))
    found = re.search(
        r"up to (\d+) client", router.wait_for_log(r"up to \d+ client connections", consume=False)
    )
    assert found is not None
    budget = int(found.group(1))
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if wanted < hard // 2:
        assert budget == wanted
        router.wait_for_log(rf"--max-connections {wanted}: fewer than the descriptors allow", consume=False)
    elif _may_raise_the_hard_limit():
        router.wait_for_log(r"descriptor limit raised from \d+ to \d+ \(soft and hard\)", consume=False)
        assert budget >= wanted
    else:
        router.wait_for_log(
            rf"--max-connections {wanted} needs \d+ descriptors; the hard limit", consume=False
        )
        assert budget < wanted
    assert f"router_client_connection_budget {float(budget)}" in router.metrics()
    assert router.stop() == 0


def test_routerd_event_log_in_an_unusable_directory_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = _routerd_process("--config", str(DEMO), "--no-admin", "--event-log", str(blocker / "events"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"routerd: error: event log directory '{blocker}/events': Not a directory"
    )


def test__evicted_line() -> None:
    from router.cli import _evicted_line

    assert [_evicted_line(n) for n in (0, 1, 7)] == [
        "evicted 0 entries",
        "evicted 1 entry",
        "evicted 7 entries",
    ]


def test__status_blocks_show_zookeeper_sessions_only_when_there_are_some() -> None:
    from router.cli import _status_blocks

    document: dict[str, object] = {"process": {}, "acceptors": [], "routers": [], "zookeeper": []}
    assert len(_status_blocks(document)) == 3
    document["zookeeper"] = [
        {
            "router": "r",
            "use": "discovery",
            "connect": "127.0.0.1:2181",
            "path": "/members",
            "state": "suspended",
            "since": "2026-05-01T12:00:00.000Z",
            "session_timeout_ms": 10_000,
            "answer_timeout_ms": 2000,
        }
    ]
    blocks = _status_blocks(document)
    table = blocks[-1]
    assert not isinstance(table, str)
    assert table.render().splitlines() == [
        "ROUTER  ZOOKEEPER  STATE      SINCE                     AT",
        "r       discovery  suspended  2026-05-01T12:00:00.000Z  127.0.0.1:2181/members",
    ]
