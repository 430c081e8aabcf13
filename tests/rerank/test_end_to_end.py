"""Rerank of the fused top-50 through the real query path: SciFact subset in Milvus Lite,
packaged MiniLM for the dense channel, the locally built tiny cross-encoder for the rerank."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from indexing.document_rules import SourceDocument
from quarry.service import Quarry
from quarry.settings import RerankSettings, Settings
from rerank.cross_encoder import CrossEncoderReranker
from retrieval.results import RerankOptions
from tests.rerank.conftest import stepping_clock

N_DOCS = 150
COLLECTION = "scifact_rerank"
RERANK_TOP_N = 20  # QUARRY_RERANK__TOP_N of the service: the REST default when a request omits it


@pytest.fixture(scope="module")
def query(shared_data: Path) -> str:
    first = (shared_data / "scifact" / "queries.jsonl").open().readline()
    return str(json.loads(first)["text"])


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, shared_data: Path) -> Iterator[Quarry]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("quarry-rerank"),
        rerank=RerankSettings(model=str(tiny_model_dir), device="cpu", batch_size=16, top_n=RERANK_TOP_N),
    )
    quarry = Quarry(settings, clock=stepping_clock(0.001))  # the budget's clock: 1 ms per read
    docs = []
    with (shared_data / "scifact" / "corpus.jsonl").open() as corpus:
        for line, _ in zip(corpus, range(N_DOCS), strict=False):
            doc = json.loads(line)
            docs.append(SourceDocument(id=doc["_id"], text=doc["text"], title=doc["title"]))
    quarry.create_collection(COLLECTION, language="en")
    quarry.upsert(COLLECTION, docs)
    yield quarry
    quarry.close()


def test_the_fused_top_50_is_reordered_by_the_cross_encoder(service: Quarry, query: str) -> None:
    fused = service.search(COLLECTION, query, top_k=50)
    result = service.search(
        COLLECTION, query, top_k=50, rerank=RerankOptions(top_n=50, budget_ms=60_000, batch_size=16)
    )
    assert result.reranked is True
    assert result.rerank_reason is None
    assert len(result.hits) == len(fused.hits) == 50
    assert {h.document_id for h in result.hits} == {h.document_id for h in fused.hits}
    scores = np.array([h.score for h in result.hits], dtype=np.float32)
    assert (np.diff(scores) <= 0).all()
    assert all("rerank" in h.explain for h in result.hits)
    # The scores are the cross-encoder's on the passages shown.
    assert isinstance(service.reranker, CrossEncoderReranker)
    expected = service.reranker.score(query, [h.text for h in result.hits])
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(scores, expected, rtol=0, atol=2e-5 * scale)
    assert [h.document_id for h in result.hits] != [h.document_id for h in fused.hits]


def test_a_budget_of_a_few_ms_returns_the_fused_order(service: Quarry, query: str) -> None:
    fused = service.search(COLLECTION, query, top_k=10)
    result = service.search(COLLECTION, query, top_k=10, rerank=RerankOptions(top_n=50, budget_ms=2, batch_size=8))
    assert result.reranked is False
    assert result.rerank_reason == "rerank budget 2 ms exceeded after 24/50 pairs (3.0 ms spent)"
    assert [h.chunk_id for h in result.hits] == [h.chunk_id for h in fused.hits]
    assert all("rerank" not in h.explain for h in result.hits)


def test_rest_rerank_defaults_to_the_server_top_n_and_pages_stay_inside_it(service: Quarry, query: str) -> None:
    from fastapi.testclient import TestClient

    from quarry.api import create_app

    with TestClient(create_app(service)) as client:
        url = f"/v1/collections/{COLLECTION}/search"
        body = {"query": query, "top_k": RERANK_TOP_N, "rerank": {"budget_ms": 60_000}}
        page = client.post(url, json=body).json()
        assert page["reranked"] is True and len(page["hits"]) == RERANK_TOP_N
        assert sorted(h["explain"]["rerank"]["rank_before"] for h in page["hits"]) == list(range(1, RERANK_TOP_N + 1))
        scores = [h["score"] for h in page["hits"]]
        assert scores == sorted(scores, reverse=True)
        tail = client.post(url, json={**body, "offset": 10, "top_k": 10}).json()
        assert [h["chunk_id"] for h in tail["hits"]] == [h["chunk_id"] for h in page["hits"][10:]]
        past = client.post(url, json={**body, "offset": 10, "top_k": 11})
        assert past.status_code == 400
        assert f"offset + top_k must be <= rerank.top_n ({RERANK_TOP_N}" in past.json()["error"]["message"]
        other = client.post(url, json={"query": query, "rerank": {"model": "cross-encoder/other"}})
        assert other.status_code == 400 and "is not loaded; this server reranks with" in other.text


def test_a_broken_reranker_fails_the_start_even_with_the_embedder_down(tmp_path: Path) -> None:
    """A server tolerates a down embedding server (BM25 meanwhile), not a reranker that cannot load."""
    from quarry.errors import ConfigError
    from quarry.settings import EmbeddingSettings

    settings = Settings(
        data_dir=tmp_path, embedding=EmbeddingSettings(url="triton+http://127.0.0.1:1/minilm", timeout_s=1),
        rerank=RerankSettings(model=str(tmp_path / "no-such-model"), device="cpu"),
    )
    quarry = Quarry(settings)
    try:
        with pytest.raises(ConfigError, match="no-such-model"):
            quarry.warm_up()
    finally:
        quarry.close()
