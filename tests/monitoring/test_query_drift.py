"""Query drift (issue 40, item 4, acceptance 6): an English collection's queries, then Chinese ones.

The real service on Milvus Lite with the packaged MiniLM (its vectors through the test cache):
a collection of SciFact documents (language ``en``) is searched with SciFact's own queries (the
reference and a further window: the drift stays low), then with CMRC2018's Chinese questions
(both signals move well past the alert's thresholds, and the reindex scheduler's drift trigger
names the drift). The alert rule itself is checked by ``promtool`` in
``tests/core/test_observability.py`` (``deploy/prometheus/alerts_test.yml``).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from indexing.document_rules import SourceDocument
from monitoring.drift import QueryDrift, centroid_drift, oov_drift, oov_share, spread
from monitoring.exact import Sample
from quarry.api import create_app
from quarry.scheduler import ReindexScheduler, recall_reason
from quarry.service import Quarry
from quarry.settings import DocstoreSettings, MonitorSettings, Settings, StoreSettings
from tests.core.conftest import PG_URL, CountingEmbedder

NAME = "drift_en"
# the drift's defaults (200 reference queries, a window of 500); the recall trigger on 5 samples
DRIFT = MonitorSettings(sample_rate=0.0, trigger_min_samples=5)
REFERENCE, WINDOW = DRIFT.drift_reference_queries, DRIFT.drift_window_queries


# -- the pure scoring, against values worked by hand ----------------------------------------------


def test_spread_and_centroid_drift_by_hand() -> None:
    x, y = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    assert spread(x + y, 2) == pytest.approx(np.sqrt(0.5))  # each is sqrt(0.5) from the centroid (0.5, 0.5)
    assert spread(2 * x, 2) == 0.0
    reference = x + y
    # the same centroid over 10 queries: only sampling apart, so 0
    assert centroid_drift(reference, 2, 5 * (x + y), 10) == 0.0
    # the current centroid (1, 0): squared distance 0.5, less sampling 0.5/2 + 0/3, over spread² 0.5
    assert centroid_drift(reference, 2, 3 * x, 3) == pytest.approx(np.sqrt(0.25 / 0.5))
    # the opposite centroid (-0.5, -0.5): squared distance 2, less 0.5/2 + 0.5/2, over 0.5
    assert centroid_drift(reference, 2, -(x + y), 2) == pytest.approx(np.sqrt(3))


def test_the_centroid_drift_of_one_diverse_workload_is_near_0() -> None:
    """Isotropic queries: two windows' centroid directions are noise (a cosine distance of about 1)."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((700, 384))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    reference, current = vectors[:200].sum(0), vectors[200:].sum(0)
    cosine = 1 - reference @ current / np.linalg.norm(reference) / np.linalg.norm(current)
    assert cosine > 0.9 and centroid_drift(reference, 200, current, 500) < 0.05
    shifted = vectors[200:] + 0.5 * vectors[0]  # every query pulled towards one direction
    shifted /= np.linalg.norm(shifted, axis=1, keepdims=True)
    assert centroid_drift(reference, 200, shifted.sum(0), 500) > 0.3


def test_oov_share_counts_distinct_terms_and_a_query_without_terms_says_nothing() -> None:
    vocabulary = {"vitamin", "d"}
    assert oov_share(["vitamin", "d", "d", "zinc"], vocabulary.__contains__) == pytest.approx(1 / 3)
    assert oov_share(["战", "国"], vocabulary.__contains__) == 1.0
    assert oov_share([], vocabulary.__contains__) is None
    assert oov_drift(10.0, 100, 45.0, 50) == pytest.approx(0.8)


def test_a_search_never_waits_for_the_drift_lock() -> None:
    drift = QueryDrift(DRIFT, tenant="lock-test")
    drift.observe("c", "c_v1", np.ones(4, np.float32), 0.0)
    profile = drift._profiles["c"]["c_v1"]
    with profile.lock:  # another query adding at this instant
        started = time.perf_counter()
        done = threading.Thread(target=drift.observe, args=("c", "c_v1", np.ones(4, np.float32), 0.0))
        done.start()
        done.join(5)
        assert not done.is_alive() and time.perf_counter() - started < 1.0
    assert drift.skipped == 1 and drift.figures("c").queries == {"centroid": 1, "oov": 1}  # type: ignore[union-attr]


def test_a_new_version_starts_a_fresh_reference() -> None:
    drift = QueryDrift(DRIFT.model_copy(update={"drift_reference_queries": 2}), tenant="swap-test")
    for _ in range(3):
        drift.observe("c", "c_v1", np.array([1.0, 0.0]), 0.0)
    drift.observe("c", None, None, 1.0)  # a BM25-only search: the serving version's profile
    assert drift.serving("c") == "c_v1" and drift.figures("c").queries["oov"] == 4  # type: ignore[union-attr]
    drift.observe("c", "c_v2", np.array([0.0, 1.0]), 0.0)
    figures = drift.figures("c")
    assert figures is not None and figures.physical == "c_v2" and figures.reference == {"centroid": 1, "oov": 1}
    assert figures.centroid is None  # its reference is not complete yet


# -- the service: SciFact queries, then CMRC's ------------------------------------------------------


def _queries(path: Path, n: int, skip: int = 0) -> list[str]:
    with path.open(encoding="utf-8") as fh:
        rows = [json.loads(line)["text"] for line in fh]
    return rows[skip : skip + n]


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, counting: CountingEmbedder, scifact_docs: list[SourceDocument]
) -> Iterator[Quarry]:
    quarry = Quarry(Settings(data_dir=tmp_path_factory.mktemp("drift"), monitor=DRIFT), embedder=counting)
    quarry.create_collection(NAME, language="en")
    quarry.upsert(NAME, scifact_docs[:200])
    yield quarry
    quarry.drop_collection(NAME)
    quarry.close()


def _drift(signal: str) -> float | None:
    return REGISTRY.get_sample_value("quarry_query_drift", {"tenant": "default", "collection": NAME, "signal": signal})


def _scrape(client: TestClient) -> dict[tuple[str, str], float]:
    """``(metric, signal) -> value`` of this collection's drift series in ``GET /metrics``."""
    text = client.get("/metrics").text
    return {
        (s.name, s.labels["signal"]): s.value
        for family in text_string_to_metric_families(text) if family.name.startswith("quarry_query_drift")
        for s in family.samples if s.labels.get("collection") == NAME
    }


def test_scifact_queries_keep_the_drift_low_and_cmrc_queries_move_it(
    service: Quarry, shared_data: Path, counting: CountingEmbedder, capsys: pytest.CaptureFixture[str]
) -> None:
    scifact = _queries(shared_data / "scifact" / "queries.jsonl", REFERENCE + WINDOW)
    cmrc = _queries(shared_data / "cmrc2018-retrieval" / "queries.jsonl", WINDOW)
    counting.inner.embed([*scifact, *cmrc])  # the model's vectors, in batches: each search then finds its own
    scheduler = ReindexScheduler(service, service.settings.reindex.model_copy(update={"on_drift": True}))
    started = time.perf_counter()
    with TestClient(create_app(service)) as client:
        for query in scifact[:10]:  # the REST path (the event loop's search_async) feeds it as well
            assert client.post(f"/v1/collections/{NAME}/search", json={"query": query, "top_k": 5}).status_code == 200
        counted = {("quarry_query_drift_queries", "centroid"): 10, ("quarry_query_drift_queries", "oov"): 10}
        assert _scrape(client) == counted  # no drift figure yet: the reference is not complete
        for query in scifact[10 : REFERENCE - 1]:
            service.search(NAME, query, top_k=5)
        assert _drift("centroid") is None and _drift("oov") is None  # none before the reference is complete
        for query in scifact[REFERENCE - 1 :]:
            service.search(NAME, query, top_k=5)
        english = _scrape(client)
        assert scheduler.due(NAME) is None
        for query in cmrc:
            service.search(NAME, query, top_k=5)
        chinese = _scrape(client)
    elapsed = time.perf_counter() - started
    with capsys.disabled():
        print(f"\nquery drift: SciFact {english}\n             CMRC    {chinese}\n"
              f"{len(scifact) + len(cmrc)} searches in {elapsed:.1f} s")
    # the window holds only queries past the reference: SciFact's own are near it
    assert english[("quarry_query_drift_queries", "centroid")] >= 0.8 * WINDOW
    assert english[("quarry_query_drift", "centroid")] < 0.5 * DRIFT.drift_centroid_max
    assert abs(english[("quarry_query_drift", "oov")]) < 0.5 * DRIFT.drift_oov_max
    # Chinese questions on an English collection: far from the centroid, nearly every term unknown
    assert chinese[("quarry_query_drift", "centroid")] > max(DRIFT.drift_centroid_max,
                                                              5 * english[("quarry_query_drift", "centroid")])
    assert chinese[("quarry_query_drift", "oov")] > 3 * DRIFT.drift_oov_max
    assert chinese[("quarry_query_drift", "centroid")] == _drift("centroid")  # the registry agrees
    due = scheduler.due(NAME)
    assert due is not None and due.trigger == "drift", due
    with capsys.disabled():
        print(f"drift trigger: {due.reason}")
    assert "query drift" in due.reason and "centroid" in due.reason and "OOV share" in due.reason, due.reason


def test_the_recall_trigger_names_the_drift_as_the_probable_cause(service: Quarry, counting: CountingEmbedder) -> None:
    """Recall below the floor while the drift holds (after the test above): the reason says both.

    The ANN answers stand in for a weak index with the store's farthest vectors (those of the
    negated query), as ``tests/core/test_reindex_schedule.py`` does.
    """
    assert service.drift.trigger(NAME).fired  # the CMRC window of the test above
    live = service.live_version(NAME).physical_name
    vectors = counting.embed(["vitamin D and bone density", "statins and muscle pain", "sleep and memory",
                              "smoking and lung cancer", "aspirin and stroke", "exercise and blood pressure"]).vectors
    for vector in vectors:
        far = service.store.search(live, -vector[None, :], 10, with_payload=False)[0]
        service.monitor.measure(Sample(NAME, "cosine", vector, None, 10, tuple(h.id for h in far), live))
    reason = recall_reason(service, NAME)
    assert reason is not None and "below 0.9" in reason and "probable cause, query drift" in reason, reason


@pytest.mark.parametrize("state", ["sqlite", pytest.param("postgres", marks=pytest.mark.integration)])
def test_a_restart_keeps_the_reference_so_a_drifted_workload_still_reads_as_drifted(
    state: str, tmp_path: Path, shared_data: Path, counting: CountingEmbedder, scifact_docs: list[SourceDocument],
) -> None:
    """The reference is the state of record's: a process started after the workload changed compares
    the new queries with the old reference (in memory alone, its reference would be the new queries)."""
    extra: dict[str, object] = {}
    if state == "postgres":  # pgvector and the PostgreSQL state: what replicas share
        extra = {"store": StoreSettings(url=PG_URL), "docstore": DocstoreSettings(url=PG_URL)}
    settings = Settings(data_dir=tmp_path, monitor=DRIFT, **extra)  # type: ignore[arg-type]
    name = f"drift_{uuid.uuid4().hex[:8]}"
    scifact = _queries(shared_data / "scifact" / "queries.jsonl", REFERENCE)
    cmrc = _queries(shared_data / "cmrc2018-retrieval" / "queries.jsonl", WINDOW)
    first = Quarry(settings, embedder=counting)
    try:
        first.create_collection(name, language="en")
        first.upsert(name, scifact_docs[:100])
        for query in scifact:
            first.search(name, query, top_k=5)
        first.view.space.drift.settle()
        kept = first.docstore.get_query_references(name, name)
        assert {s: body["n"] for s, body in kept.items()} == {"centroid": REFERENCE, "oov": REFERENCE}
    finally:
        first.close()
    second = Quarry(settings, embedder=counting)  # a restart (or another replica) after the workload changed
    try:
        for query in cmrc:
            second.search(name, query, top_k=5)
        second.view.space.drift.settle()
        figures = second.view.space.drift.figures(name)
        assert figures is not None and figures.reference == {"centroid": REFERENCE, "oov": REFERENCE}
        assert figures.centroid is not None and figures.centroid > DRIFT.drift_centroid_max, figures
        assert figures.oov is not None and figures.oov > 3 * DRIFT.drift_oov_max, figures
        assert second.docstore.get_query_references(name, name) == kept  # its own window did not replace it
    finally:
        second.drop_collection(name)
        second.close()
