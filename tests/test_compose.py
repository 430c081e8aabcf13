"""docker-compose.yml: valid against the Compose specification's JSON schema, every service
healthchecked, every dependency waited for until healthy, and the wiring the API relies on.

Docker cannot run here, so this is the check: the schema (vendored in tests/data, see
tests/data/compose-spec.SOURCE.md) and the contents the stack needs.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from quarry.settings import Settings

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "tests" / "data" / "compose-spec.schema.json"
REPLICAS = ("api-1", "api-2")
SERVICES = {"triton", "etcd", "minio", "milvus", "qdrant", "postgres", "vllm", *REPLICAS, "lb", "prometheus", "grafana"}
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
    bad["services"]["api-1"]["depends_on"]["qdrant"] = {"conditon": "service_healthy"}
    bad["services"]["qdrant"]["healthcheck"]["interval"] = 10
    bad["services"]["postgres"]["restart_policy"] = "always"
    found = {tuple(e.absolute_path)[:3] for e in validator().iter_errors(bad)}
    assert ("services", "api-1", "depends_on") in found
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
    for replica in REPLICAS:
        assert set(services[replica]["depends_on"]) == {"triton", "milvus", "qdrant", "postgres"}, replica
    assert set(services["lb"]["depends_on"]) == set(REPLICAS)


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


@pytest.mark.parametrize("replica", REPLICAS)
def test_the_api_environment_maps_onto_settings(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, replica: str
) -> None:
    api = services[replica]
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

    vllm, api = services["vllm"], services["api-1"]
    assert interpolate(vllm["image"]).startswith("vllm/vllm-openai:v")
    args = [interpolate(a) for a in vllm["command"]]
    flags = dict(a.removeprefix("--").split("=", 1) for a in args if "=" in a)
    assert "--enable-prefix-caching" in args and flags["host"] == "0.0.0.0"
    base, model = parse_url(interpolate(api["environment"]["QUARRY_LLM__URL"]))
    assert base == f"http://vllm:{flags['port']}/v1" and model == flags["model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert f"http://127.0.0.1:{flags['port']}/health" in " ".join(vllm["healthcheck"]["test"])
    (device,) = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    for replica in REPLICAS:  # search serves while the model loads; answers degrade
        assert "vllm" not in services[replica]["depends_on"]
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

    prometheus, grafana = services["prometheus"], services["grafana"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    (quarry,) = [job for job in config["scrape_configs"] if job["job_name"] == "quarry"]
    # each replica scraped on its own, not through the balancer (which would pick one at random)
    targets = quarry["static_configs"][0]["targets"]
    assert sorted(t.split(":")[0] for t in targets) == sorted(REPLICAS)
    for target in targets:
        host, port = target.split(":")
        api = services[host]
        assert api["command"][-2:] == ["--port", port]
        # the replica answers Prometheus' Host: its own service name is an allowed host name
        monkeypatch.setenv("QUARRY_API__ALLOWED_HOSTS", interpolate(api["environment"]["QUARRY_API__ALLOWED_HOSTS"]))
        assert HostPolicy.from_settings(Settings().api).allows(target, None), target
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro" in grafana["volumes"]
    datasource = yaml.safe_load((REPO / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = datasource["datasources"]
    assert source["url"] == "http://prometheus:9090" and source["uid"] == "prometheus"
    provider = yaml.safe_load((REPO / "deploy/grafana/provisioning/dashboards/quarry.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    dashboard = json.loads((REPO / "deploy/grafana/dashboards/quarry.json").read_text())
    assert {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]} == {"prometheus"}


# --- Replicas behind the load balancer -----------------------------------------------------------

NGINX = REPO / "deploy" / "nginx" / "nginx.conf"
_SIZE = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def nginx_blocks(text: str) -> dict[str, list[list[str]]]:
    """nginx.conf's directives per innermost block (``upstream quarry_api``, ``location /``, ...).

    A reader of the subset deploy/nginx/nginx.conf uses: ``#`` comments, ``name args;`` and
    ``head {`` ... ``}``; quoted strings are kept whole. Returns ``{block head: [[name, *args]]}``,
    the top level under ``""``.
    """
    tokens = re.findall(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[{};]|[^\s{};]+", re.sub(r"#[^\n]*", "", text))
    blocks: dict[str, list[list[str]]] = {"": []}
    stack, words = [""], []
    for token in tokens:
        if token == "{":
            stack.append(" ".join(words))
            blocks.setdefault(stack[-1], [])
            words = []
        elif token == "}":
            stack.pop()
        elif token == ";":
            blocks[stack[-1]].append(words)
            words = []
        else:
            words.append(token)
    assert stack == [""], "unbalanced braces"
    return blocks


def directive(block: list[list[str]], name: str) -> list[list[str]]:
    """Every ``name ...;`` of one block, as its arguments."""
    return [d[1:] for d in block if d[0] == name]


def replica_settings(service: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a replica's container starts with (compose defaults, nothing else set)."""
    for key in [k for k in os.environ if k.startswith("QUARRY_")]:
        monkeypatch.delenv(key)
    for key, value in service["environment"].items():
        monkeypatch.setenv(key, interpolate(str(value)))
    return Settings()


@pytest.fixture(scope="module")
def nginx() -> dict[str, list[list[str]]]:
    return nginx_blocks(NGINX.read_text())


def test_the_replicas_are_one_definition_with_their_own_data(services: dict[str, dict[str, Any]]) -> None:
    first, *others = (services[r] for r in REPLICAS)
    for other in others:
        for key in ("image", "command", "environment", "healthcheck", "depends_on"):
            assert other[key] == first[key], key
    data = [next(v for v in services[r]["volumes"] if v.endswith(":/data")) for r in REPLICAS]
    assert len(set(data)) == len(REPLICAS), f"replicas share a data dir: {data}"
    for replica in REPLICAS:
        assert "ports" not in services[replica], f"{replica}: only the balancer is published"
        assert "/readyz" in " ".join(services[replica]["healthcheck"]["test"])
    assert services["lb"]["ports"] == ["8080:8080"]
    assert "http://127.0.0.1:8080/readyz" in services["lb"]["healthcheck"]["test"]


@pytest.mark.parametrize("replica", REPLICAS)
def test_every_replica_uses_the_shared_docstore_and_a_store_server(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, replica: str
) -> None:
    from urllib.parse import urlsplit

    from quarry.api.workers import check_shareable

    settings = replica_settings(services[replica], monkeypatch)
    check_shareable(settings)  # raises ConfigError on Milvus Lite / Qdrant edge / a SQLite docstore
    store = urlsplit(settings.store_url)
    assert store.scheme == "milvus" and store.hostname in services, settings.store_url
    docstore = urlsplit(settings.docstore.url)
    postgres = services["postgres"]
    assert docstore.scheme == "postgresql" and docstore.hostname == "postgres" and docstore.port == 5432
    assert docstore.username == postgres["environment"]["POSTGRES_USER"]
    assert docstore.password == interpolate(postgres["environment"]["POSTGRES_PASSWORD"])
    # its database is created by the postgres image's init scripts, mounted from deploy/postgres/initdb
    (mount,) = [v for v in postgres["volumes"] if ":/docker-entrypoint-initdb.d" in v]
    initdb = REPO / mount.split(":")[0]
    created = re.findall(r"CREATE DATABASE (\w+)", " ".join(p.read_text() for p in sorted(initdb.glob("*.sql"))))
    assert docstore.path.lstrip("/") in created, (docstore.path, created)
    assert docstore.path.lstrip("/") != postgres["environment"]["POSTGRES_DB"], "docstore beside the pgvector store"


def test_the_balancer_upstreams_are_the_replicas(
    services: dict[str, dict[str, Any]], nginx: dict[str, list[list[str]]]
) -> None:
    assert "./deploy/nginx/nginx.conf:/etc/nginx/nginx.conf:ro" in services["lb"]["volumes"]
    (server,) = [nginx[head] for head in nginx if head.startswith("server")]
    assert directive(server, "listen") == [["8080"]]
    (upstream,) = [head.split()[1] for head in nginx if head.startswith("upstream ")]
    servers = [args[0] for args in directive(nginx[f"upstream {upstream}"], "server")]
    assert sorted(servers) == sorted(f"{r}:{services[r]['command'][-1]}" for r in REPLICAS)
    assert directive(nginx["location /"], "proxy_pass") == [[f"http://{upstream}"]]


def test_the_balancer_passes_request_ids_and_hosts_the_replicas_allow(
    services: dict[str, dict[str, Any]], nginx: dict[str, list[list[str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from quarry.api.browser import HostPolicy

    location = nginx["location /"]
    headers = {args[0].lower(): args[1] for args in directive(location, "proxy_set_header")}
    # the client's id when it sends one, else nginx's $request_id (32 hex: a safe id the API keeps)
    assert headers["x-request-id"] == "$quarry_request_id"
    (mapping,) = [nginx[h] for h in nginx if h.startswith("map $http_x_request_id $quarry_request_id")]
    assert {d[0]: d[1] for d in mapping} == {"default": "$http_x_request_id", '""': "$request_id"}
    assert headers["host"] == "$host"
    for replica in REPLICAS:
        policy = HostPolicy.from_settings(replica_settings(services[replica], monkeypatch).api)
        # loopback (healthchecks, a client on the host's published port), the balancer's name
        # (another container calling http://lb:8080) and the replica's own (Prometheus)
        for host in ("localhost:8080", "127.0.0.1:8080", "lb:8080", f"{replica}:8080"):
            assert policy.allows(host, None), (replica, host)
        assert not policy.allows("evil.example:8080", None)


def test_the_balancer_body_limit_and_timeouts_match_the_api(
    services: dict[str, dict[str, Any]], nginx: dict[str, list[list[str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    (server,) = [nginx[head] for head in nginx if head.startswith("server")]
    ((size,),) = directive(server, "client_max_body_size")
    match = re.fullmatch(r"(\d+)([kmg]?)", size.lower())
    assert match, size
    number, unit = match.groups()
    settings = [replica_settings(services[r], monkeypatch) for r in REPLICAS]
    assert {s.api.max_body_bytes for s in settings} == {int(number) * _SIZE[unit]}
    # nginx's own 413 carries the API's error envelope
    (payload,) = [h for h in nginx if h == "location @payload_too_large"]
    ((status, body),) = directive(nginx[payload], "return")
    error = json.loads(body.strip("'").replace("\\'", "'"))["error"]
    assert status == "413" and error["type"] == "PayloadTooLarge" and error["retryable"] is False
    assert f"{settings[0].api.max_body_bytes:,} bytes" in error["message"]
    location = nginx["location /"]

    def seconds(name: str) -> float:
        ((value,),) = directive(location, name)
        return float(value.removesuffix("s"))

    assert seconds("proxy_connect_timeout") <= 10
    # a non-streamed answer may take the LLM's whole budget; the balancer must not cut it first
    assert seconds("proxy_read_timeout") > max(s.llm.total_timeout_s for s in settings)
    assert directive(location, "proxy_buffering") == [["off"]]  # answer streams flow token by token
    assert directive(location, "proxy_http_version") == [["1.1"]]
