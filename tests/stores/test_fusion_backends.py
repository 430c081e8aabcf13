"""Every fusion method on every backend of the store contract (issue 24, acceptance 4).

Fusion runs above the stores, but what it fuses (the dense channel's candidates and scores)
comes from each engine: the hybrid answer must be the pure :func:`retrieval.fusion.fuse` of the
two channels as that engine returns them, for RRF and every weighted normalisation, and BM25's
top hit must survive every method at any dense weight below 1.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from indexing.collections import FusionConfig
from indexing.document_rules import SourceDocument
from quarry.service import Quarry
from quarry.settings import Settings, StoreSettings
from retrieval.fusion import Fusion, fuse
from tests.embedding_cache import CachedEmbedder
from tests.stores.conftest import Backend

SETTINGS = [
    ({}, Fusion("rrf", 60, {"bm25": 1.0, "dense": 1.0})),
    ({"method": "rrf", "k": 5, "weights": {"dense": 0.3}}, Fusion("rrf", 5, {"bm25": 1.0, "dense": 0.3})),
    *[
        ({"method": "weighted", "normalization": n, "weights": {"bm25": 0.6, "dense": 0.4}},
         Fusion("weighted", 60, {"bm25": 0.6, "dense": 0.4}, n))
        for n in ("minmax", "zscore", "dbsf")
    ],
]
KEYWORD = "zorblax"  # in one document only, meaningless to the dense model


@pytest.fixture(scope="module")
def fused(
    backend: Backend, tmp_path_factory: pytest.TempPathFactory, minilm_vectors: CachedEmbedder, shared_data: Path
) -> Iterator[tuple[Quarry, str, list[SourceDocument]]]:
    # A store of its own: an embedded engine's folder is locked by the session's open store
    # (Qdrant local refuses a second client), the servers are shared.
    url = backend.url(tmp_path_factory.mktemp(f"fusion-{backend.id}"))
    quarry = Quarry(
        Settings(data_dir=tmp_path_factory.mktemp("fusion"), store=StoreSettings(url=url)),
        embedder=minilm_vectors,
    )
    name = f"fusion_{uuid.uuid4().hex[:8]}"
    with (shared_data / "scifact" / "corpus.jsonl").open(encoding="utf-8") as fh:
        rows = [json.loads(line) for line in itertools.islice(fh, 80)]
    docs = [SourceDocument(id=r["_id"], text=r["text"], title=r["title"]) for r in rows]
    docs.append(SourceDocument(id="odd", text=f"A note on {KEYWORD} and nothing else of the corpus.", title=""))
    quarry.create_collection(name, language="en")
    try:
        quarry.upsert(name, docs)
        yield quarry, name, docs
    finally:
        quarry.drop_collection(name)
        quarry.close()


def test_every_fusion_method_is_the_pure_fusion_of_this_engines_channels(
    fused: tuple[Quarry, str, list[SourceDocument]],
) -> None:
    quarry, name, docs = fused
    window = quarry.searcher.window
    for query in (docs[3].title, docs[40].title):
        channels = {
            c: [(h.document_id, h.score) for h in quarry.search(name, query, mode=c, top_k=window).hits]  # type: ignore[arg-type]
            for c in ("bm25", "dense")
        }
        assert channels["bm25"] and channels["dense"]
        for body, setting in SETTINGS:
            result = quarry.search(name, query, top_k=10, fusion=FusionConfig.model_validate(body) if body else None)
            expected = fuse(channels, setting, 10)
            assert [h.document_id for h in result.hits] == [f.id for f in expected], body
            assert [h.score for h in result.hits] == pytest.approx([f.score for f in expected]), body


def test_bm25s_top_hit_survives_every_method_at_any_dense_weight_below_1(
    fused: tuple[Quarry, str, list[SourceDocument]],
) -> None:
    """On each engine; a hit only one channel found is covered by the pure tests (tests/core/test_fusion.py)."""
    quarry, name, _ = fused
    assert quarry.search(name, KEYWORD, mode="bm25", top_k=1).hits[0].document_id == "odd"
    for body, _setting in SETTINGS:
        for dense_weight in (0.0, 0.5, 0.99):
            fusion = FusionConfig.model_validate({**body, "weights": {"bm25": 1.0, "dense": dense_weight}})
            ids = [h.document_id for h in quarry.search(name, KEYWORD, top_k=10, fusion=fusion).hits]
            assert "odd" in ids, (body, dense_weight, ids)
