"""Recall monitoring measures what serves: the live version, at the live search depth, per version.

A collection whose live version has a deliberately damaged IVF index (one list probed) is searched
through the service: ``GET .../recall`` (the sampler's figures), ``quarry recall`` (the on-demand
check) and the scrape-time gauges the alert reads all report the damage; a reindex to the same
damaged index is refused by its recall check (at the live depth); one to the planner's index
(exact at this size) fixes it, and the same three then report the new version's
figures only, from a fresh start. The damage needs an engine whose IVF is approximate: the Milvus
server and pgvector (Milvus Lite answers IVF_FLAT exactly); the swap's plumbing is checked on
Milvus Lite too. The packaged MiniLM's vectors (through the test cache), SciFact documents.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import REGISTRY

from indexing.document_rules import SourceDocument
from indexing.sources import iter_jsonl
from monitoring.exact import Sample
from monitoring.monitor import RecallMonitor
from quarry.errors import ReindexFailed
from quarry.scheduler import recall_reason
from quarry.service import Quarry
from quarry.settings import MonitorSettings, SearchSettings, Settings, StoreSettings
from stores.base import IndexSpec, ScoredId, VectorRecord
from stores.factory import open_store
from stores.filters import Eq
from tests.core.conftest import CountingEmbedder
from tests.monitoring.test_monitor import unit

URLS = {
    "pgvector": os.environ.get("QUARRY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5433/quarry"),
    "milvus-server": os.environ.get("QUARRY_TEST_MILVUS_URL", "milvus://127.0.0.1:19530"),
}
DOCS = 1500  # 2,153 chunks: a Milvus server segment under 1,024 rows is searched exactly, unindexed
QUERIES = 30
# One probed list of 32, and on pgvector no iterative scan: each answer is a full, wrong top-k of one list.
DAMAGED = IndexSpec("IVF_FLAT", params={"nlist": 32}, search_params={"nprobe": 1, "iterative_scan": "off"})
# The searcher's window: 10 candidates, so the dense channel asks the ANN for 20 (DEPTH_FACTOR 2). At
# the default depth (200) pgvector re-runs every answer shorter than the depth exactly (lists of ~70
# rows often are): its damaged index would then serve exact answers, and recall be 1.0.
WINDOW = 10


def ids(hits: list[ScoredId]) -> tuple[str, ...]:
    return tuple(h.id for h in hits)


def gauge(name: str, collection: str, selectivity: str = "none") -> float | None:
    return REGISTRY.get_sample_value(name, {"tenant": "default", "collection": collection, "selectivity": selectivity})


def quarry_for(backend: str, tmp_path: Path, embedder: CountingEmbedder) -> Quarry:
    store = f"milvus://{tmp_path}/quarry.db" if backend == "milvus-lite" else URLS[backend]
    settings = Settings(
        data_dir=tmp_path / "data", store=StoreSettings(url=store), search=SearchSettings(candidates=WINDOW),
        monitor=MonitorSettings(sample_rate=1.0, cpu_share=1.0, trigger_min_samples=20),
    )
    return Quarry(settings, embedder=embedder)


@pytest.fixture(scope="module")
def corpus(shared_data: Path) -> list[SourceDocument]:
    """SciFact's first ``DOCS`` documents."""
    return list(itertools.islice(iter_jsonl(shared_data / "scifact" / "corpus.jsonl"), DOCS))


@pytest.fixture()
def damaged(
    request: pytest.FixtureRequest, tmp_path: Path, counting: CountingEmbedder, corpus: list[SourceDocument]
) -> Iterator[tuple[Quarry, str]]:
    """A collection of ``DOCS`` SciFact documents whose live version has the ``DAMAGED`` index."""
    service = quarry_for(request.param, tmp_path, counting)
    name = f"rv_{uuid.uuid4().hex[:8]}"
    service.create_collection(name)
    try:
        service.upsert(name, corpus)
        service.store.build_index(service.live_version(name).physical_name, DAMAGED, 300)
        yield service, name
    finally:
        service.drop_collection(name)
        service.close()


def search_all(service: Quarry, name: str, queries: list[str]) -> None:
    for query in queries:
        assert not service.search(name, query, top_k=10, mode="dense").degraded
    assert service.monitor.drain(120)


@pytest.mark.integration
@pytest.mark.parametrize("damaged", ["milvus-server", "pgvector"], indirect=True)
def test_a_damaged_ivf_index_is_reported_then_a_reindex_fixes_it(
    damaged: tuple[Quarry, str], corpus: list[SourceDocument]
) -> None:
    service, name = damaged
    queries = [d.title for d in corpus[:: DOCS // QUERIES]][:QUERIES]
    search_all(service, name, queries)

    before = service.recall(name)
    unfiltered = before["buckets"]["none"]
    assert before["version"] == 1 and unfiltered["samples"] == QUERIES, before
    assert unfiltered["mean_recall"] < 0.7, before
    assert before["trigger"]["fired"] and recall_reason(service, name) is not None
    assert gauge("quarry_recall_window_mean", name) == pytest.approx(unfiltered["mean_recall"])
    assert gauge("quarry_recall_window_samples", name) == QUERIES
    checked = service.check_recall(name, QUERIES)  # the recorded searches, re-run now
    assert (checked.version, checked.source, checked.depth) == (1, "recent", 2 * WINDOW)
    assert checked.buckets[0].bucket == "none" and checked.buckets[0].mean_recall < 0.7

    with pytest.raises(ReindexFailed, match=f"recall@10 of its IVF_FLAT index at depth {2 * WINDOW} is 0[.]") as no:
        service.reindex(name, index=DAMAGED)  # the check searches as live searches do: the damage shows
    assert "version 1 still serves" in no.value.message and service.live_version(name).version == 1
    assert service.docstore.list_versions(name)[-1].state == "failed"

    report = service.reindex(name)  # the planner's index for 2,153 vectors: exact (FLAT)
    assert report.version == 3 and report.recall is not None and report.recall >= 0.95

    fresh = service.recall(name)  # no sample of version 1 counts any more
    assert fresh["version"] == 3 and all(b["samples"] == 0 for b in fresh["buckets"].values()), fresh
    assert not fresh["trigger"]["fired"] and recall_reason(service, name) is None
    assert gauge("quarry_recall_window_samples", name) is None  # no series until version 3 is sampled
    checked = service.check_recall(name, QUERIES)
    assert checked.version == 3 and checked.physical != service.docstore.list_versions(name)[0].physical_name
    assert checked.buckets[0].mean_recall >= 0.95, checked.buckets

    search_all(service, name, queries)
    after = service.recall(name)
    assert after["version"] == 3 and after["buckets"]["none"]["samples"] == QUERIES
    assert after["buckets"]["none"]["mean_recall"] >= 0.95 and not after["trigger"]["fired"]
    assert gauge("quarry_recall_window_mean", name) == pytest.approx(after["buckets"]["none"]["mean_recall"])

    if service.store.capabilities().engine != "pgvector":  # another process shares the Milvus server
        cli = quarry_recall_cli(service, name)
        assert f"{name} version 3: recall@k of {QUERIES} queries from recent" in cli, cli
        assert f"none │ {QUERIES} │ 1.000" in cli, cli


def quarry_recall_cli(service: Quarry, name: str) -> str:
    """``quarry recall NAME`` in its own process, over the service's data folder and store."""
    settings = service.settings
    env = {
        **os.environ, "QUARRY_DATA_DIR": str(settings.data_dir), "QUARRY_STORE__URL": settings.store.url,
        "QUARRY_SEARCH__CANDIDATES": str(WINDOW), "COLUMNS": "200",
    }
    done = subprocess.run(
        [sys.executable, "-m", "quarry.cli", "recall", name, "--queries", str(QUERIES)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())


def test_a_swap_starts_fresh_figures_on_milvus_lite(
    tmp_path: Path, counting: CountingEmbedder, scifact_docs: list[SourceDocument]
) -> None:
    """The fast path of the test above: Milvus Lite answers exactly (every figure 1.0); what counts is the version."""
    service = quarry_for("milvus-lite", tmp_path, counting)
    name = "swapped"
    queries = [d.title for d in scifact_docs[:40:4]]
    try:
        service.create_collection(name)
        service.upsert(name, scifact_docs[:40])
        search_all(service, name, queries)
        assert service.recall(name)["buckets"]["none"]["samples"] == len(queries)
        assert service.check_recall(name, 5).version == 1
        service.reindex(name)
        fresh = service.recall(name)
        assert fresh["version"] == 2 and fresh["buckets"]["none"]["samples"] == 0, fresh
        assert gauge("quarry_recall_window_samples", name) is None
        checked = service.check_recall(name, 5)
        assert checked.version == 2 and checked.physical == service.live_version(name).physical_name
        search_all(service, name, queries[:3])
        assert service.recall(name)["buckets"]["none"]["samples"] == 3
        assert gauge("quarry_recall_window_samples", name) == 3
        service.rollback(name)  # back to version 1: its figures start afresh too
        back = service.recall(name)
        assert back["version"] == 1 and back["buckets"]["none"]["samples"] == 0, back
    finally:
        service.close()


def test_one_bucket_below_the_floor_fires_while_the_mean_of_all_is_above_it(tmp_path: Path) -> None:
    """The trigger and the alert's gauges look at each selectivity bucket, not at the mean of all."""
    store = open_store(f"milvus://{tmp_path}/quarry.db")
    name, dim = "buckets", 16
    rng = np.random.default_rng(4)
    data = unit(rng, 400, dim)
    store.create_collection(name, dim)
    store.upsert(name, [VectorRecord(f"r{i}", v, {"half": "a" if i % 2 else "b"}) for i, v in enumerate(data)])
    monitor = RecallMonitor(store, MonitorSettings(sample_rate=1.0, cpu_share=1.0, trigger_min_samples=20))
    try:
        queries = unit(rng, 200, dim)
        half = Eq("half", "a")
        filtered = store.search(name, queries, 10, half, with_payload=False)  # exact here: recall 1.0
        good = store.search(name, queries[:20], 10, with_payload=False)
        far = store.search(name, -queries[:20], 10, with_payload=False)  # the farthest rows: recall 0
        samples = [Sample(name, "cosine", q, half, 10, ids(hits)) for q, hits in zip(queries, filtered, strict=True)]
        samples += [Sample(name, "cosine", q, None, 10, ids(hits)) for q, hits in zip(queries[:20], good, strict=True)]
        samples += [Sample(name, "cosine", q, None, 10, ids(hits)) for q, hits in zip(queries[:20], far, strict=True)]
        for outcome in monitor.measure_many(samples):
            assert not isinstance(outcome, Exception), outcome
        figures = monitor.figures(name)["buckets"]
        assert figures[">=10%"] == {"samples": 200, "mean_recall": 1.0, "p10_recall": 1.0}
        assert figures["none"]["samples"] == 40 and figures["none"]["mean_recall"] == pytest.approx(0.5)
        trigger = monitor.trigger(name)
        assert trigger.fired and trigger.below == {"none": pytest.approx(0.5)}
        assert gauge("quarry_recall_window_mean", name) == pytest.approx(0.5)  # what the alert reads
        assert gauge("quarry_recall_window_samples", name) == 40
        assert gauge("quarry_recall_window_mean", name, ">=10%") == 1.0
    finally:
        monitor.forget(name)
        monitor.close()
        store.close()


def test_two_tenants_same_named_collections_are_two_window_series_each_seen_by_its_tenant_only(
    tmp_path: Path,
) -> None:
    """The alert's gauges carry ``tenant``: two tenants' ``docs`` are two series, and a tenant's
    ``/metrics`` view (:class:`quarry.metrics.TenantView`) holds none of the other's."""
    from quarry.metrics import TenantView

    store = open_store(f"milvus://{tmp_path}/quarry.db")
    dim, rng = 16, np.random.default_rng(5)
    name = f"docs{uuid.uuid4().hex[:6]}"
    monitors = {t: RecallMonitor(store, MonitorSettings(sample_rate=1.0, cpu_share=1.0), tenant=t)
                for t in ("acme", "beta")}
    try:
        store.create_collection(name, dim)
        store.upsert(name, [VectorRecord(f"r{i}", v, {}) for i, v in enumerate(unit(rng, 200, dim))])
        queries = unit(rng, 10, dim)
        exact = store.search(name, queries, 10, with_payload=False)
        far = store.search(name, -queries, 10, with_payload=False)  # recall 0
        for tenant, answers in (("acme", far), ("beta", exact)):
            samples = [Sample(name, "cosine", q, None, 10, ids(h)) for q, h in zip(queries, answers, strict=True)]
            assert not any(isinstance(m, Exception) for m in monitors[tenant].measure_many(samples))

        def window(tenant: str) -> float | None:
            labels = {"tenant": tenant, "collection": name, "selectivity": "none"}
            return REGISTRY.get_sample_value("quarry_recall_window_mean", labels)

        assert window("acme") == 0.0 and window("beta") == 1.0
        seen = [(s.name, s.labels) for f in TenantView("acme").collect() for s in f.samples
                if s.labels.get("collection") == name]
        assert seen and all(labels["tenant"] == "acme" for _, labels in seen), seen
    finally:
        for monitor in monitors.values():
            monitor.forget(name)
            monitor.close()
        store.close()
