"""deploy/kubernetes/: every manifest is valid Kubernetes (the API's JSON schemas, strict: no
unknown field; the ServiceMonitor, a custom resource they do not have, by the fields of the
Prometheus Operator's CRD it uses), and the manifests agree with routerd and with each other: the
ConfigMap's broker.xml loads, the probes reach /readyz and /healthz on the admin port, the preStop
hook and the grace periods fit, the Services and the PodDisruptionBudget select the pods, the
ServiceMonitor scrapes /metrics on routerd's admin port with a token from a Secret, and the
Secrets are the ones docs/operations.md says how to create."""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import kubernetes_validate
import pytest

from router.config import load_config
from router.core.admin_access import is_loopback
from router.ctl_client import DEFAULT_ADMIN
from tests.deploy.conftest import KUBERNETES, ROOT, dockerfile, parse, yaml_documents

if TYPE_CHECKING:
    from router.config.settings import Config

MANIFESTS = sorted(KUBERNETES.glob("*.yaml"))
OLDEST_KUBERNETES = "1.28"
"""The oldest Kubernetes the manifests are checked against (and the newest kubernetes-validate has)."""


CUSTOM_KINDS = {"ServiceMonitor"}
"""Kinds of custom resources (CRDs), which the Kubernetes schemas do not have."""


def _resources() -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> the resource."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in MANIFESTS:
        for document in yaml_documents(path):
            key = (document["kind"], document["metadata"]["name"])
            assert key not in found, f"two {key}"
            found[key] = document
    return found


RESOURCES = _resources()
DEPLOYMENT = RESOURCES["Deployment", "connection-router"]
CONFIGMAP = RESOURCES["ConfigMap", "connection-router-config"]
SERVICE = RESOURCES["Service", "connection-router"]
METRICS_SERVICE = RESOURCES["Service", "connection-router-metrics"]
SERVICE_MONITOR = RESOURCES["ServiceMonitor", "connection-router"]
POD = DEPLOYMENT["spec"]["template"]["spec"]
(CONTAINER,) = POD["containers"]
ROUTERD = parse([*dockerfile().entrypoint, *CONTAINER["args"]])
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()


def _broker_xml(tmp_path: Path) -> Config:
    path = tmp_path / "broker.xml"
    path.write_text(CONFIGMAP["data"]["broker.xml"])
    return load_config(str(path))


def _mount(path: str) -> dict[str, Any]:
    """The container's volume mount that holds `path`, and its volume (key `volume`)."""
    for mount in CONTAINER["volumeMounts"]:
        if PurePosixPath(path).is_relative_to(mount["mountPath"]):
            (volume,) = [v for v in POD["volumes"] if v["name"] == mount["name"]]
            return {**mount, "volume": volume}
    raise AssertionError(f"{path} is on no volume (the root file system is read-only)")


def test_kubernetes_manifests_are_the_expected_kinds() -> None:
    assert {kind for kind, _ in RESOURCES} == {
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ServiceMonitor",
    }


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, kubernetes_validate.latest_version()])
@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_kubernetes_manifest_validates_strictly(path: Path, version: str) -> None:
    documents = [d for d in yaml_documents(path) if d["kind"] not in CUSTOM_KINDS]
    for document in documents:
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
    assert _mount(ROUTERD.config)["volume"]["configMap"]["name"] == CONFIGMAP["metadata"]["name"]


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
    service = SERVICE["spec"]
    budget = RESOURCES["PodDisruptionBudget", "connection-router"]["spec"]
    for selector in (
        service["selector"],
        METRICS_SERVICE["spec"]["selector"],
        budget["selector"]["matchLabels"],
        DEPLOYMENT["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= labels.items()
    container_ports = {p["name"] for p in CONTAINER["ports"]}
    acceptor_ports = {a.port for a in _broker_xml(tmp_path).acceptors}
    assert {p["targetPort"] for p in service["ports"]} <= container_ports - {"admin"}  # clients only
    assert {p["port"] for p in service["ports"]} == acceptor_ports
    assert budget["maxUnavailable"] < DEPLOYMENT["spec"]["replicas"]


SERVICE_MONITOR_ENDPOINT_FIELDS = {
    "port",
    "targetPort",
    "path",
    "scheme",
    "interval",
    "scrapeTimeout",
    "authorization",
    "tlsConfig",
    "honorLabels",
    "relabelings",
    "metricRelabelings",
}
"""Fields of a ServiceMonitor endpoint (monitoring.coreos.com/v1, the Prometheus Operator's CRD),
those a manifest of ours may use: a misspelt one would be dropped by the API server unseen."""


def test_kubernetes_service_monitor_has_the_crds_shape() -> None:
    """The ServiceMonitor by the CRD's rules it relies on: the group and version, a label selector,
    each endpoint's known fields, a Bearer token from a Secret's key (`authorization`; the
    deprecated `bearerTokenSecret` not used)."""
    assert SERVICE_MONITOR["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(SERVICE_MONITOR["spec"]) == {"selector", "endpoints"}
    assert set(SERVICE_MONITOR["spec"]["selector"]) == {"matchLabels"}
    (endpoint,) = SERVICE_MONITOR["spec"]["endpoints"]
    assert set(endpoint) <= SERVICE_MONITOR_ENDPOINT_FIELDS, set(endpoint) - SERVICE_MONITOR_ENDPOINT_FIELDS
    assert endpoint["authorization"]["type"] == "Bearer"
    assert set(endpoint["authorization"]["credentials"]) == {"name", "key"}
    for duration in ("interval", "scrapeTimeout"):
        assert re.fullmatch(r"\d+s", endpoint[duration]), endpoint[duration]
    assert int(endpoint["scrapeTimeout"][:-1]) <= int(endpoint["interval"][:-1])


def test_kubernetes_service_monitor_scrapes_metrics_on_routerds_admin_port() -> None:
    """ServiceMonitor -> the metrics Service (by its labels and port name) -> the container's port
    (by name) -> routerd's --admin port; /metrics over plain HTTP, as routerd serves it. The
    clients' Service is not selected (clients never reach the admin API)."""
    selector = SERVICE_MONITOR["spec"]["selector"]["matchLabels"]
    selected = [
        resource
        for (kind, _), resource in RESOURCES.items()
        if kind == "Service" and selector.items() <= resource["metadata"]["labels"].items()
    ]
    assert selected == [METRICS_SERVICE]
    (endpoint,) = SERVICE_MONITOR["spec"]["endpoints"]
    (port,) = [p for p in METRICS_SERVICE["spec"]["ports"] if p["name"] == endpoint["port"]]
    (container_port,) = [p for p in CONTAINER["ports"] if p["name"] == port["targetPort"]]
    assert container_port["containerPort"] == ROUTERD.admin[1] == port["port"]
    assert (endpoint["path"], endpoint["scheme"]) == ("/metrics", "http")
    assert METRICS_SERVICE["spec"]["clusterIP"] == "None"  # each pod its own target
    assert port["targetPort"] not in {p["targetPort"] for p in SERVICE["spec"]["ports"]}


def test_kubernetes_metrics_token_is_a_user_token_of_its_own_secret() -> None:
    """The admin API needs a token for /metrics (it listens on the pod's address): the
    ServiceMonitor's comes from a Secret apart from the one holding routerd's tokens file (the
    operator reads it into Prometheus's configuration), and the docs make it of level `user`."""
    (endpoint,) = SERVICE_MONITOR["spec"]["endpoints"]
    credentials = endpoint["authorization"]["credentials"]
    assert ROUTERD.admin_tokens is not None
    tokens_secret = _mount(ROUTERD.admin_tokens)["volume"]["secret"]["secretName"]
    assert credentials["name"] != tokens_secret
    assert re.search(r"prometheus user %s", OPERATIONS), "the docs make the metrics token of level user"


def _documented_secrets() -> dict[str, set[str]]:
    """Secret name -> its keys, from docs/operations.md's `kubectl create secret generic` lines."""
    secrets: dict[str, set[str]] = {}
    for line in OPERATIONS.splitlines():
        if not line.startswith("kubectl create secret generic "):
            continue
        words = shlex.split(line)
        keys = {w.split("=", 1)[1].split("=")[0] for w in words if w.startswith("--from-file=")}
        secrets[words[4]] = {Path(key).name for key in keys}
    return secrets


def test_kubernetes_secrets_the_manifests_use_are_the_documented_ones() -> None:
    """Every Secret key a manifest reads is created by docs/operations.md's commands."""
    documented = _documented_secrets()
    used: dict[str, set[str]] = {}
    (endpoint,) = SERVICE_MONITOR["spec"]["endpoints"]
    credentials = endpoint["authorization"]["credentials"]
    used.setdefault(credentials["name"], set()).add(credentials["key"])
    assert ROUTERD.admin_tokens is not None
    tokens = _mount(ROUTERD.admin_tokens)
    env = {e["name"]: e["value"] for e in CONTAINER["env"]}
    for path in (ROUTERD.admin_tokens, env["ROUTERCTL_TOKEN_FILE"]):
        mount = _mount(path)
        assert mount["name"] == tokens["name"]
        used.setdefault(mount["volume"]["secret"]["secretName"], set()).add(PurePosixPath(path).name)
    assert len(used) == 2
    for name, keys in used.items():
        assert keys <= documented.get(name, set()), (name, keys, documented)
