"""The monitor wired into the service: live REST searches sampled, ``GET .../recall``, ``quarry recall``.

Milvus Lite and the packaged MiniLM (its vectors through the test cache), 100 % sampling.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from quarry.api.app import create_app
from quarry.service import Quarry
from quarry.settings import MonitorSettings, Settings
from tests.core.conftest import write_jsonl
from tests.core.test_cli import Runner, quarry_cli  # noqa: F401 - the fixture
from tests.embedding_cache import CachedEmbedder
from tests.monitoring.test_monitor import sample_value

TOPICS = [
    "the mitochondria is the powerhouse of the cell", "jupiter is a gas giant planet",
    "photosynthesis turns light into sugar", "volcanoes erupt molten rock", "the heart pumps blood",
    "rivers carry sediment to the sea", "neurons fire electrical signals", "glaciers carve valleys",
]
DOCS = [
    {"id": f"d{i}", "text": f"{TOPICS[i % len(TOPICS)]} (note {i})", "metadata": {"half": "a" if i % 2 else "b"}}
    for i in range(40)
]


@pytest.fixture()
def service(tmp_path: Path, minilm_vectors: CachedEmbedder) -> Iterator[Quarry]:
    settings = Settings(data_dir=tmp_path, monitor=MonitorSettings(sample_rate=1.0, cpu_share=1.0))
    quarry = Quarry(settings, embedder=minilm_vectors)
    yield quarry
    quarry.close()


def test_live_searches_are_sampled_and_reported(service: Quarry) -> None:
    # The metrics registry is the process's and other tests in this worker sample their
    # collections at the default 1 % rate: a name of its own, and the metrics read as deltas.
    unfiltered = {"tenant": "default", "collection": "live_recall", "selectivity": "none"}
    half = {"tenant": "default", "collection": "live_recall", "selectivity": ">=10%", "le": "1.0"}
    none_before = sample_value("quarry_recall_samples_total", **unfiltered)
    half_before = sample_value("quarry_recall_bucket", **half)
    with TestClient(create_app(service)) as client:
        assert client.post("/v1/collections", json={"name": "live_recall"}).status_code == 201
        assert client.post("/v1/collections/live_recall/documents", json={"documents": DOCS}).status_code == 200
        for body in (
            {"query": "gas giant", "mode": "hybrid"},
            {"query": "blood", "mode": "hybrid", "top_k": 5},
            {"query": "erupting rock", "mode": "dense"},
            {"query": "sugar from light", "mode": "dense", "filters": {"half": "a"}},
            {"query": "cells", "mode": "bm25"},  # no dense channel: not sampled
        ):
            assert client.post("/v1/collections/live_recall/search", json=body).status_code == 200
        assert service.monitor.drain(60)
        got = client.get("/v1/collections/live_recall/recall")
        assert got.status_code == 200
        figures = got.json()
        assert figures["buckets"]["none"] == {"samples": 3, "mean_recall": 1.0, "p10_recall": 1.0}
        assert figures["buckets"][">=10%"]["samples"] == 1  # half the rows match
        assert figures["buckets"]["<1%"]["samples"] == 0 and figures["buckets"]["<1%"]["mean_recall"] is None
        assert figures["sample_rate"] == 1.0 and figures["dropped"] == 0 and not figures["trigger"]["fired"]
        metrics = client.get("/metrics").text
        assert 'quarry_recall_samples_total{collection="live_recall",selectivity="none",tenant="default"}' in metrics
        assert 'quarry_recall_bucket{collection="live_recall",le="1.0",selectivity=">=10%",tenant="default"}' in metrics
        assert sample_value("quarry_recall_samples_total", **unfiltered) - none_before == 3
        assert sample_value("quarry_recall_bucket", **half) - half_before == 1
        missing = client.get("/v1/collections/nope/recall")
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "CollectionNotFound"
    recent = service.check_recall("live_recall", 10)
    assert recent.source == "recent" and recent.queries == 4
    assert {b.bucket: b.samples for b in recent.buckets} == {"none": 3, ">=10%": 1}
    assert all(b.mean_recall == 1.0 for b in recent.buckets)


def test_quarry_recall_command_measures_chunk_queries(tmp_path: Path, quarry_cli: Runner) -> None:  # noqa: F811
    corpus = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    data = tmp_path / "data"
    assert quarry_cli(["ingest", str(corpus), "--collection", "demo"], data).returncode == 0
    ran = quarry_cli(["recall", "demo", "--queries", "5"], data)
    assert ran.returncode == 0, ran.stderr
    text = " ".join(ran.stdout.split())
    assert "demo: recall@k of 5 queries from chunks" in text
    assert "none │ 5 │ 1.000 │ 1.000 │ 1.000" in text
    bad = quarry_cli(["recall", "demo", "--queries", "0"], data)
    assert bad.returncode == 2 and "queries must be >= 1" in bad.stderr
