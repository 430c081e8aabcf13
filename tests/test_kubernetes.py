"""deploy/kubernetes/*.yaml: valid against the Kubernetes API schemas, and wired together.

The schemas are kubernetes-validate's (pip ``kubernetes-validate``: the OpenAPI-derived JSON
schemas of every Kubernetes minor release, shipped in the wheel, resolved locally; the test
refuses network while it validates). No cluster runs here, so this is the check, with the
wiring the manifests rely on: labels and selectors, probes, the Secret reference, the HPA's
metrics and the settings the ConfigMap gives the API.
"""

from __future__ import annotations

import copy
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from quarry.settings import Settings

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((REPO / "deploy" / "kubernetes").glob("*.yaml"))
# The oldest release the manifests promise to fit (autoscaling/v2 and policy/v1 are GA since 1.23),
# and the newest the validator ships.
VERSIONS = ("1.29.0", "1.37.0")
KINDS = {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"}
# Set in the cluster from a Secret, never in a manifest.
SECRET_SETTINGS = {"QUARRY_DOCSTORE__URL"}


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    found = [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert found, "no manifests in deploy/kubernetes"
    return found


@pytest.fixture(scope="module")
def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = [doc["kind"] for doc in docs]
    assert len(kinds) == len(set(kinds)), f"one of each kind expected: {kinds}"
    return {doc["kind"]: doc for doc in docs}


@pytest.fixture()
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any socket connection fails: the schemas must come from the installed package."""

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise OSError("network refused by tests/test_kubernetes.py")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def validate(doc: dict[str, Any], version: str) -> None:
    """Strict validation (unknown fields are errors) against Kubernetes ``version``'s schemas."""
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (dev dependency) is not installed"
    )
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_example_is_complete(by_kind: dict[str, dict[str, Any]]) -> None:
    assert set(by_kind) == KINDS


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(docs: list[dict[str, Any]], version: str) -> None:
    for doc in docs:
        validate(doc, version)


@pytest.mark.usefixtures("no_network")
def test_the_validator_rejects_what_the_api_server_rejects(by_kind: dict[str, dict[str, Any]]) -> None:
    from kubernetes_validate import ValidationError

    deployment = copy.deepcopy(by_kind["Deployment"])
    deployment["spec"]["replicas"] = "two"
    hpa = copy.deepcopy(by_kind["HorizontalPodAutoscaler"])
    hpa["spec"]["metrics"][0]["pods"]["target"]["averageValu"] = "8"  # a typo: strict mode refuses it
    probe = copy.deepcopy(by_kind["Deployment"])
    del probe["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"]
    for bad in (deployment, hpa, probe):
        with pytest.raises(ValidationError):
            validate(bad, VERSIONS[-1])


def pod_labels(by_kind: dict[str, dict[str, Any]]) -> dict[str, str]:
    labels: dict[str, str] = by_kind["Deployment"]["spec"]["template"]["metadata"]["labels"]
    return labels


def container(by_kind: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (api,) = by_kind["Deployment"]["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = api
    return result


def test_the_deployment_runs_two_probed_replicas_with_resources(by_kind: dict[str, dict[str, Any]]) -> None:
    deployment = by_kind["Deployment"]
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels(by_kind).items()
    api = container(by_kind)
    assert api["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert api["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert api["startupProbe"]["httpGet"]["path"] == "/healthz"
    (port,) = api["ports"]
    assert port == {"name": "http", "containerPort": int(api["command"][-1])}
    assert {"cpu", "memory"} <= set(api["resources"]["requests"]) and "memory" in api["resources"]["limits"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_secrets_come_from_a_secret_and_are_never_in_clear(
    docs: list[dict[str, Any]], by_kind: dict[str, dict[str, Any]]
) -> None:
    assert not [doc for doc in docs if doc["kind"] == "Secret"], "ship no Secret: docs/kubernetes.md creates it"
    api = container(by_kind)
    env = {item["name"]: item for item in api["env"]}
    for name in SECRET_SETTINGS:
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["name"] and ref["key"] and "value" not in env[name]
        assert name not in by_kind["ConfigMap"]["data"]
    text = "\n".join(path.read_text() for path in MANIFESTS)
    assert "postgresql://" not in text.replace("postgresql://user:password@host:5432/db", ""), "a URL in clear"
    ((source,),) = [list(ref.values()) for ref in api["envFrom"]]
    assert source["name"] == by_kind["ConfigMap"]["metadata"]["name"]


def test_the_configmap_gives_replicas_a_shared_store(
    by_kind: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from quarry.api.browser import HostPolicy
    from quarry.api.workers import check_shareable

    for key in [k for k in os.environ if k.startswith("QUARRY_")]:
        monkeypatch.delenv(key)
    for key, value in by_kind["ConfigMap"]["data"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("QUARRY_DOCSTORE__URL", "postgresql://quarry:secret@postgres:5432/quarry_docstore")
    settings = Settings()  # every key is a setting the API reads (unknown ones would be ignored: check)
    for key in by_kind["ConfigMap"]["data"]:
        path = key.removeprefix("QUARRY_").lower().split("__")
        node: Any = settings
        for part in path:
            assert hasattr(node, part), f"{key} is not a Quarry setting"
            node = getattr(node, part)
    check_shareable(settings)  # a store server, not Milvus Lite / Qdrant edge
    assert settings.data_dir == Path(container(by_kind)["volumeMounts"][0]["mountPath"])
    policy = HostPolicy.from_settings(settings.api)
    service = by_kind["Service"]["metadata"]["name"]
    for host in (f"{service}:8080", f"{service}.default.svc:8080", f"{service}.search.svc.cluster.local:8080"):
        assert policy.allows(host, None), host
    assert policy.allows("10.1.2.3:8080", "10.1.2.3")  # kubelet probes and Prometheus use the pod IP


def test_the_service_and_budget_select_the_pods(by_kind: dict[str, dict[str, Any]]) -> None:
    labels = pod_labels(by_kind)
    service = by_kind["Service"]
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == container(by_kind)["ports"][0]["name"]
    budget = by_kind["PodDisruptionBudget"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # a drain can always proceed: fewer must stay than the HPA ever runs
    assert budget["spec"]["minAvailable"] < by_kind["HorizontalPodAutoscaler"]["spec"]["minReplicas"]


def test_the_hpa_scales_on_in_flight_requests_and_cpu(by_kind: dict[str, dict[str, Any]]) -> None:
    from prometheus_client import REGISTRY

    import quarry.metrics  # noqa: F401  (registers the gauges)

    hpa = by_kind["HorizontalPodAutoscaler"]
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", by_kind["Deployment"]["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 2
    pods, resource = hpa["spec"]["metrics"]
    assert pods["type"] == "Pods" and pods["pods"]["target"]["type"] == "AverageValue"
    name = pods["pods"]["metric"]["name"]
    assert name == "quarry_requests_in_flight"
    assert REGISTRY.get_sample_value(name) is not None, f"{name} is not a metric the API exports"
    assert resource["type"] == "Resource" and resource["resource"]["name"] == "cpu"
    assert "cpu" in container(by_kind)["resources"]["requests"]  # utilisation needs a request
    # the adapter rule the doc gives serves the same metric name
    doc = (REPO / "docs" / "kubernetes.md").read_text()
    assert f'as: "{name}"' in doc and "seriesQuery: 'quarry_requests_in_flight" in doc
