"""The mosquitto max_connections study: it runs against a real mosquitto and reports each kind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from benchmarks.studies import mosquitto_max_connections as study

ROOT = Path(__file__).resolve().parents[3]


def test_study_reports_every_kind_of_churn() -> None:
    """Scenario: a small run prints one line per kind, each with at least the free slots landed
    (fewer would mean the study lost sessions of its own), and stops its broker."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.studies.mosquitto_max_connections", "--churn", "20"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(study.KINDS), lines
    for line in lines:
        match = re.search(r"after 20 churned: (\d+) landed where (\d+) were free", line)
        assert match is not None, line
        assert int(match.group(1)) >= int(match.group(2)) == study.LIMIT - study.HELD, line
