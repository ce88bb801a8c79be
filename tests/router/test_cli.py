"""The command line: `routerctl route` on the seed's example routers, `routerctl target/status`
against a running server, and `routerd`'s one-line errors."""

from __future__ import annotations

import importlib.metadata
import json
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

from router.cli import _routerd_parser, main_routerd
from router.ctl import main_routerctl
from tests.router.conftest import Mosquitto, acceptors_xml, mqtt_round_trip, static_connectors
from tests.router.test_ctl import _actions

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

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
