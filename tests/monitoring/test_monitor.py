"""The recall monitor on real engines (Milvus Lite, the embedded default, and pgvector).

Searches are answered by the store's ANN exactly as the dense channel asks for them and offered
to the monitor at 100 % sampling; the monitor's worker re-runs each with ``search_exact``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import REGISTRY

from indexing.ann_data import read_fvecs
from indexing.index_sizing import GIB
from indexing.planner import plan_for_store
from monitoring.monitor import RecallMonitor
from monitoring.recent import RecentQueries
from quarry.settings import MonitorSettings
from stores.base import IndexSpec, VectorRecord, VectorStore
from stores.factory import open_store
from stores.filters import Eq
from stores.routing import FilterRouter

URLS = {
    "pgvector": os.environ.get("QUARRY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5433/quarry"),
    "milvus-server": os.environ.get("QUARRY_TEST_MILVUS_URL", "milvus://127.0.0.1:19530"),
}
BACKENDS = [
    pytest.param("milvus-lite", id="milvus-lite"),
    pytest.param("pgvector", id="pgvector", marks=pytest.mark.integration),
]
# Milvus Lite 2.5 accepts IVF_FLAT but answers it exactly (recall 1.0 at nlist 1024, nprobe 1, on
# 100k rows): its weak index is weak on the Milvus server only.
WEAK_BACKENDS = [
    pytest.param("pgvector", id="pgvector", marks=pytest.mark.integration),
    pytest.param("milvus-server", id="milvus-server", marks=pytest.mark.integration),
]
# every filtered search takes the index (a router limit of one row): no exact route to rescue it
WEAK_ROUTER_ROWS = 1


def opened(backend: str, tmp_path: Path) -> VectorStore:
    url = f"milvus://{tmp_path}/quarry.db" if backend == "milvus-lite" else URLS[backend]
    return open_store(url, FilterRouter(exact_rows=WEAK_ROUTER_ROWS))


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[VectorStore]:
    backend = opened(request.param, tmp_path)
    yield backend
    backend.close()


@pytest.fixture(params=WEAK_BACKENDS)
def weak_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[VectorStore]:
    backend = opened(request.param, tmp_path)
    yield backend
    backend.close()


@pytest.fixture()
def coll(store: VectorStore) -> Iterator[str]:
    name = f"mon_{uuid.uuid4().hex[:10]}"
    yield name
    store.drop_collection(name)


@pytest.fixture()
def weak_coll(weak_store: VectorStore) -> Iterator[str]:
    name = f"mon_{uuid.uuid4().hex[:10]}"
    yield name
    weak_store.drop_collection(name)


def monitor_for(store: VectorStore, tmp_path: Path, **overrides: object) -> RecallMonitor:
    settings = MonitorSettings(**{"sample_rate": 1.0, "cpu_share": 1.0, "trigger_min_samples": 20, **overrides})
    return RecallMonitor(store, settings, recent=RecentQueries(tmp_path / "recent.sqlite"))


def live(
    store: VectorStore, monitor: RecallMonitor, coll: str, queries: np.ndarray, k: int, depth: int, flt: Eq | None
) -> None:
    """Search as the dense channel does (ANN at ``depth``, no payloads) and offer each answer."""
    for vector, hits in zip(queries, store.search(coll, queries, depth, flt, with_payload=False), strict=True):
        assert monitor.offer(coll, "cosine", vector, flt, k, hits)
    assert monitor.drain(120)


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def sample_value(name: str, **labels: str) -> float:
    """A sample of the process' registry (``tenant``: ``default`` unless given), 0 when absent."""
    return REGISTRY.get_sample_value(name, {"tenant": "default", **labels}) or 0.0


def weak_collection(store: VectorStore, coll: str, rng: np.random.Generator, dim: int) -> None:
    """20k random vectors, 0.5 % of them tagged ``rare``, under IVF_FLAT probing 1 list of 8."""
    n = 20_000
    data = unit(rng, n, dim)
    store.create_collection(coll, dim)
    payloads = [{"tag": "rare" if i % 200 == 0 else "common"} for i in range(n)]
    store.upsert(coll, [VectorRecord(f"r{i}", data[i], payloads[i]) for i in range(n)])
    store.build_index(coll, IndexSpec("IVF_FLAT", params={"nlist": 8}, search_params={"nprobe": 1}), 300)


def test_weak_index_with_a_one_percent_filter_reports_low_recall_and_fires(
    weak_store: VectorStore, weak_coll: str, tmp_path: Path
) -> None:
    store, coll, dim, k = weak_store, weak_coll, 32, 10
    rng = np.random.default_rng(5)
    weak_collection(store, coll, rng, dim)
    monitor = monitor_for(store, tmp_path)
    try:
        before = sample_value("quarry_recall_samples_total", collection=coll, selectivity="<1%")
        live(store, monitor, coll, unit(rng, 30, dim), k, k, Eq("tag", "rare"))
        figures = monitor.figures(coll)
    finally:
        monitor.close()
    rare = figures["buckets"]["<1%"]
    assert rare["samples"] == 30
    assert rare["mean_recall"] < 0.5, rare
    assert figures["buckets"]["none"]["samples"] == 0
    trigger = monitor.trigger(coll)
    assert trigger.fired and "<1%" in trigger.below and "below 0.9" in trigger.reason
    assert figures["trigger"]["fired"]
    assert sample_value("quarry_recall_samples_total", collection=coll, selectivity="<1%") == before + 30
    assert sample_value("quarry_recall_count", collection=coll, selectivity="<1%") >= 30
    recorded = monitor.recent.latest(coll, 100) if monitor.recent else []
    assert len(recorded) == 30 and recorded[0].flt == Eq("tag", "rare") and recorded[0].top_k == k


def test_milvus_lite_answers_ivf_exactly_and_the_monitor_says_so(tmp_path: Path) -> None:
    store, coll, rng = opened("milvus-lite", tmp_path), "weak", np.random.default_rng(5)
    try:
        weak_collection(store, coll, rng, 32)
        monitor = monitor_for(store, tmp_path)
        try:
            live(store, monitor, coll, unit(rng, 10, 32), 10, 10, Eq("tag", "rare"))
            figures = monitor.figures(coll)
        finally:
            monitor.close()
    finally:
        store.close()
    assert figures["buckets"]["<1%"] == {"samples": 10, "mean_recall": 1.0, "p10_recall": 1.0}
    assert not monitor.trigger(coll).fired


def test_planner_defaults_report_high_unfiltered_recall(
    store: VectorStore, coll: str, tmp_path: Path, shared_data: Path
) -> None:
    glove = shared_data / "glove-50-angular-100k"
    data = read_fvecs(glove / "base.fvecs")[:20_000]
    data = data / np.linalg.norm(data, axis=1, keepdims=True)
    queries = read_fvecs(glove / "query.fvecs")[:50]
    queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    store.create_collection(coll, 50)
    store.upsert(coll, [VectorRecord(f"g{i}", v, {}) for i, v in enumerate(data)])
    depth = 200  # the dense channel's depth (2 x the default rank window)
    plan = plan_for_store(store, len(data), 50, 16 * GIB, top_k=depth)
    store.build_index(coll, plan.spec, 300)
    monitor = monitor_for(store, tmp_path)
    try:
        live(store, monitor, coll, queries, 10, depth, None)
        figures = monitor.figures(coll)
    finally:
        monitor.close()
    unfiltered = figures["buckets"]["none"]
    assert unfiltered["samples"] == 50
    assert unfiltered["mean_recall"] >= 0.95, (plan.spec, unfiltered)
    assert not figures["trigger"]["fired"]


def test_duplicated_vectors_report_full_recall(store: VectorStore, coll: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    base = unit(rng, 1000, 16)
    store.create_collection(coll, 16)
    twins = [VectorRecord(f"{side}{i}", v, {}) for i, v in enumerate(base) for side in ("a", "b")]
    store.upsert(coll, twins)
    monitor = monitor_for(store, tmp_path)
    try:
        live(store, monitor, coll, base[:20] + 0.01 * unit(rng, 20, 16), 10, 10, None)
        # a set intersection would not give 1.0 when ANN and exact keep different twins
        figures = monitor.figures(coll)
    finally:
        monitor.close()
    assert figures["buckets"]["none"] == {"samples": 20, "mean_recall": 1.0, "p10_recall": 1.0}


def test_a_full_queue_drops_and_counts(store: VectorStore, coll: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    data = unit(rng, 200, 16)
    store.create_collection(coll, 16)
    store.upsert(coll, [VectorRecord(f"r{i}", v, {}) for i, v in enumerate(data)])
    monitor = monitor_for(store, tmp_path, queue_size=1, cpu_share=0.01)
    hits = store.search(coll, data[:1], 10, with_payload=False)[0]
    try:
        before = sample_value("quarry_recall_samples_dropped_total", collection=coll)
        queued = [monitor.offer(coll, "cosine", data[0], None, 10, hits) for _ in range(50)]
    finally:
        monitor.close()
    assert sum(queued) < 50 and monitor.dropped == 50 - sum(queued)
    dropped = sample_value("quarry_recall_samples_dropped_total", collection=coll)
    assert dropped == before + monitor.dropped
    monitor.forget(coll)  # the collection was dropped: its series go
    labels = {"tenant": "default", "collection": coll}
    assert REGISTRY.get_sample_value("quarry_recall_samples_dropped_total", labels) is None


def test_sampling_rate_zero_queues_nothing(store: VectorStore, tmp_path: Path) -> None:
    monitor = monitor_for(store, tmp_path, sample_rate=0.0)
    assert not monitor.offer("any", "cosine", np.zeros(4, np.float32), None, 10, [])
    assert monitor.queued == 0 and monitor.dropped == 0
