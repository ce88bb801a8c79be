"""deploy/prometheus/alerts.yml: valid for Prometheus (`promtool check rules`), its unit tests in
alerts_test.yml pass (`promtool test rules`) and fail when a rule is broken, and every alert has a
test, a severity, a summary and a description. promtool comes with the Debian package
`prometheus` (deploy/bootstrap.sh installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.conftest import eventually, free_port
from tests.deploy.prometheus.conftest import Prometheus
from tests.router.conftest import ROUTERCTL, Routerd

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool (from the Debian package); its exit status is the caller's to check."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is not installed: run ./run-tests, which installs the prometheus package")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False)


def _alerts() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def test_alerts_pass_promtool_check_rules() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in checked.stdout


def test_alerts_pass_their_unit_tests() -> None:
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_alerts_unit_tests_fail_for_a_broken_rule(tmp_path: Path) -> None:
    """Scenario: the target-down alert waits 10 minutes instead of 1: its test says so."""
    rules = RULES.read_text()
    broken = rules.replace(
        'router_target_state{state="down"} == 1\n        for: 1m',
        'router_target_state{state="down"} == 1\n        for: 10m',
    )
    assert broken != rules
    (tmp_path / "alerts.yml").write_text(broken)
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "alertname: RouterTargetDown, time: 4m" in tested.stdout + tested.stderr


def test_alerts_each_have_a_test_a_severity_a_summary_and_a_description() -> None:
    alerts = _alerts()
    names = [alert["alert"] for alert in alerts]
    assert {
        "RouterTargetDown",
        "RouterPoolBelowQuorum",
        "RouterRefusalsRising",
        "RouterClientConnectionBudgetNearlySpent",
        "RouterEvacuationStuck",
    } <= set(names)
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing = {
        case["alertname"] for test in tests for case in test.get("alert_rule_test", []) if case["exp_alerts"]
    }
    assert firing == set(names)  # every alert is seen firing by a test
    for alert in alerts:
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), alert["alert"]
        assert alert["annotations"]["summary"], alert["alert"]
        assert alert["annotations"]["description"], alert["alert"]
        assert alert["alert"].startswith("Router"), alert["alert"]


# -- the rules against a real routerd, in a real Prometheus ------------------------------------------

ALERT_DEADLINE_S = 40.0
"""How long an alert whose condition holds may take to fire: a few scrapes and evaluations (one a
second here), with room for a loaded machine."""


def _dead_pool_config(dead_port: int) -> Callable[[int], str]:
    """routerd with one router over a connector where nothing listens (no broker needed)."""
    return lambda _admin: (
        f"""<?xml version="1.0"?>
<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">
 <connectors><connector name="c0">tcp://127.0.0.1:{dead_port}?nodeId=b0</connector></connectors>
 <acceptors><acceptor name="a">tcp://127.0.0.1:{free_port()}?router=r</acceptor></acceptors>
 <connection-routers><connection-router name="r"><key-type>CLIENT_ID</key-type>
  <policy name="FIRST_ELEMENT"/><pool><check-period>1000</check-period>
  <static-connectors><connector-ref>c0</connector-ref></static-connectors></pool></connection-router>
 </connection-routers>
</core></configuration>
"""
    )


@pytest.mark.integration
def test_a_refused_reload_and_a_stopped_routerd_fire_their_alerts(tmp_path: Path) -> None:
    """Scenario (issue 34): a real Prometheus with a copy of alerts.yml whose `for:` are 0s scrapes
    a real routerd. A refused configuration file fires RouterConfigReloadFailed; routerd stopped
    fires RouterDown (its scrape fails)."""
    rules = RULES.read_text()
    quick = re.sub(
        r"(- alert: Router(?:Down|ConfigReloadFailed)\n(?:.*\n)*?        for: )\S+", r"\g<1>0s", rules
    )
    assert quick.count("for: 0s") == 2
    (tmp_path / "alerts.yml").write_text(quick)
    router = Routerd(tmp_path, _dead_pool_config(free_port()))
    router.start()
    try:
        server = Prometheus(tmp_path, [f"127.0.0.1:{router.admin_port}"], [tmp_path / "alerts.yml"])
        server.start()
        try:

            def firing() -> set[str]:
                alerts = server.api("alerts")["alerts"]
                return {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}

            assert eventually(lambda: server.query('up{job="routerd"} == 1') != [], ALERT_DEADLINE_S)
            assert "RouterConfigReloadFailed" not in firing()
            router.config.write_text(
                router.config.read_text().replace("<check-period>1000", "<check-period>-1")
            )
            refused = subprocess.run(
                [*ROUTERCTL, "reload", "--admin", router.admin], capture_output=True, text=True, timeout=60
            )
            assert refused.returncode == 1, refused
            assert eventually(lambda: "RouterConfigReloadFailed" in firing(), ALERT_DEADLINE_S)
            assert "RouterDown" not in firing()
            router.stop()
            assert eventually(lambda: "RouterDown" in firing(), ALERT_DEADLINE_S)
        finally:
            server.stop()
    finally:
        router.stop()
