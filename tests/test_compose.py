"""docker-compose.yml: valid against the Compose specification's JSON schema, every service
healthchecked, every dependency waited for until healthy, and the wiring the API relies on.

Docker cannot run here, so this is the check: the schema (vendored in tests/data, see
tests/data/compose-spec.SOURCE.md) and the contents the stack needs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from quarry.settings import Settings

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "tests" / "data" / "compose-spec.schema.json"
SERVICES = {"triton", "etcd", "minio", "milvus", "qdrant", "postgres", "vllm", "api", "prometheus", "grafana"}
_VAR = re.compile(r"\$\{(?P<name>[A-Z0-9_]+)(?::-(?P<default>[^}]*))?\}")


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def interpolate(value: str) -> str:
    """Compose's ``${NAME:-default}`` with nothing set in the environment: the defaults."""
    return _VAR.sub(lambda m: m.group("default") or "", value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose["services"]
    return result


def test_the_file_is_valid_against_the_compose_schema(compose: dict[str, Any]) -> None:
    errors = sorted(validator().iter_errors(compose), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_the_schema_rejects_what_compose_rejects(compose: dict[str, Any]) -> None:
    bad = json.loads(json.dumps(compose))
    bad["services"]["api"]["depends_on"]["qdrant"] = {"conditon": "service_healthy"}
    bad["services"]["qdrant"]["healthcheck"]["interval"] = 10
    bad["services"]["postgres"]["restart_policy"] = "always"
    found = {tuple(e.absolute_path)[:3] for e in validator().iter_errors(bad)}
    assert ("services", "api", "depends_on") in found
    assert ("services", "qdrant", "healthcheck") in found
    assert ("services", "postgres") in found


def test_the_production_stack_is_complete(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == SERVICES


def test_every_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        check = service.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        assert not check.get("disable"), f"{name} disables its healthcheck"
        assert isinstance(check["test"], list) and check["test"][0] in ("CMD", "CMD-SHELL"), name


def test_every_dependency_is_waited_for_until_healthy(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        depends_on = service.get("depends_on", {})
        assert isinstance(depends_on, dict), f"{name}: depends_on must name a condition"
        for target, spec in depends_on.items():
            assert target in services, f"{name} depends on unknown service {target}"
            assert spec["condition"] == "service_healthy", f"{name} -> {target}"
    assert set(services["milvus"]["depends_on"]) == {"etcd", "minio"}
    assert set(services["api"]["depends_on"]) == {"triton", "milvus", "qdrant", "postgres"}


def test_triton_serves_the_model_repository_on_a_gpu(services: dict[str, dict[str, Any]]) -> None:
    triton = services["triton"]
    base = interpolate(triton["build"]["dockerfile_inline"]).splitlines()[0]
    assert re.fullmatch(r"FROM nvcr\.io/nvidia/tritonserver:\d\d\.\d\d-py3", base), base
    assert triton["command"][:2] == ["tritonserver", "--model-repository=/models"]
    assert "./model_repository:/models:ro" in triton["volumes"]
    assert {p.split(":")[0] for p in triton["ports"]} == {"8000", "8001", "8002"}
    assert "http://localhost:8000/v2/health/ready" in triton["healthcheck"]["test"]
    (device,) = triton["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]


def test_milvus_standalone_uses_etcd_and_minio(services: dict[str, dict[str, Any]]) -> None:
    milvus = services["milvus"]
    assert milvus["image"].startswith("milvusdb/milvus:v2.5.")
    assert milvus["command"] == ["milvus", "run", "standalone"]
    assert milvus["environment"]["ETCD_ENDPOINTS"] == "etcd:2379"
    assert milvus["environment"]["MINIO_ADDRESS"] == "minio:9000"
    assert "http://localhost:9091/healthz" in milvus["healthcheck"]["test"]


def test_qdrant_and_postgres_health(services: dict[str, dict[str, Any]]) -> None:
    qdrant, postgres = services["qdrant"], services["postgres"]
    assert interpolate(qdrant["image"]).startswith("qdrant/qdrant:v1.")
    assert "/readyz" in " ".join(qdrant["healthcheck"]["test"])
    assert postgres["image"] in ("pgvector/pgvector:pg17", "pgvector/pgvector:pg18")
    assert postgres["healthcheck"]["test"][1] == "pg_isready"


def test_the_api_environment_maps_onto_settings(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    api = services["api"]
    env = {key: interpolate(str(value)) for key, value in api["environment"].items()}
    assert env["QUARRY_EMBEDDING__URL"] == "triton+grpc://triton:8001/minilm"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.store.url == env["QUARRY_STORE__URL"] == "milvus://milvus:19530"
    assert settings.embedding.url == "triton+grpc://triton:8001/minilm"
    assert settings.rerank.model == ""
    assert settings.environment == "production"
    assert settings.data_dir == Path("/data")
    assert api["command"][:4] == ["quarry", "serve", "--host", "0.0.0.0"]
    assert settings.llm.url == "openai+http://vllm:8000/v1?model=Qwen/Qwen2.5-7B-Instruct"


def test_vllm_serves_the_model_the_api_asks_for_on_a_gpu(services: dict[str, dict[str, Any]]) -> None:
    from generation.openai_compat import parse_url

    vllm, api = services["vllm"], services["api"]
    assert interpolate(vllm["image"]).startswith("vllm/vllm-openai:v")
    args = [interpolate(a) for a in vllm["command"]]
    flags = dict(a.removeprefix("--").split("=", 1) for a in args if "=" in a)
    assert "--enable-prefix-caching" in args and flags["host"] == "0.0.0.0"
    base, model = parse_url(interpolate(api["environment"]["QUARRY_LLM__URL"]))
    assert base == f"http://vllm:{flags['port']}/v1" and model == flags["model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert f"http://127.0.0.1:{flags['port']}/health" in " ".join(vllm["healthcheck"]["test"])
    (device,) = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert "vllm" not in api["depends_on"]  # search serves while the model loads; answers degrade
    hosts = [p.split(":")[0] for svc in services.values() for p in svc.get("ports", [])]
    assert len(hosts) == len(set(hosts)), f"host ports clash: {sorted(hosts)}"


def test_the_api_image_is_built_with_cpu_torch() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "--index-url https://download.pytorch.org/whl/cpu torch" in dockerfile
    assert 'pip install ".[all]"' in dockerfile
    assert 'CMD ["quarry", "serve", "--host", "0.0.0.0", "--port", "8080"]' in dockerfile
    for package in ("quarry", "retrieval", "indexing", "embedding", "rerank", "generation", "stores", "eval"):
        assert f"COPY {package} ./{package}" in dockerfile


def test_prometheus_scrapes_the_api_and_grafana_shows_its_dashboard(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from quarry.api.browser import HostPolicy

    prometheus, grafana, api = services["prometheus"], services["grafana"], services["api"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    (quarry,) = [job for job in config["scrape_configs"] if job["job_name"] == "quarry"]
    (target,) = quarry["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert api["command"][-2:] == ["--port", port] and host == "api"
    # the API answers Prometheus' Host: "api" is an allowed host name
    monkeypatch.setenv("QUARRY_API__ALLOWED_HOSTS", interpolate(api["environment"]["QUARRY_API__ALLOWED_HOSTS"]))
    assert HostPolicy.from_settings(Settings().api).allows(target, None)
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro" in grafana["volumes"]
    datasource = yaml.safe_load((REPO / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = datasource["datasources"]
    assert source["url"] == "http://prometheus:9090" and source["uid"] == "prometheus"
    provider = yaml.safe_load((REPO / "deploy/grafana/provisioning/dashboards/quarry.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    dashboard = json.loads((REPO / "deploy/grafana/dashboards/quarry.json").read_text())
    assert {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]} == {"prometheus"}
