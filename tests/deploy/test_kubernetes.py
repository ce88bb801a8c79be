"""deploy/kubernetes/: every manifest is valid Kubernetes (the API's JSON schemas, strict: no
unknown field), and the manifests agree with routerd and with each other: the ConfigMap's
broker.xml loads, the probes reach /readyz and /healthz on the admin port, the preStop hook and
the grace periods fit, the Service and the PodDisruptionBudget select the pods."""

from __future__ import annotations

import copy
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import kubernetes_validate
import pytest

from router.config import load_config
from router.core.admin_access import is_loopback
from router.ctl_client import DEFAULT_ADMIN
from tests.deploy.conftest import KUBERNETES, dockerfile, parse, yaml_documents

if TYPE_CHECKING:
    from router.config.settings import Config

MANIFESTS = sorted(KUBERNETES.glob("*.yaml"))
OLDEST_KUBERNETES = "1.28"
"""The oldest Kubernetes the manifests are checked against (and the newest kubernetes-validate has)."""


def _resources() -> dict[str, dict[str, Any]]:
    """kind -> the one resource of that kind."""
    found: dict[str, dict[str, Any]] = {}
    for path in MANIFESTS:
        for document in yaml_documents(path):
            assert document["kind"] not in found, f"two {document['kind']}s"
            found[document["kind"]] = document
    return found


RESOURCES = _resources()
DEPLOYMENT = RESOURCES["Deployment"]
POD = DEPLOYMENT["spec"]["template"]["spec"]
(CONTAINER,) = POD["containers"]
ROUTERD = parse([*dockerfile().entrypoint, *CONTAINER["args"]])


def _broker_xml(tmp_path: Path) -> Config:
    path = tmp_path / "broker.xml"
    path.write_text(RESOURCES["ConfigMap"]["data"]["broker.xml"])
    return load_config(str(path))


def _mount(path: str) -> dict[str, Any]:
    """The container's volume mount that holds `path`, and its volume (key `volume`)."""
    for mount in CONTAINER["volumeMounts"]:
        if PurePosixPath(path).is_relative_to(mount["mountPath"]):
            (volume,) = [v for v in POD["volumes"] if v["name"] == mount["name"]]
            return {**mount, "volume": volume}
    raise AssertionError(f"{path} is on no volume (the root file system is read-only)")


def test_kubernetes_manifests_are_the_expected_kinds() -> None:
    assert set(RESOURCES) == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, kubernetes_validate.latest_version()])
@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_kubernetes_manifest_validates_strictly(path: Path, version: str) -> None:
    for document in yaml_documents(path):
        kubernetes_validate.validate(document, version, strict=True)


def test_kubernetes_validation_would_catch_a_mistake() -> None:
    """Scenario: a misspelt field of the container's securityContext is reported."""
    broken = copy.deepcopy(DEPLOYMENT)
    context = broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    context["readOnlyRootFilesytem"] = context.pop("readOnlyRootFilesystem")
    with pytest.raises(kubernetes_validate.ValidationError, match="'readOnlyRootFilesytem' was unexpected"):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


def test_kubernetes_configmap_holds_a_configuration_routerd_loads(tmp_path: Path) -> None:
    config = _broker_xml(tmp_path)
    ports = {p["name"]: p["containerPort"] for p in CONTAINER["ports"]}
    assert {a.port for a in config.acceptors} == {ports["clients"]}
    assert all(a.host == "0.0.0.0" for a in config.acceptors)  # the pod's address, not its loopback
    (config_mount,) = [m for m in CONTAINER["volumeMounts"] if m["name"] == "config"]
    assert PurePosixPath(ROUTERD.config) == PurePosixPath(config_mount["mountPath"]) / "broker.xml"
    assert _mount(ROUTERD.config)["volume"]["configMap"]["name"] == RESOURCES["ConfigMap"]["metadata"]["name"]


def test_kubernetes_deployment_runs_routerd_as_documented() -> None:
    """The admin API is reachable by the kubelet, with tokens from the Secret; the state file is
    on a writable volume; two replicas of the Dockerfile's image and user."""
    assert DEPLOYMENT["spec"]["replicas"] == 2
    assert CONTAINER["image"].split("/")[-1].split(":")[0] == "connection-router"
    assert "command" not in CONTAINER  # the image's ENTRYPOINT, routerd, with these args
    host, port = ROUTERD.admin
    assert not is_loopback(host)
    assert ROUTERD.admin_tokens is not None
    tokens = _mount(ROUTERD.admin_tokens)
    assert tokens["volume"]["secret"]["secretName"] == "connection-router-admin"
    env = {e["name"]: e["value"] for e in CONTAINER["env"]}
    assert _mount(env["ROUTERCTL_TOKEN_FILE"])["name"] == tokens["name"]
    assert ROUTERD.state_file is not None
    assert "emptyDir" in _mount(ROUTERD.state_file)["volume"]
    assert {p["name"]: p["containerPort"] for p in CONTAINER["ports"]}["admin"] == port
    assert POD["securityContext"]["runAsUser"] == dockerfile().uid
    assert POD["securityContext"]["runAsNonRoot"] is True
    context = CONTAINER["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert {"requests", "limits"} <= set(CONTAINER["resources"])


def test_kubernetes_probes_are_readyz_and_healthz_on_the_admin_port() -> None:
    assert CONTAINER["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert CONTAINER["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}


def test_kubernetes_probes_outlast_what_the_health_checks_take_under_attack() -> None:
    """Scenario (issue #30): the health endpoints answer within 1 s while other clients hold the
    admin port (tests/router/test_routerd_admin_abuse.py); each probe's timeout leaves twice that,
    and a failed liveness check needs several in a row, so an attack cannot get the pod restarted."""
    for probe in ("readinessProbe", "livenessProbe"):
        assert CONTAINER[probe]["timeoutSeconds"] >= 2, probe
        assert CONTAINER[probe].get("failureThreshold", 3) >= 2, probe
    assert "httpHeaders" not in CONTAINER["livenessProbe"]["httpGet"]  # no token: none needed


def test_kubernetes_shutdown_fits_in_the_termination_grace_period() -> None:
    """preStop evacuates (routerctl shutdown, at most --timeout s), then SIGTERM gives the rest
    --grace-period: both within terminationGracePeriodSeconds."""
    command = CONTAINER["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:3] == ["routerctl", "shutdown", "--wait"]
    assert "--admin" not in command  # the default, http://127.0.0.1:9180: routerd's --admin port
    assert parse(["routerctl", "status"]).admin is None  # then $ROUTERCTL_ADMIN, else DEFAULT_ADMIN
    assert ("127.0.0.1", ROUTERD.admin[1]) == DEFAULT_ADMIN
    timeout = float(command[command.index("--timeout") + 1])
    assert POD["terminationGracePeriodSeconds"] > timeout + ROUTERD.grace_period


def test_kubernetes_service_and_budget_select_the_pods(tmp_path: Path) -> None:
    labels = DEPLOYMENT["spec"]["template"]["metadata"]["labels"]
    service = RESOURCES["Service"]["spec"]
    budget = RESOURCES["PodDisruptionBudget"]["spec"]
    for selector in (
        service["selector"],
        budget["selector"]["matchLabels"],
        DEPLOYMENT["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= labels.items()
    container_ports = {p["name"] for p in CONTAINER["ports"]}
    acceptor_ports = {a.port for a in _broker_xml(tmp_path).acceptors}
    assert {p["targetPort"] for p in service["ports"]} <= container_ports - {"admin"}  # clients only
    assert {p["port"] for p in service["ports"]} == acceptor_ports
    assert budget["maxUnavailable"] < DEPLOYMENT["spec"]["replicas"]
