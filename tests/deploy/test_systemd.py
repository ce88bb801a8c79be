"""deploy/systemd/connection-router.service: systemd's own checks, its numbers against routerd's,
and routerd running under the memory protection the unit asks for.

No systemd runs services here, so `systemd-analyze verify` and `systemd-analyze security
--offline=true` (systemd 252, Debian 12) check the file; verify also wants ExecStart's program to
exist, so it checks a copy whose routerd is the one of this venv.
"""

from __future__ import annotations

import ctypes
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pytest

from router.core.admission import descriptors_for
from router.server import EXIT_FILES_S
from tests.conftest import eventually, free_port
from tests.deploy.conftest import SYSTEMD_UNIT, parse, systemd_command_lines, systemd_directives
from tests.router.conftest import Mosquitto, Routerd, acceptors_xml, running, static_connectors

if TYPE_CHECKING:
    from collections.abc import Iterator

SYSTEMD_ANALYZE = "/usr/bin/systemd-analyze"
SECURITY_THRESHOLD = 1.5
"""The highest exposure `systemd-analyze security` may give the unit (0 = locked down, 10 = none).
The unit scores 1.2: what is left is what a network proxy needs (host network, internet and unix
sockets, setrlimit/setpriority) and a root directory of its own, which it does not get."""
INSTALLED_ROUTERD = "/usr/local/bin/routerd"
INSTALLED_ROUTERCTL = "/usr/local/bin/routerctl"
TIMEOUT_S = 60.0


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    if not Path(SYSTEMD_ANALYZE).exists():
        pytest.fail(f"{SYSTEMD_ANALYZE} is missing: run deploy/bootstrap.sh (Debian package systemd)")
    return subprocess.run(
        [SYSTEMD_ANALYZE, *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )


def _testable_copy(directory: Path, text: str | None = None) -> Path:
    """The unit (or `text`) in `directory`, its routerd and routerctl the venv's (verify checks
    that they exist)."""
    unit = directory / SYSTEMD_UNIT.name
    text = SYSTEMD_UNIT.read_text() if text is None else text
    for installed in (INSTALLED_ROUTERD, INSTALLED_ROUTERCTL):
        program = Path(sys.executable).with_name(Path(installed).name)
        assert program.exists(), f"{program}: not in the venv; run deploy/bootstrap.sh"
        assert installed in text
        text = text.replace(installed, str(program))
    unit.write_text(text)
    return unit


def _exposure(unit: Path) -> float:
    result = _analyze("security", "--offline=true", "--no-pager", str(unit))
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match is not None, result.stdout + result.stderr
    return float(match.group(1))


def _directives() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for key, value in systemd_directives(SYSTEMD_UNIT):
        found.setdefault(key, []).append(value)
    return found


def test_systemd_verify_reports_nothing(tmp_path: Path) -> None:
    result = _analyze("verify", "--man=no", str(_testable_copy(tmp_path)))
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_systemd_verify_would_report_a_mistake(tmp_path: Path) -> None:
    """Scenario: the check above is no empty promise: a misspelt value in a copy is reported."""
    text = SYSTEMD_UNIT.read_text().replace("ProtectSystem=strict", "ProtectSystem=stricter")
    result = _analyze("verify", "--man=no", str(_testable_copy(tmp_path, text)))
    assert "Failed to parse protect system value, ignoring: stricter" in result.stderr


def test_systemd_security_exposure_is_within_the_threshold(tmp_path: Path) -> None:
    unit = _testable_copy(tmp_path)
    assert _exposure(unit) <= SECURITY_THRESHOLD
    threshold = str(round(SECURITY_THRESHOLD * 10))  # systemd's --threshold counts tenths
    result = _analyze("security", "--offline=true", "--no-pager", f"--threshold={threshold}", str(unit))
    assert result.returncode == 0, result.stdout


def test_systemd_security_would_catch_lost_hardening(tmp_path: Path) -> None:
    """Scenario: the unit without its hardening lines scores far above the threshold."""
    hardening = re.compile(
        r"^(Protect|Private|Restrict|SystemCall|Capability|Ambient|NoNew|Lock|Memory|RemoveIPC|UMask)"
    )
    text = "\n".join(line for line in SYSTEMD_UNIT.read_text().splitlines() if not hardening.match(line))
    assert _exposure(_testable_copy(tmp_path, text)) > SECURITY_THRESHOLD + 3


def test_systemd_unit_fits_routerd() -> None:
    """The unit's numbers agree with routerd's: descriptors for --max-connections, a stop timeout
    beyond the grace period and the event log's finish, the state file in the state directory."""
    directives = _directives()
    (argv,) = [c for c in systemd_command_lines(SYSTEMD_UNIT) if Path(c[0]).name == "routerd"]
    assert argv[0] == INSTALLED_ROUTERD
    args = parse(argv)
    # routerd speaks sd_notify (tests/router/test_routerd_reload.py: READY=1, RELOADING=1, STOPPING=1)
    assert directives["Type"] == ["notify"]
    assert directives["NotifyAccess"] == ["main"]
    assert "AF_UNIX" in directives["RestrictAddressFamilies"][0].split()  # the notify socket
    assert directives["KillSignal"] == ["SIGTERM"]
    # A reload through the admin API, whose refusal fails `systemctl reload`, at routerd's --admin.
    (reload,) = directives["ExecReload"]
    assert reload == f"{INSTALLED_ROUTERCTL} reload --admin {args.admin[0]}:{args.admin[1]}"
    assert args.max_connections is not None
    assert int(directives["LimitNOFILE"][0]) >= descriptors_for(args.max_connections)
    assert float(directives["TimeoutStopSec"][0]) > args.grace_period + EXIT_FILES_S
    (state_directory,) = directives["StateDirectory"]
    assert Path(args.state_file).parent == Path("/var/lib") / state_directory
    assert directives["WorkingDirectory"] == [f"%S/{state_directory}"]
    assert directives["DynamicUser"] == ["yes"]
    # No capability: then the admin API's port (and the acceptors', the docs say) is >= 1024.
    assert directives["CapabilityBoundingSet"] == [""]
    assert directives["AmbientCapabilities"] == [""]
    assert args.admin[1] >= 1024


# -- MemoryDenyWriteExecute=yes ------------------------------------------------------------------

PR_SET_MDWE = 65
PR_GET_MDWE = 66
PR_MDWE_REFUSE_EXEC_GAIN = 1

_MDWE_WRAPPER = f"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl({PR_SET_MDWE}, {PR_MDWE_REFUSE_EXEC_GAIN}, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_MDWE)")
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""
"""Run Python (routerd) as systemd's MemoryDenyWriteExecute=yes does: no memory may become both
writable and executable, in this process and its children (Linux 6.3's prctl; systemd uses
seccomp for the same rule)."""


class _MdweRouterd(Routerd):
    def program(self) -> list[str]:
        return [sys.executable, "-c", _MDWE_WRAPPER, "-m", "router"]


def _connect_config(port: int, broker: Mosquitto) -> str:
    connectors, refs = static_connectors([("b0", broker.port)])
    acceptors = acceptors_xml({"a": "router=r;mode=proxy"}, {"a": port})
    return f"""<?xml version="1.0"?>
<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
 <connectors>{connectors}</connectors><acceptors>{acceptors}</acceptors>
 <connection-routers><connection-router name="r"><key-type>CLIENT_ID</key-type>
  <policy name="FIRST_ELEMENT"/><pool><check-period>200</check-period>
  <static-connectors>{refs}</static-connectors></pool></connection-router></connection-routers>
</core></configuration>
"""


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    for brokers in running([Mosquitto(tmp_path, "mosquitto")]):
        yield brokers[0]


def _readyz(router: Routerd) -> int:
    try:
        with urllib.request.urlopen(router.admin + "/readyz", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_mdwe_wrapper_puts_python_under_the_rule() -> None:
    """The wrapper does set the rule, and this test process is not under it."""
    assert ctypes.CDLL(None).prctl(PR_GET_MDWE, 0, 0, 0, 0) == 0
    check = f"import ctypes; print(ctypes.CDLL(None).prctl({PR_GET_MDWE}, 0, 0, 0, 0))"
    result = subprocess.run(
        [sys.executable, "-c", _MDWE_WRAPPER, "-c", check],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
    )
    assert result.stdout.strip() == str(PR_MDWE_REFUSE_EXEC_GAIN)


@pytest.mark.integration
def test_routerd_runs_under_memory_deny_write_execute(tmp_path: Path, broker: Mosquitto) -> None:
    """Scenario: routerd and its event log's writer (a child process) under the unit's
    MemoryDenyWriteExecute=yes rule: routerd starts, proxies an MQTT session, the writer writes
    its events, and routerd drains with exit status 0."""
    port = free_port()
    events = tmp_path / "events"
    router = _MdweRouterd(
        tmp_path, lambda _admin: _connect_config(port, broker), ["--event-log", str(events)]
    )
    try:
        router.start()
        assert eventually(lambda: _readyz(router) == 200, 10.0)
        payload = b"\x00\x04MQTT\x04\x02\x00\x3c\x00\x04mdwe"
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(bytes([0x10, len(payload)]) + payload)
            assert client.recv(4) == b"\x20\x02\x00\x00"  # mosquitto's CONNACK, through routerd
            client.sendall(b"\xc0\x00")  # PINGREQ
            assert client.recv(2) == b"\xd0\x00"
        router.wait_for_log(r"router=r target=b0 closed")
    finally:
        exit_status = router.stop()
    assert exit_status == 0
    (finished,) = events.glob("events-*.parquet")  # pyarrow works under the rule too
    assert pq.read_table(finished).column("kind").to_pylist() == ["decision", "close"]
