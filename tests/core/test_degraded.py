"""The embedding server is down: ingestion fails typed and writes nothing; search degrades."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from embedding.triton import TritonEmbedder
from eval.runner import collection_search
from indexing.document_rules import SourceDocument
from quarry.api import create_app
from quarry.errors import EmbeddingUnavailable, EvaluationError
from quarry.service import Quarry
from quarry.settings import Settings
from tests.core.conftest import CountingEmbedder


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the socket goes: nothing listens there


@pytest.fixture(scope="module")
def ingested(
    tmp_path_factory: pytest.TempPathFactory, counting: CountingEmbedder, scifact_docs: list[SourceDocument]
) -> Path:
    """A data dir holding collection ``docs`` (30 SciFact documents, the packaged model), made once.

    Each test opens its own service on it (its own breaker state and settings); none writes to it.
    """
    data = tmp_path_factory.mktemp("degraded-data")
    up = Quarry(Settings(data_dir=data), embedder=counting)
    up.create_collection("docs")
    up.upsert("docs", scifact_docs[:30])
    up.close()
    return data


@pytest.fixture()
def down(ingested: Path) -> Iterator[Quarry]:
    # the same data, now with a real Triton client pointed at a server that is not running
    dead = TritonEmbedder.from_url(f"triton+grpc://127.0.0.1:{_closed_port()}/minilm", timeout_s=1.0)
    quarry = Quarry(Settings(data_dir=ingested, search={"retry_after_s": 60}), embedder=dead)
    yield quarry
    quarry.close()


def test_ingestion_fails_typed_and_writes_nothing(down: Quarry) -> None:
    before = down.describe("docs")
    with pytest.raises(EmbeddingUnavailable, match="127.0.0.1"):
        down.upsert("docs", [SourceDocument("new", "a brand new document")])
    assert down.describe("docs") == before


def test_search_degrades_to_bm25_or_returns_503(down: Quarry, scifact_docs: list[SourceDocument]) -> None:
    with TestClient(create_app(down), raise_server_exceptions=False) as client:
        url = "/v1/collections/docs/search"
        r = client.post(url, json={"query": scifact_docs[4].title, "mode": "hybrid"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["hits"][0]["document_id"] == scifact_docs[4].id
        assert body["degraded"] and "BM25 only" in body["degraded"][0]
        assert set(body["hits"][0]["explain"]) == {"bm25"}  # one channel left: its own scores, no fusion
        dense = client.post(url, json={"query": "anything", "mode": "dense"})
        assert dense.status_code == 503 and dense.json()["error"]["type"] == "EmbeddingUnavailable"
        assert dense.json()["error"]["retryable"] is True
        # after the outage was seen, queries skip the server for retry_after_s instead of each
        # waiting out the client's retries
        assert dense.headers["retry-after"] in {"59", "60"}
        assert re.search(r"127\.0\.0\.1.*\(retried in (59|60)\.\d s\)$", dense.json()["error"]["message"])
        again = client.post(url, json={"query": scifact_docs[4].title, "mode": "hybrid"}).json()
        assert again["degraded"][0].endswith(" s)") and again["hits"][0]["document_id"] == scifact_docs[4].id
        assert client.get("/readyz").status_code == 200  # the store is fine; readiness is about the store


def test_evaluation_stops_rather_than_score_bm25_as_hybrid(down: Quarry) -> None:
    search = collection_search(down, "docs")
    assert search("vitamin d", "bm25", 10)  # BM25 alone is what was asked: fine
    with pytest.raises(EvaluationError, match=r"hybrid query 'vitamin d' was degraded \(dense channel skipped"):
        search("vitamin d", "hybrid", 10)


def test_submit_to_a_down_server_never_blocks_the_caller_and_the_future_raises(down: Quarry) -> None:
    """The REST API submits on its event loop: warm-up retries must run elsewhere."""
    future = down.query_embedder.submit(["anything"])  # returns a future; raises nothing here
    with pytest.raises(EmbeddingUnavailable, match="127.0.0.1"):
        future.result(timeout=60)


@pytest.fixture(params=[0.0, 60.0], ids=["no-skip", "skip"])
def hung(request: pytest.FixtureRequest, ingested: Path) -> Iterator[Quarry]:
    """A Triton address that accepts TCP connections and never answers (a hung server)."""
    settings = Settings(data_dir=ingested, search={"dense_timeout_s": 0.5, "retry_after_s": request.param})
    with socket.socket() as peer:
        peer.bind(("127.0.0.1", 0))
        peer.listen(16)  # the kernel completes handshakes; nothing reads or writes
        port = peer.getsockname()[1]
        stuck = TritonEmbedder.from_url(f"triton+grpc://127.0.0.1:{port}/minilm?retries=1", timeout_s=3.0)
        quarry = Quarry(settings, embedder=stuck)
        yield quarry
        quarry.close()


def test_a_rest_query_waits_at_most_dense_timeout_for_a_hung_server(
    hung: Quarry, scifact_docs: list[SourceDocument]
) -> None:
    late = "no query vector within 0.5 s (QUARRY_SEARCH__DENSE_TIMEOUT_S)"
    with TestClient(create_app(hung), raise_server_exceptions=False) as client:
        url = "/v1/collections/docs/search"
        r = client.post(url, json={"query": scifact_docs[4].title, "mode": "hybrid"})
        assert r.status_code == 200, r.text
        assert r.json()["degraded"] == [f"dense channel skipped, BM25 only: {late}"]
        assert r.json()["hits"][0]["document_id"] == scifact_docs[4].id
        dense = client.post(url, json={"query": "anything", "mode": "dense"})
        assert dense.status_code == 503, dense.text
        error = dense.json()["error"]
        assert error["type"] == "EmbeddingUnavailable" and error["retryable"] is True
        if hung.settings.search.retry_after_s == 0:
            assert error["message"] == late
        else:  # the late server is then skipped like a down one: no second 0.5 s wait
            assert re.fullmatch(re.escape(late) + r" \(retried in (59|60)\.\d s\)", error["message"]), error
            assert dense.headers["retry-after"] in {"59", "60"}
    if hung.settings.search.retry_after_s == 0:
        # outside the REST API nothing is cut short: the CLI and `quarry eval` wait for the server's own answer
        with pytest.raises(EmbeddingUnavailable, match="127.0.0.1"):
            hung.search("docs", "anything", mode="dense")
