"""Rerank of the fused top-50 through the real query path: SciFact subset in Milvus Lite,
packaged MiniLM for the dense channel, the locally built tiny cross-encoder for the rerank."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from indexing.sources import SourceDocument
from quarry.service import Quarry
from quarry.settings import RerankSettings, Settings
from rerank.cross_encoder import CrossEncoderReranker
from retrieval.search import RerankOptions

N_DOCS = 150
COLLECTION = "scifact_rerank"


@pytest.fixture(scope="module")
def query(shared_data: Path) -> str:
    first = (shared_data / "scifact" / "queries.jsonl").open().readline()
    return str(json.loads(first)["text"])


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, shared_data: Path) -> Iterator[Quarry]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("quarry-rerank"),
        rerank=RerankSettings(model=str(tiny_model_dir), device="cpu", batch_size=16),
    )
    quarry = Quarry(settings)
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
    assert (result.rerank_reason or "").startswith("rerank budget 2 ms exceeded after ")
    assert [h.chunk_id for h in result.hits] == [h.chunk_id for h in fused.hits]
    assert all("rerank" not in h.explain for h in result.hits)
