"""The Kubernetes manifests (deploy/kubernetes/) are valid for a pinned Kubernetes and agree
with the code they deploy.

Offline: `kubernetes-validate` carries the Kubernetes API schemas, and every built-in object
is validated strictly (an unknown field fails) against `KUBERNETES_VERSION`. KEDA's
ScaledObject is a custom resource with no schema there: its fields are checked against
KEDA's documented `nats-jetstream` trigger and against the names `provision` creates.
Then the agreements no schema can see: every `AIPD_*` variable is a setting of the process
it configures, probes hit the ports and paths the processes serve, the grace period covers
the drain, the autoscalers aim at the workers' concurrency.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from subjects.grammar import Subjects
from worker.gateway.settings import GatewaySettings
from worker.settings import Settings

KUBERNETES_VERSION = "1.34.0"
ROOT = Path(__file__).parents[2] / "deploy" / "kubernetes"
ENDPOINT = "hermes-1"


def _documents(directory: Path) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text("utf-8")) if doc)
    return docs


BASE = _documents(ROOT)
KEDA = _documents(ROOT / "keda")
HPA = _documents(ROOT / "hpa")


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _config(name: str) -> dict[str, str]:
    data: dict[str, str] = _one(BASE, "ConfigMap", name)["data"]
    return data


@pytest.mark.parametrize(
    "doc", BASE + HPA, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}"
)
def test_every_builtin_object_is_valid_for_the_pinned_kubernetes(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("directory", [ROOT, ROOT / "keda", ROOT / "hpa"])
def test_every_kustomization_lists_exactly_its_files(directory: Path) -> None:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text("utf-8"))
    listed = {r for r in kustomization["resources"] if r != "../"}
    present = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def _variables(settings: type[Any]) -> set[str]:
    return {f"AIPD_{name.upper()}" for name in settings.model_fields}


def test_every_variable_is_a_setting_of_the_process_it_configures() -> None:
    assert set(_config("aip-worker-env")) <= _variables(Settings)
    # The gateway takes its NATS credentials as a worker does (`gateway.app.connect_nats`).
    nats_credentials = {v for v in _variables(Settings) if v.startswith("AIPD_NATS_")}
    assert set(_config("aip-gateway-env")) <= _variables(GatewaySettings) | nats_credentials
    job = _one(BASE, "Job", "aip-provision")["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"] for e in job["env"]} <= _variables(Settings)


def _container(name: str) -> dict[str, Any]:
    container: dict[str, Any] = _one(BASE, "Deployment", name)["spec"]["template"]["spec"][
        "containers"
    ][0]
    return container


def test_the_worker_is_probed_where_it_serves_and_drains_before_it_is_killed() -> None:
    env = _config("aip-worker-env")
    worker = _container("aip-worker")
    [port] = worker["ports"]
    assert port["containerPort"] == int(env["AIPD_METRICS_PORT"])
    assert worker["livenessProbe"]["httpGet"]["path"] == "/health"
    assert worker["readinessProbe"]["httpGet"]["path"] == "/ready"
    spec = _one(BASE, "Deployment", "aip-worker")["spec"]
    grace = spec["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= float(env["AIPD_SHUTDOWN_GRACE_S"]) + 10
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert _one(BASE, "PodDisruptionBudget", "aip-worker")["spec"]["maxUnavailable"] == 1


def test_the_gateway_is_probed_where_it_serves_and_reachable_by_its_allowed_host() -> None:
    env = _config("aip-gateway-env")
    gateway = _container("aip-gateway")
    [port] = gateway["ports"]
    assert port["containerPort"] == int(env["AIPD_GATEWAY_PORT"])
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"
    service = _one(BASE, "Service", "aip-gateway")
    host = f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    assert host in env["AIPD_MCP_ALLOWED_HOSTS"].split(",")


def test_every_secret_file_a_setting_names_is_under_the_entrypoint_s_copy() -> None:
    """Settings name /run/aip/… files; the entrypoint copies the Secret mounted at
    /run/secrets there (compose/entrypoint.sh), so each workload mounts it there."""
    for name in ("aip-worker", "aip-gateway"):
        mounts = {m["mountPath"] for m in _container(name)["volumeMounts"]}
        assert {"/run/secrets", "/run/aip", "/etc/aip"} <= mounts, name


def test_the_scaled_object_follows_the_work_consumer_provision_creates() -> None:
    [scaled] = KEDA
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == "aip-worker"
    assert spec["minReplicaCount"] >= 1  # never to zero (docs/kubernetes.md)
    [trigger] = spec["triggers"]
    assert trigger["type"] == "nats-jetstream"
    metadata = trigger["metadata"]
    documented = {
        "natsServerMonitoringEndpoint", "account", "stream", "consumer",
        "lagThreshold", "activationLagThreshold", "useHttps",
    }  # fmt: skip
    assert set(metadata) <= documented
    assert all(isinstance(value, str) for value in metadata.values())  # KEDA reads strings
    subjects = Subjects()
    assert metadata["stream"] == subjects.stream_name("actions")
    assert metadata["consumer"] == subjects.durable(ENDPOINT, "actions")
    assert metadata["lagThreshold"] == _config("aip-worker-env")["AIPD_CONCURRENCY"]


def test_the_hpa_aims_at_the_worker_concurrency() -> None:
    [hpa] = HPA
    [metric] = hpa["spec"]["metrics"]
    assert metric["external"]["target"]["averageValue"] == _config("aip-worker-env")[
        "AIPD_CONCURRENCY"
    ]
    assert hpa["spec"]["scaleTargetRef"]["name"] == "aip-worker"
    assert hpa["spec"]["minReplicas"] >= 1
