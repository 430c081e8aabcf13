"""Metrics, traces and logs of a real service: Milvus Lite, the packaged MiniLM, the tiny cross-encoder.

What a scrape of ``/metrics`` holds after a hybrid + rerank search (each stage's histogram with its
labels), the degraded-answer counter (a real Triton client pointed at a closed port; an LLM
client pointed at another), the spans of a search (the SDK's in-memory exporter), the request
id in responses and log lines, and that no query, document text or key reaches a log line.
"""

from __future__ import annotations

import io
import json
import logging
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
import yaml
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from embedding.triton import TritonEmbedder
from indexing.document_rules import SourceDocument
from quarry import tracing
from quarry.api import create_app
from quarry.logs import uvicorn_log_config
from quarry.service import Quarry
from quarry.settings import Settings, TracingSettings
from rerank.cross_encoder import CrossEncoderReranker
from rerank.tiny import build_tiny_cross_encoder
from tests.core.conftest import CountingEmbedder
from tests.llama import llama_settings
from tests.serve import free_port

COLLECTION = "obs_docs"
STAGES = ("embed", "bm25", "ann", "fusion", "rerank", "hydrate")
SECRET_TEXT = "zyxquorblflux"  # in a document's text and in the queries: never in a log line
SECRET_KEY = "sk-quarry-test-secret-4711"
SEARCH = f"/v1/collections/{COLLECTION}/search"
HYBRID_RERANK = {"query": "vitamin D deficiency", "mode": "hybrid", "top_k": 5, "rerank": {"top_n": 10}}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def data_dir(
    tmp_path_factory: pytest.TempPathFactory, counting: CountingEmbedder, scifact_docs: list[SourceDocument]
) -> Path:
    """A data dir holding collection ``obs_docs`` (40 SciFact documents and one with the secret text)."""
    data = tmp_path_factory.mktemp("observability")
    up = Quarry(Settings(data_dir=data), embedder=counting)
    up.create_collection(COLLECTION, language="en")
    secret = SourceDocument("secret", f"The {SECRET_TEXT} assay measures vitamin D in serum.", title="secret")
    up.upsert(COLLECTION, [*scifact_docs[:40], secret])
    up.close()
    return data


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> CrossEncoderReranker:
    folder = build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-ce"), seed=0)
    model = CrossEncoderReranker(str(folder), device="cpu")
    model.warm_up()
    return model


@pytest.fixture()
def up(data_dir: Path, counting: CountingEmbedder, reranker: CrossEncoderReranker) -> Iterator[Quarry]:
    quarry = Quarry(
        Settings(data_dir=data_dir, rerank={"budget_ms": 60_000}, llm={"api_key": SECRET_KEY}),
        embedder=counting, reranker=reranker,
    )
    yield quarry
    quarry.close()


@pytest.fixture()
def down(data_dir: Path) -> Iterator[Quarry]:
    """The same data; the embedding server and the LLM server do not answer (nothing listens)."""
    dead = TritonEmbedder.from_url(f"triton+grpc://127.0.0.1:{_closed_port()}/minilm", timeout_s=1.0)
    llm = {"url": f"openai+http://127.0.0.1:{_closed_port()}/v1?model=m", "api_key": SECRET_KEY, "retry_after_s": 0}
    quarry = Quarry(Settings(data_dir=data_dir, search={"retry_after_s": 60}, llm=llm), embedder=dead)
    yield quarry
    quarry.close()


def _scrape(client: TestClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``/metrics``: ``(name, labels) -> value``."""
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


OURS = {"tenant": "default", "collection": COLLECTION}  # the series of this module's collection


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_scrape_after_a_hybrid_rerank_search_holds_each_stage_histogram(up: Quarry) -> None:
    with TestClient(create_app(up)) as client:
        r = client.post(SEARCH, json=HYBRID_RERANK)
        assert r.status_code == 200, r.text
        assert r.json()["reranked"] is True and not r.json()["degraded"]
        samples = _scrape(client)
    for stage in STAGES:
        labels = frozenset({"stage": stage, "tenant": "default", "collection": COLLECTION, "mode": "hybrid"}.items())
        assert samples[("quarry_stage_seconds_count", labels)] >= 1, stage
        assert samples[("quarry_stage_seconds_sum", labels)] > 0, stage
        assert samples[("quarry_stage_seconds_bucket", labels | {("le", "+Inf")})] >= 1, stage
    assert samples[("quarry_requests_in_flight", frozenset())] >= 1  # the scrape itself
    names = {name for name, _ in samples}
    assert {"quarry_requests_in_flight", "quarry_batcher_queue_depth", "quarry_sla_seconds"} <= names
    batchers = {dict(labels)["batcher"] for name, labels in samples if name == "quarry_batcher_queue_depth"}
    assert {"embed", "ann"} <= batchers
    assert samples[("quarry_sla_seconds", frozenset({"route": "/v1/collections/{name}/search"}.items()))] == 0.5
    route = frozenset({"route": "/v1/collections/{name}/search", "status": "200"}.items())
    assert samples[("quarry_requests_total", route)] >= 1
    # no label holds query text
    assert not any("vitamin" in value for _, labels in samples for _, value in labels)


def test_a_bm25_search_observes_no_dense_stage_and_no_fusion(up: Quarry) -> None:
    before = {s: _value("quarry_stage_seconds_count", stage=s, **OURS, mode="bm25") for s in STAGES}
    with TestClient(create_app(up)) as client:
        assert client.post(SEARCH, json={"query": "vitamin D", "mode": "bm25"}).status_code == 200
    grew = {s for s in STAGES if _value("quarry_stage_seconds_count", stage=s, **OURS, mode="bm25")
            > before[s]}
    assert grew == {"bm25", "hydrate"}


def test_degraded_searches_and_answers_increment_their_counters(down: Quarry) -> None:
    skipped, failed = _value("quarry_degraded_answers_total", reason="dense_skipped"), _value(
        "quarry_degraded_answers_total", reason="llm_failed"
    )
    total = _value("quarry_stage_seconds_count", stage="llm_total", **OURS, mode="bm25")
    with TestClient(create_app(down)) as client:
        r = client.post(SEARCH, json={"query": "vitamin D", "mode": "hybrid"})
        assert r.status_code == 200 and r.json()["degraded"]
        assert _value("quarry_degraded_answers_total", reason="dense_skipped") == skipped + 1
        a = client.post(f"/v1/collections/{COLLECTION}/answer", json={"query": "vitamin D", "mode": "bm25"})
        assert a.status_code == 200 and a.json()["answer"] is None, a.text
        assert any(d.startswith("llm: ") for d in a.json()["degraded"])
    assert _value("quarry_degraded_answers_total", reason="llm_failed") == failed + 1
    assert _value("quarry_stage_seconds_count", stage="llm_total", **OURS, mode="bm25") == total + 1
    assert _value("quarry_degraded_answers_total", reason="dense_skipped") == skipped + 1  # a bm25 answer: no dense


def test_metrics_off_observes_nothing(data_dir: Path, counting: CountingEmbedder) -> None:
    quarry = Quarry(Settings(data_dir=data_dir, metrics={"enabled": False}), embedder=counting)
    route = {"route": "/v1/collections/{name}/search", "status": "200"}
    try:
        before = _value("quarry_requests_total", **route), _value(
            "quarry_stage_seconds_count", stage="bm25", **OURS, mode="hybrid"
        )
        with TestClient(create_app(quarry)) as client:
            assert client.post(SEARCH, json={"query": "vitamin D"}).status_code == 200
            assert client.get("/metrics").status_code == 200
        after = _value("quarry_requests_total", **route), _value(
            "quarry_stage_seconds_count", stage="bm25", **OURS, mode="hybrid"
        )
        assert after == before
    finally:
        quarry.close()


@pytest.fixture()
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    assert tracing.configure(TracingSettings(enabled=True), exporter=exporter)
    yield exporter
    tracing.shutdown()


def test_a_search_is_traced_stage_by_stage_under_the_callers_trace(up: Quarry, spans: InMemorySpanExporter) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent = f"00-{trace_id}-00f067aa0ba902b7-01"
    with TestClient(create_app(up)) as client:
        r = client.post(SEARCH, json=HYBRID_RERANK, headers={"traceparent": parent, "x-request-id": "req-42"})
        assert r.status_code == 200, r.text
    finished = {s.name: s for s in spans.get_finished_spans()}
    server = finished["POST /v1/collections/{name}/search"]
    retrieval = finished[f"retrieval {COLLECTION}"]
    assert format(server.context.trace_id, "032x") == trace_id  # continues the caller's trace
    assert server.attributes["quarry.request_id"] == "req-42"
    assert server.attributes["http.response.status_code"] == 200
    assert retrieval.parent.span_id == server.context.span_id
    assert retrieval.attributes["gen_ai.operation.name"] == "retrieval"
    assert retrieval.attributes["gen_ai.data_source.id"] == COLLECTION
    for stage in STAGES:
        span = finished[stage]
        assert span.parent.span_id == retrieval.context.span_id, stage
        assert retrieval.start_time <= span.start_time <= span.end_time <= retrieval.end_time, stage
    dumped = json.dumps([s.to_json() for s in spans.get_finished_spans()])
    assert "vitamin" not in dumped  # no query text in any span


@pytest.mark.integration
def test_an_answer_has_a_gen_ai_chat_span_and_llm_stage_metrics(
    data_dir: Path, counting: CountingEmbedder, spans: InMemorySpanExporter
) -> None:
    # free text: 4 tokens of answer (a structured reply would spend them on its JSON keys)
    llm = llama_settings(structured="off")
    quarry = Quarry(Settings(data_dir=data_dir, llm=llm, cache={"enabled": False}), embedder=counting)
    labels = {"tenant": "default", "collection": COLLECTION, "mode": "bm25"}
    ttft = _value("quarry_stage_seconds_count", stage="llm_ttft", **labels)
    try:
        with TestClient(create_app(quarry)) as client:
            body = {"query": "What does vitamin D do?", "mode": "bm25", "top_k": 2, "max_tokens": 4}
            r = client.post(f"/v1/collections/{COLLECTION}/answer", json=body)
            assert r.status_code == 200 and r.json()["answer"], r.text
    finally:
        quarry.close()
    assert _value("quarry_stage_seconds_count", stage="llm_ttft", **labels) == ttft + 1
    (chat,) = [s for s in spans.get_finished_spans() if s.name.startswith("chat")]
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.request.max_tokens"] == 4
    assert chat.attributes["gen_ai.usage.output_tokens"] >= 1
    assert chat.attributes["gen_ai.response.time_to_first_chunk"] > 0
    assert "gen_ai.input.messages" not in chat.attributes  # no prompt (document text) in spans


def test_the_request_id_is_echoed_or_made(up: Quarry) -> None:
    with TestClient(create_app(up)) as client:
        assert client.get("/healthz", headers={"x-request-id": "abc-123_x.y"}).headers["x-request-id"] == "abc-123_x.y"
        for bad in ("a" * 129, "has space", 'quote"', "semi;colon", "<script>"):
            made = client.get("/healthz", headers={"x-request-id": bad})
            assert made.headers["x-request-id"] != bad and len(made.headers["x-request-id"]) == 32
        fresh = {client.get("/healthz").headers["x-request-id"] for _ in range(3)}
        assert len(fresh) == 3
        refused = client.get("/v1/collections/nope")  # errors carry it too
        assert refused.status_code == 404 and len(refused.headers["x-request-id"]) == 32


def test_every_log_line_carries_its_request_id(up: Quarry) -> None:
    # A real uvicorn with `quarry serve`'s logging (JSON lines): its access log lines carry the id.
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(up), host="127.0.0.1", port=port, log_config=uvicorn_log_config("json", "DEBUG"))
    )
    thread = threading.Thread(target=server.run, daemon=True)
    buffer = io.StringIO()
    try:
        thread.start()
        _wait(lambda: server.started)
        (handler,) = [h for h in root.handlers if h not in saved[0]]
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(buffer)
        base = f"http://127.0.0.1:{port}"
        r = httpx.post(base + SEARCH, json=HYBRID_RERANK, headers={"x-request-id": "trace-me-1"}, timeout=60)
        assert r.status_code == 200 and r.headers["x-request-id"] == "trace-me-1"
        assert httpx.get(base + "/healthz", timeout=10).status_code == 200
    finally:
        server.should_exit = True
        thread.join(30)
        root.handlers[:], root.level = saved
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert len(access) == 2 and access[0]["request_id"] == "trace-me-1" and len(access[1]["request_id"]) == 32
    assert all({"ts", "level", "logger", "request_id", "message"} <= set(line) for line in lines)


def _grep_logs(service: Quarry, caplog: pytest.LogCaptureFixture) -> str:
    """What Quarry and its libraries log at DEBUG through an ingest, searches and an answer."""
    caplog.set_level(logging.DEBUG)
    key = {"authorization": f"Bearer {SECRET_KEY}", "api-key": SECRET_KEY}
    with TestClient(create_app(service), raise_server_exceptions=False) as client:
        docs = {"documents": [{"id": "new", "text": f"another {SECRET_TEXT} document"}]}
        client.post(f"/v1/collections/{COLLECTION}/documents", json=docs, headers=key)
        client.post(SEARCH, json={**HYBRID_RERANK, "query": f"{SECRET_TEXT} assay"}, headers=key)
        client.post(f"/v1/collections/{COLLECTION}/answer", json={"query": f"{SECRET_TEXT}?", "mode": "bm25"})
        client.post(f"/v1/collections/{COLLECTION}/documents/delete", json={"ids": ["new"]}, headers=key)
    assert caplog.records, "nothing was logged: the check would prove nothing"
    return "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.args!r}" for r in caplog.records)


def test_no_log_line_holds_document_text_a_query_or_a_key(up: Quarry, caplog: pytest.LogCaptureFixture) -> None:
    logged = _grep_logs(up, caplog)
    assert SECRET_TEXT not in logged and SECRET_KEY not in logged


def test_no_log_line_of_a_failing_llm_holds_the_prompt_or_its_key(
    down: Quarry, caplog: pytest.LogCaptureFixture
) -> None:
    logged = _grep_logs(down, caplog)
    assert SECRET_TEXT not in logged and SECRET_KEY not in logged


def _wait(condition: object) -> None:
    deadline = time.monotonic() + 60
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.01)


# --- alert rules and dashboard (deploy/) ---------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / "deploy" / "prometheus"
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "quarry.json"
_QUARRY_NAME = re.compile(r"\bquarry_[a-z0-9_]+\b")
# Used by a rule or the dashboard before the service exports it (none now: the recall monitor's
# quarry_recall{collection,selectivity} is merged); a name here must not be exported yet.
PENDING: set[str] = set()


def _used_names() -> dict[str, set[str]]:
    """Every ``quarry_*`` name in an alert expression or a dashboard query, and where."""
    used: dict[str, set[str]] = {}
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            for name in _QUARRY_NAME.findall(rule["expr"]):
                used.setdefault(name, set()).add(f"alert {rule['alert']}")
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]
    queries += [(f"variable {v['name']}", v["definition"]) for v in dashboard["templating"]["list"]]
    for where, expr in queries:
        for name in _QUARRY_NAME.findall(expr):
            used.setdefault(name, set()).add(f"dashboard {where}")
    return used


def _exported(text: str) -> set[str]:
    """The sample names a scrape holds or declares (a labelled metric with no sample yet declares its family)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + suffix for suffix in suffixes.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


def test_every_metric_the_alerts_and_the_dashboard_use_is_exported(up: Quarry) -> None:
    with TestClient(create_app(up)) as client:  # some traffic: a search, an answer, a miss
        assert client.post(SEARCH, json=HYBRID_RERANK).status_code == 200
        assert client.post(f"/v1/collections/{COLLECTION}/answer", json={"query": "vitamin D"}).status_code == 200
        assert client.get("/v1/collections/nope").status_code == 404
        exported = _exported(client.get("/metrics").text)
    used = _used_names()
    assert len(used) >= 10, sorted(used)  # the extraction found the rules' and panels' names
    missing = {name: sorted(where) for name, where in used.items() if name not in exported | PENDING}
    assert not missing, f"used but not exported: {missing}"
    assert PENDING <= set(used) and not PENDING & exported, "PENDING is stale: drop the names now exported"
    declared = {"quarry_rate_limited_total", "quarry_shed_total", "quarry_auth_failures_total",
                "quarry_shed_requests_held", "quarry_token_limited_total"}
    assert declared <= exported  # defined before the access layer counts them


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool not installed (scripts/setup.sh puts it in .venv/bin from Debian's prometheus package)")
    return found


def test_promtool_accepts_the_rules_and_the_config(tmp_path: Path) -> None:
    """The config as deployed: its scrape key file (``quarry.key``, made by ``quarry keys create``) beside it."""
    promtool = _promtool()
    deployed = shutil.copytree(PROMETHEUS, tmp_path / "prometheus")
    assert not (PROMETHEUS / "quarry.key").exists() or (deployed / "quarry.key").exists()
    (deployed / "quarry.key").write_text("qk_000000000000_" + "A" * 43 + "\n", encoding="utf-8")
    for args in (["check", "rules", "alerts.yml"], ["check", "config", "prometheus.yml"]):
        done = subprocess.run([promtool, *args], cwd=deployed, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
    config = (PROMETHEUS / "prometheus.yml").read_text(encoding="utf-8")
    assert "credentials_file: quarry.key" in config  # /metrics needs a key of the metrics scope


def test_the_p99_alert_fires_after_three_intervals_over_twice_the_sla() -> None:
    done = subprocess.run(
        [_promtool(), "test", "rules", "alerts_test.yml"], cwd=PROMETHEUS, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
