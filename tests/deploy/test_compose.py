"""deploy/compose/compose.yaml: valid by the compose specification's JSON schema (the copy
check-jsonschema ships), and consistent with what it mounts and builds: routerd's configuration
loads with the real loader and names the brokers the file starts, routerd is built from the
repository's Dockerfile and keeps its state file in the image's state directory on a volume, and
Prometheus scrapes routerd's admin address and loads deploy/prometheus/alerts.yml (`promtool check
config` on its configuration with the mounts' host files)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from router.config import load_config
from router.core.admin_access import is_loopback
from tests.deploy.conftest import COMPOSE, DEPLOY, ROOT, dockerfile, parse, yaml_documents

(DOCUMENT,) = yaml_documents(COMPOSE)
SERVICES: dict[str, Any] = DOCUMENT["services"]
ROUTERD = SERVICES["routerd"]
ARGS = parse([*dockerfile().entrypoint, *ROUTERD["command"]])


def _check_compose_schema(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host file of a service's bind mounts (short syntax, relative to the file)."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[target] = (COMPOSE.parent / source).resolve()
    return mounts


def _seconds(duration: str) -> float:
    assert duration.endswith("s"), f"expected N s, got {duration!r}"
    assert duration[:-1].isdigit(), f"expected N s, got {duration!r}"
    return float(duration[:-1])


def test_compose_file_is_valid_by_the_compose_schema() -> None:
    result = _check_compose_schema(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_schema_check_would_catch_a_mistake(tmp_path: Path) -> None:
    """Scenario: a misspelt service key in a copy is reported."""
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("stop_grace_period:", "stop_grace_perod:"))
    result = _check_compose_schema(broken)
    assert result.returncode == 1
    assert "'stop_grace_perod' was unexpected" in result.stdout


def test_compose_routerd_is_the_repositorys_image() -> None:
    build = ROUTERD["build"]
    assert (COMPOSE.parent / build["context"]).resolve() == ROOT
    assert (ROOT / build.get("dockerfile", "Dockerfile")).resolve() == ROOT / "Dockerfile"
    assert "entrypoint" not in ROUTERD  # the Dockerfile's, routerd
    image = dockerfile()
    assert ROUTERD.get("stop_signal", image.stop_signal) == image.stop_signal == "SIGTERM"
    assert _seconds(ROUTERD["stop_grace_period"]) > ARGS.grace_period
    # The image's user may write only where the container has a writable place: its state file is
    # in the image's state directory (its VOLUME), here a named volume, so states outlive `down`.
    assert ROUTERD["read_only"] is True
    image_state = parse([*image.entrypoint, *image.cmd]).state_file
    assert ARGS.state_file == image_state
    named = {v.split(":")[1]: v.split(":")[0] for v in ROUTERD["volumes"] if not v.startswith(".")}
    (target,) = [t for t in named if PurePosixPath(ARGS.state_file).is_relative_to(t)]
    assert target in image.volumes
    assert named[target] in DOCUMENT["volumes"]


def test_compose_routerd_configuration_loads_and_names_the_brokers() -> None:
    config_file = _bind_mounts(ROUTERD)[ARGS.config]
    config = load_config(str(config_file))
    brokers = {
        name for name, s in SERVICES.items() if str(s.get("image", "")).startswith("eclipse-mosquitto")
    }
    assert len(brokers) == 3
    assert {c.host for c in config.connectors} == brokers
    for name in brokers:
        conf = _bind_mounts(SERVICES[name])["/mosquitto/config/mosquitto.conf"].read_text()
        assert {f"listener {c.port}" for c in config.connectors} == {
            line for line in conf.splitlines() if line.startswith("listener ")
        }
    published = {p.rsplit(":", 1)[1] for p in ROUTERD["ports"]}
    assert {str(a.port) for a in config.acceptors} <= published


def test_compose_prometheus_scrapes_routerds_admin_api() -> None:
    """Prometheus shares routerd's network, so the admin API stays on loopback without tokens."""
    prometheus = SERVICES["prometheus"]
    assert prometheus["network_mode"] == "service:routerd"
    assert is_loopback(ARGS.admin[0])
    assert ARGS.admin_tokens is None
    scrape = yaml.safe_load(_bind_mounts(prometheus)["/etc/prometheus/prometheus.yml"].read_text())
    (job,) = scrape["scrape_configs"]
    assert job["static_configs"] == [{"targets": [f"{ARGS.admin[0]}:{ARGS.admin[1]}"]}]
    assert "127.0.0.1:9090:9090" in ROUTERD["ports"]  # Prometheus's UI, published by its network's owner


@pytest.mark.parametrize("published", ROUTERD["ports"])
def test_compose_publishes_on_the_hosts_loopback_only(published: str) -> None:
    assert published.startswith("127.0.0.1:")


def test_compose_prometheus_loads_the_alert_rules(tmp_path: Path) -> None:
    """Scenario (issue 34): the demo's Prometheus has the rules of deploy/prometheus/alerts.yml:
    its configuration names a rule file that compose mounts from there, and `promtool check config`
    (the container's paths replaced by the mounts' host files) loads them all."""
    prometheus = SERVICES["prometheus"]
    mounts = _bind_mounts(prometheus)
    configuration = mounts["/etc/prometheus/prometheus.yml"]
    rule_files = yaml.safe_load(configuration.read_text())["rule_files"]
    assert [mounts[path] for path in rule_files] == [DEPLOY / "prometheus" / "alerts.yml"]
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("promtool is not installed: run ./run-tests, which installs the prometheus package")
    copy = tmp_path / "prometheus.yml"
    text = configuration.read_text()
    for path in rule_files:
        text = text.replace(path, str(mounts[path]))
    copy.write_text(text)
    checked = subprocess.run(
        [binary, "check", "config", str(copy)], capture_output=True, text=True, timeout=60, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    count = sum(len(group["rules"]) for group in alerts["groups"])
    assert f"SUCCESS: {count} rules found" in checked.stdout
