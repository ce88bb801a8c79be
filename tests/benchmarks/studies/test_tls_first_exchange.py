"""The TLS first-exchange benchmark: a smoke run against real mosquitto, HAProxy and routerd, and
its summary and command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.clients import find_tool
from benchmarks.studies import tls_first_exchange as bench
from benchmarks.studies.tls_first_exchange import Exchange, summarize

ROOT = Path(__file__).resolve().parents[3]
FIRST_EXCHANGE_LIMIT_MS = 20.0
"""routerd's median CONNECT -> CONNACK after the handshake: half the 40 ms delayed-ACK scale."""


def _exchange(handshake_ms: float, connack_ms: float, total_ms: float) -> Exchange:
    return Exchange(
        handshake_s=handshake_ms / 1000, connack_s=connack_ms / 1000, first_exchange_s=total_ms / 1000
    )


@pytest.mark.integration
def test_tls_first_exchange_quick_measures_every_path(tmp_path: Path) -> None:
    """Scenario: `python -m benchmarks.studies.tls_first_exchange --quick` starts mosquitto, HAProxy and
    routerd, times every path, stops them all, and routerd's first exchange is not delayed."""
    missing = [tool for tool in bench.TOOLS if find_tool(tool) is None]
    if missing:
        pytest.fail(f"the benchmark needs {', '.join(missing)}: run ./run-tests, which installs them")
    out = tmp_path / "tls.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.studies.tls_first_exchange", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(out.read_text())
    assert doc["quick"] is True
    assert doc["failures"] == {}
    assert set(doc["medians_ms"]) == set(bench.PATHS)
    assert set(doc["ratios"]) == {"routerd/haproxy", "routerd/direct", "haproxy/direct"}
    assert all(doc["server_cpu_ms_per_connection"][path] > 0 for path in bench.PATHS)
    connects = bench.QUICK.rounds * bench.QUICK.connects
    assert all(len(doc["samples_ms"][path]["connack"]) == connects for path in bench.PATHS)
    assert doc["medians_ms"]["routerd"]["connack"] < FIRST_EXCHANGE_LIMIT_MS, doc["samples_ms"]["routerd"]
    assert "goal: routerd's median first exchange <= 1.5x HAProxy's" in result.stdout
    for name in ("mosquitto", "haproxy", "routerd"):
        assert f"stopped {name}" in result.stderr


def test_summarize_gives_medians_ratios_and_goal() -> None:
    samples: dict[bench.PathName, list[Exchange]] = {
        "direct": [_exchange(2, 0.5, 3), _exchange(2, 0.5, 3), _exchange(9, 9, 90)],
        "haproxy": [_exchange(2, 0.5, 4)],
        "routerd": [_exchange(3, 1, 5), _exchange(3, 1, 7)],
    }
    summary = summarize(samples, {"haproxy": 0.8, "routerd": 2.5})
    assert summary.server_cpu_ms == {"haproxy": 0.8, "routerd": 2.5}
    assert summary.medians_ms["direct"] == {"handshake": 2.0, "connack": 0.5, "first_exchange": 3.0}
    assert summary.medians_ms["routerd"]["first_exchange"] == 6.0
    assert summary.ratios["routerd/haproxy"] == {"handshake": 1.5, "connack": 2.0, "first_exchange": 1.5}
    assert summary.goal_ratio == 1.5
    assert summary.goal_met is True
    assert "met (1.50x)" in bench.format_summary(summary)


def test_summarize_without_a_path_has_no_goal() -> None:
    summary = summarize(
        {"direct": [_exchange(2, 0.5, 3)], "haproxy": [], "routerd": [_exchange(3, 1, 5)]}, {}
    )
    assert set(summary.ratios) == {"routerd/direct"}
    assert summary.goal_met is None
    table = bench.format_summary(summary)
    assert "failed" in table
    assert "not measured" in table


def test_configs_terminate_tls_in_front_of_the_plain_listener(tmp_path: Path) -> None:
    pem = tmp_path / "server.pem"
    assert f"bind 127.0.0.1:21001 ssl crt {pem}" in bench.haproxy_tls_config(21001, 21000, pem)
    routerd = bench.routerd_tls_config(21002, 21000, pem)
    assert f"sslEnabled=true;keyStorePath={pem}" in routerd
    assert "tcp://127.0.0.1:21000" in routerd
    mosquitto = bench.mosquitto_tls_config(21000, 21003, tmp_path / "c.pem", tmp_path / "k.pem")
    assert "set_tcp_nodelay true" in mosquitto
    assert "listener 21003 127.0.0.1\ncertfile" in mosquitto


def test__parse_args_bounds_rounds_and_connects(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench._parse_args(["--rounds", "0"])
    assert "--rounds must be between 1 and 50, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench._parse_args(["--connects", "501"])
    assert "--connects must be between 1 and 500, got 501" in capsys.readouterr().err
