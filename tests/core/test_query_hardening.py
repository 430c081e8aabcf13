"""One client's query is its own failure (issue 20, findings 3, 4 and 5).

* A filter is checked once, up front, for every mode and backend: strings a backend or driver
  refuses (a lone surrogate, NUL), numbers that are not finite, and filters past the size limits
  are a 400 ``InvalidFilter`` in bm25, dense and hybrid alike, never a 500 or an empty 200.
* A store error's text (SQL, driver messages) is logged, never sent to the client.
* One slow query times out alone: it does not open the store's outage breaker, and it holds
  neither another query's batch nor its worker.
* BM25 work of a long (or filtered) REST query runs off the event loop, and a query's distinct
  BM25 terms are capped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

import retrieval.search as search_module
from indexing.bm25 import BM25Index
from indexing.document_rules import SourceDocument
from quarry.api import create_app
from quarry.breaker import OutageBreaker
from quarry.errors import InvalidFilter, StoreError, StoreTimeout, StoreUnavailable
from quarry.service import Quarry
from quarry.settings import BM25Settings, Settings
from retrieval.ann_batching import BatchingSearch
from stores.base import FloatMatrix, ScoredId, VectorRecord, VectorStore
from stores.factory import open_store
from stores.filters import And, Eq, Filter, FilterLimits, In, Or, Range, parse_filter
from tests.core.conftest import CountingEmbedder

MODES = ("bm25", "dense", "hybrid")
BACKENDS = {
    "milvus-lite": lambda tmp: f"milvus://{tmp}/quarry.db",
    "pgvector": lambda _: "postgresql://postgres@127.0.0.1:5433/quarry",
    "qdrant-edge": lambda tmp: f"qdrant://{tmp}/qdrant",
}


def _docs() -> list[SourceDocument]:
    return [
        SourceDocument(f"d{i}", f"cells grow and divide {i}", "", {"tag": "a" if i % 2 else "b", "n": i, "f": i + 0.5})
        for i in range(10)
    ]


@pytest.fixture(params=list(BACKENDS), ids=list(BACKENDS))
def served(request: pytest.FixtureRequest, tmp_path: Path, counting: CountingEmbedder) -> Iterator[tuple[Quarry, str]]:
    """A Quarry on one backend holding a small collection (a unique name: servers are shared)."""
    quarry = Quarry(Settings(data_dir=tmp_path, store={"url": BACKENDS[request.param](tmp_path)}), embedder=counting)
    name = f"h{uuid.uuid4().hex[:10]}"
    quarry.create_collection(name)
    quarry.upsert(name, _docs())
    yield quarry, name
    quarry.drop_collection(name)
    quarry.close()


def _post(client: TestClient, name: str, body: dict[str, Any]) -> Any:
    """POST a search body that may hold NaN or infinity (Python's json, like the server's, takes them)."""
    return client.post(
        f"/v1/collections/{name}/search", content=json.dumps(body, allow_nan=True),
        headers={"content-type": "application/json"},
    )


BAD_FILTERS = {
    "surrogate": ({"tag": "\ud800"}, "unpaired UTF-16 surrogate"),
    "surrogate in $in": ({"tag": {"$in": ["a", "\udc00"]}}, "unpaired UTF-16 surrogate"),
    "NUL": ({"tag": "a\x00b"}, "NUL character"),
    "NaN bound": ({"n": {"$gt": float("nan")}}, "finite"),
    "infinite bound": ({"n": {"$lt": float("inf")}}, "finite"),
    "infinite value": ({"f": float("inf")}, "finite"),
}


@pytest.mark.integration
def test_a_bad_filter_value_is_the_same_400_in_every_mode_on_every_backend(served: tuple[Quarry, str]) -> None:
    """Today: a surrogate is 500 StoreError in dense/hybrid on Milvus and pgvector (200 in bm25), a NUL on
    pgvector a 500 with PostgreSQL's text, a NaN bound 200 in bm25 but 400 on Milvus (a panic on Qdrant edge)."""
    quarry, name = served
    with TestClient(create_app(quarry), raise_server_exceptions=False) as client:
        for label, (flt, why) in BAD_FILTERS.items():
            for mode in MODES:
                r = _post(client, name, {"query": "cells", "mode": mode, "filters": flt})
                assert r.status_code == 400, (label, mode, r.text)
                error = r.json()["error"]
                assert error["type"] == "InvalidFilter" and why in error["message"], (label, mode, error)
        ok = _post(client, name, {"query": "cells", "mode": "hybrid", "filters": {"tag": "a"}})
        assert ok.status_code == 200 and len(ok.json()["hits"]) == 5, ok.text


def test_a_filter_milvus_lite_cannot_take_is_a_400_in_every_mode(service: Quarry, collection: str) -> None:
    """Today a line break in a filter string is a 400 in dense and hybrid on Milvus Lite, a 200 in bm25."""
    service.upsert(collection, _docs())
    with TestClient(create_app(service), raise_server_exceptions=False) as client:
        for mode in MODES:
            r = _post(client, collection, {"query": "cells", "mode": mode, "filters": {"tag": "a\nb"}})
            assert r.status_code == 400, (mode, r.text)
            assert r.json()["error"]["message"] == "Milvus Lite cannot match filter strings that contain line breaks"


def test_filter_size_limits_are_a_400_naming_the_setting(service: Quarry, collection: str) -> None:
    """The instance: a 250,000-value ``$in`` ran a dense search past the 5 s deadline; now refused up front."""
    service.upsert(collection, _docs())
    huge = {"tag": {"$in": [f"v{i}" for i in range(250_000)]}}
    with TestClient(create_app(service), raise_server_exceptions=False) as client:
        for mode in MODES:
            r = _post(client, collection, {"query": "cells", "mode": mode, "filters": huge})
            assert r.status_code == 400, (mode, r.text[:300])
            error = r.json()["error"]
            assert error["type"] == "InvalidFilter", error
            assert "250,000 values; the limit is 1,024 (QUARRY_SEARCH__MAX_FILTER_IN_VALUES)" in error["message"]


def test_filter_limits_count_in_values_total_values_and_depth() -> None:
    limits = FilterLimits(in_values=3, values=5, depth=2)
    assert parse_filter({"t": {"$in": [1, 2, 3]}}, None, limits) is not None
    with pytest.raises(InvalidFilter, match=r"the limit is 3 \(QUARRY_SEARCH__MAX_FILTER_IN_VALUES\)"):
        parse_filter({"t": {"$in": [1, 2, 3, 4]}}, None, limits)
    five = {"$or": [{"t": {"$in": [1, 2, 3]}}, {"u": 1, "v": {"$gt": 0}}]}
    assert parse_filter(five, None, limits) is not None
    with pytest.raises(InvalidFilter, match=r"more than 5 values; .*QUARRY_SEARCH__MAX_FILTER_VALUES"):
        parse_filter({**five, "w": 2}, None, limits)
    two_deep = {"$and": [{"$or": [{"t": 1}, {"u": 2}]}]}
    assert parse_filter(two_deep, None, limits) is not None
    with pytest.raises(InvalidFilter, match=r"more than 2 deep; .*QUARRY_SEARCH__MAX_FILTER_DEPTH"):
        parse_filter({"$and": [two_deep]}, None, limits)
    deep: dict[str, Any] = {"t": 1}
    for _ in range(5000):  # refused at the limit, long before Python's recursion limit
        deep = {"$and": [deep]}
    with pytest.raises(InvalidFilter, match="QUARRY_SEARCH__MAX_FILTER_DEPTH"):
        parse_filter(deep)
    settings = Settings(search={"max_filter_in_values": 2, "max_filter_values": 7, "max_filter_depth": 1})
    assert (settings.search.max_filter_in_values, settings.search.max_filter_values) == (2, 7)


# --- a backend's error text stays in the log -----------------------------------------------------

BACKEND_TEXT = ("unsupported Unicode escape", "invalid input syntax", "codec can't encode", "unwrap")


@pytest.mark.integration
@pytest.mark.parametrize(
    ("backend", "flt"),
    [
        ("pgvector", Eq("tag", "a\x00b")),  # PostgreSQL: unsupported Unicode escape sequence
        ("milvus-lite", Eq("tag", "\ud800")),  # pymilvus: 'utf-8' codec can't encode
        ("qdrant-edge", Range("n", gt=float("nan"))),  # the Rust engine panics
    ],
)
def test_an_engine_failure_is_a_store_error_whose_message_holds_none_of_its_text(
    backend: str, flt: Filter, tmp_path: Path
) -> None:
    """Filters that skipped validation (built by hand) make each engine fail for real."""
    store = open_store(BACKENDS[backend](tmp_path))
    name = f"h{uuid.uuid4().hex[:10]}"
    try:
        store.create_collection(name, 4)
        rng = np.random.default_rng(3)
        vectors = rng.random((8, 4), dtype=np.float32)
        store.upsert(name, [VectorRecord(f"r{i}", vectors[i], {"tag": "a", "n": i}) for i in range(8)])
        with pytest.raises(StoreError) as caught:
            store.search(name, rng.random((1, 4), dtype=np.float32), 3, flt)
        assert not any(text in caught.value.message for text in BACKEND_TEXT), caught.value.message
        assert caught.value.detail and any(text in caught.value.detail for text in BACKEND_TEXT), caught.value.detail
    finally:
        store.drop_collection(name)
        store.close()


@pytest.mark.integration
def test_a_store_error_reaches_the_client_without_the_engines_text(
    tmp_path: Path, counting: CountingEmbedder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Today the body of a NUL filter on pgvector carries PostgreSQL's own error text. With the
    filter check switched off (a gap in validation), the real PostgreSQL error is a 500 whose body
    names the engine and SQLSTATE only; the server log has the driver's text."""
    quarry = Quarry(Settings(data_dir=tmp_path, store={"url": BACKENDS["pgvector"](tmp_path)}), embedder=counting)
    name = f"h{uuid.uuid4().hex[:10]}"
    quarry.create_collection(name)
    quarry.upsert(name, _docs())
    monkeypatch.setattr("stores.filters._check_text", lambda key, value: None, raising=False)
    try:
        with TestClient(create_app(quarry), raise_server_exceptions=False) as client, caplog.at_level(logging.ERROR):
            r = _post(client, name, {"query": "cells", "mode": "dense", "filters": {"tag": "a\x00b"}})
        assert r.status_code == 500, r.text
        assert r.json()["error"]["type"] == "StoreError"
        assert "PostgreSQL" in r.json()["error"]["message"] and "Unicode" not in r.text, r.text
        assert "unsupported Unicode escape sequence" in caplog.text
    finally:
        quarry.drop_collection(name)
        quarry.close()


# --- one slow query is its own failure -------------------------------------------------------------

class GatedStore:
    """A real store whose searches with a ``slow`` filter wait on a gate (a slow query on demand).

    The engines won't produce a query that is slow on cue, so this one behaviour is scripted;
    everything else is the wrapped engine's.
    """

    def __init__(self, inner: VectorStore, *slow: Filter) -> None:
        self.inner = inner
        self.slow = slow
        self.gate = threading.Event()
        self.held = threading.Semaphore(0)

    def search(
        self, name: str, queries: FloatMatrix, top_k: int, flt: Filter | None = None, *, with_payload: bool = True
    ) -> list[list[ScoredId]]:
        if flt in self.slow:
            self.held.release()
            self.gate.wait(30)
        return self.inner.search(name, queries, top_k, flt, with_payload=with_payload)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


SLOW = Eq("tag", "b")
SLOW_TOO = In("tag", ("b",))  # the same rows, another filter: another store call


@pytest.fixture()
def gated(tmp_path: Path, counting: CountingEmbedder) -> Iterator[tuple[Quarry, GatedStore]]:
    store = GatedStore(open_store(f"milvus://{tmp_path}/quarry.db"), SLOW, SLOW_TOO)
    settings = Settings(data_dir=tmp_path, search={"dense_timeout_s": 0.5, "retry_after_s": 60})
    quarry = Quarry(settings, store=store, embedder=counting)  # type: ignore[arg-type]
    quarry.create_collection("docs")
    quarry.upsert("docs", _docs())
    yield quarry, store
    store.gate.set()
    quarry.close()


def test_one_slow_query_times_out_alone_and_does_not_take_dense_from_everyone(
    gated: tuple[Quarry, GatedStore],
) -> None:
    """Today a dense query past its deadline opens the store's outage breaker: every client's dense
    search is then a 503 and hybrid BM25-only for ``retry_after_s``."""
    quarry, store = gated
    url = "/v1/collections/docs/search"
    with TestClient(create_app(quarry), raise_server_exceptions=False) as client:
        slow = client.post(url, json={"query": "cells", "mode": "dense", "filters": {"tag": "b"}})
        late = client.post(url, json={"query": "cells", "mode": "hybrid", "filters": {"tag": "b"}}).json()
        for body in ({"mode": "dense"}, {"mode": "hybrid"}, {"mode": "dense", "filters": {"tag": "a"}}):
            r = client.post(url, json={"query": "cells", **body})
            assert r.status_code == 200 and r.json()["degraded"] == [], (body, r.text)
            assert len(r.json()["hits"]) == (5 if "filters" in body else 10)
        assert quarry.searcher.store_outage is None
        assert slow.status_code == 503, slow.text  # its own failure, retryable
        assert slow.json()["error"]["type"] == "StoreTimeout" and slow.json()["error"]["retryable"]
        assert late["degraded"] == [
            "dense channel skipped, BM25 only: the vector store did not answer within 0.5 s "
            "(QUARRY_SEARCH__DENSE_TIMEOUT_S)"
        ]


def test_timeouts_open_the_breaker_only_several_in_a_row_without_an_answer() -> None:
    breaker = OutageBreaker(StoreUnavailable, 60, timeout=StoreTimeout, timeouts_to_open=3)
    for _ in range(2):
        breaker.record(StoreTimeout("late"))
        assert breaker.check() is None
    breaker.record(None)  # the store answered someone: the count starts again
    breaker.record(StoreTimeout("late"))
    breaker.record(StoreTimeout("late"))
    assert breaker.outage is None
    breaker.record(StoreTimeout("late"))  # third in a row, no answer between: a hung store
    skipped = breaker.check()
    assert skipped is not None and skipped.message.startswith("late (retried in")
    breaker.record(None)
    breaker.record(StoreUnavailable("refused"))  # connection-level: at once
    assert breaker.outage is not None


def test_a_slow_filtered_query_holds_neither_the_batch_nor_the_workers_of_others(
    gated: tuple[Quarry, GatedStore],
) -> None:
    """Today's batcher has two workers for every query and runs a batch's keys one after another:
    two slow filtered queries hold both workers, and every other query waits behind them."""
    quarry, store = gated
    batching = BatchingSearch(store, max_batch=16)  # type: ignore[arg-type]
    vector = quarry.embedder.embed(["cells"]).vectors
    slow = [batching.submit("docs", vector, 5, flt) for flt in (SLOW, SLOW_TOO)]
    for _ in slow:
        assert store.held.acquire(timeout=10)  # both are in the store, waiting
    plain = batching.submit("docs", vector, 5)
    other = batching.submit("docs", vector, 5, Eq("tag", "a"))
    assert len(plain.result(timeout=10)) == 5  # a hang guard, not a speed figure
    assert len(other.result(timeout=10)) == 5
    assert not any(f.done() for f in slow)
    store.gate.set()
    assert all(len(f.result(timeout=10)) == 5 for f in slow)


def test_a_late_query_counts_once_though_its_store_call_times_out_too(gated: tuple[Quarry, GatedStore]) -> None:
    """The caller's deadline and the store call's own deadline are one query's timeout, not two."""
    _, store = gated

    class TimingOut(GatedStore):
        def search(self, name: str, queries: FloatMatrix, top_k: int, flt: Filter | None = None, *,
                   with_payload: bool = True) -> list[list[ScoredId]]:
            super().search(name, queries, top_k, flt, with_payload=with_payload)
            raise StoreTimeout("Milvus search did not answer in time")

    timing_out = TimingOut(store.inner, SLOW)
    batching = BatchingSearch(timing_out, retry_after_s=60)  # type: ignore[arg-type]
    vector = np.zeros((1, 384), dtype=np.float32)
    vector[0, 0] = 1.0
    for _ in range(2):
        asked = batching.submit("docs", vector, 5, SLOW)
        assert timing_out.held.acquire(timeout=10)
        batching.late(asked, StoreTimeout("the vector store did not answer within 0.5 s"))
        timing_out.gate.set()
        with pytest.raises(StoreTimeout):
            asked.result(timeout=10)
        timing_out.gate.clear()
    assert batching.breaker.outage is None  # two queries, two timeouts: not yet an outage


# --- BM25 of a long query off the event loop, distinct terms capped -------------------------------

def test_bm25_of_a_long_or_filtered_query_runs_off_the_event_loop(
    service: Quarry, collection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Today all of a REST query's BM25 work (tokenising, scoring, the filter's row test) runs on
    the event loop: four clients looping 8,192-character queries raised a light client's p50 from
    25 to 355 ms and /healthz's to 92 ms."""
    service.upsert(collection, _docs())
    threads: list[int] = []
    real = search_module.tokenize

    def spy(text: str, language: Any) -> list[str]:
        threads.append(threading.get_ident())
        return real(text, language)

    monkeypatch.setattr(search_module, "tokenize", spy)
    long_query = " ".join(f"cells{i}" for i in range(1000))[:8192]

    async def run(query: str, filters: dict[str, Any] | None = None) -> int:
        threads.clear()
        result = await service.search_async(collection, query, mode="bm25", filters=filters)
        assert len(threads) == 1
        return len(result.hits)

    loop_thread = threading.get_ident()  # asyncio.run runs the loop in this thread
    asyncio.run(run(long_query))
    assert threads[0] != loop_thread
    assert asyncio.run(run("cells grow", {"tag": "a"})) == 5
    assert threads[0] != loop_thread
    assert asyncio.run(run("cells grow")) == 10  # short, unfiltered: stays on the loop (cheaper)
    assert threads[0] == loop_thread


def test_a_query_scores_its_first_max_query_terms_distinct_terms(tmp_path: Path, counting: CountingEmbedder) -> None:
    words = ["alpha", "bravo", "charlie", "delta", "echo"]
    rows = [(f"c{i}", f"d{i}", [w], {}) for i, w in enumerate(words)]
    index = BM25Index.build(rows, BM25Settings(), 1)
    query = ["zulu", "alpha", "bravo", "alpha", "charlie", "delta", "echo"]  # zulu is unknown: not counted
    capped = index.scores(query, max_terms=2)
    np.testing.assert_array_equal(capped, index.scores(["alpha", "bravo", "alpha"]))
    assert (capped > 0).sum() == 2 and (index.scores(query) > 0).sum() == 5

    quarry = Quarry(Settings(data_dir=tmp_path, search={"max_query_terms": 2}), embedder=counting)
    try:
        quarry.create_collection("docs")
        quarry.upsert("docs", [SourceDocument(f"d{i}", w, "", {}) for i, w in enumerate(words)])
        hits = quarry.search("docs", " ".join(words), mode="bm25").hits
        assert sorted(h.document_id for h in hits) == ["d0", "d1"]
    finally:
        quarry.close()


def test_the_compiled_predicate_answers_as_matches() -> None:
    """The BM25 channel tests each row's payload with ``predicate(flt)``; ``matches`` is the reference."""
    import random

    from stores.filters import matches, predicate

    rnd = random.Random(20)
    pool: list[Any] = [0, 1, 2, 1.0, 2.5, True, False, "1", "a", "b", "c"]
    payloads: list[dict[str, Any]] = [{}]
    for _ in range(300):
        payload: dict[str, Any] = {}
        for field in ("x", "y"):
            roll = rnd.random()
            if roll < 0.6:
                payload[field] = rnd.choice(pool)
            elif roll < 0.8:
                payload[field] = rnd.sample(["a", "b", "c", "1"], rnd.randint(0, 3))
        payloads.append(payload)

    def random_filter(depth: int) -> Filter:
        roll = rnd.random()
        if depth < 2 and roll < 0.25:
            subs = tuple(random_filter(depth + 1) for _ in range(rnd.randint(1, 3)))
            return And(subs) if rnd.random() < 0.5 else Or(subs)
        field = rnd.choice(["x", "y", "z"])
        if roll < 0.5:
            return Eq(field, rnd.choice(pool))
        if roll < 0.8:
            return In(field, tuple(rnd.sample(pool, rnd.randint(1, 4))))
        return Range(field, gte=rnd.choice([None, 0, 1]), lt=rnd.choice([None, 2, 2.5]))

    for _ in range(300):
        flt = random_filter(0)
        test = predicate(flt)
        assert [test(p) for p in payloads] == [matches(flt, p) for p in payloads], flt
