"""The README's first command: the demo fleet runs, routes as predicted, and cleans up after itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import accepts

ROOT = Path(__file__).resolve().parents[2]
DEMO_PORTS = (21880, 21883, 21884, 21885, 21890)


@pytest.mark.integration
def test_demo_once_routes_every_client_as_predicted_and_stops_everything() -> None:
    busy = [p for p in DEMO_PORTS if accepts(p)]
    if busy:
        pytest.fail(f"demo ports {busy} are busy: stop the running demo first")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "demo.py"), "--once"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    rows = [line.split() for line in lines if line.startswith("127.0.0.")]
    assert len(rows) == 8
    for source, landed, predicted, outcome in rows:
        assert (landed, outcome) == (predicted, "ok"), source
    assert {row[1] for row in rows} == {"node4", "node9", "node20"}
    assert "8/8 clients landed where the router predicted." in lines
    assert sum(line.startswith("stopped ") for line in lines) == 4
    assert [p for p in DEMO_PORTS if accepts(p)] == []
