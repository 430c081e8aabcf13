"""Fixtures for the core pipeline: one real Quarry (Milvus Lite + packaged MiniLM) per session."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from embedding.base import Embedder, EmbedderWrapper, Embeddings
from indexing.document_rules import SourceDocument
from indexing.sources import iter_jsonl
from quarry.service import Quarry
from quarry.settings import DocstoreSettings, Settings, StoreSettings
from tests.embedding_cache import CachedEmbedder


def wait_until(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` every millisecond; fail the test if it is not true within 10 s."""
    for _ in range(10_000):
        if condition():
            return
        time.sleep(0.001)
    raise AssertionError("condition not reached in 10 s")


class CountingEmbedder(EmbedderWrapper):
    """Wraps the REAL embedder and counts the calls and texts it is asked to embed (no fake inference).

    The counts are what the caller asked for, whether the rows then came from the model or from
    the memo of its earlier output (:class:`tests.embedding_cache.CachedEmbedder`).
    """

    def __init__(self, inner: Embedder) -> None:
        super().__init__(inner)
        self.calls = 0
        self.texts = 0

    def embed(self, texts: Sequence[str]) -> Embeddings:
        self.calls += 1
        self.texts += len(texts)
        return self.inner.embed(texts)

    def embed_queries(self, texts: Sequence[str]) -> Embeddings:
        self.calls += 1
        self.texts += len(texts)
        return self.inner.embed_queries(texts)


@pytest.fixture(scope="session")
def counting(minilm_vectors: CachedEmbedder) -> CountingEmbedder:
    """The service's embedder in these tests: the torch MiniLM's vectors, each text run once per machine."""
    return CountingEmbedder(minilm_vectors)


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory, counting: CountingEmbedder) -> Iterator[Quarry]:
    data = tmp_path_factory.mktemp("quarry-data")
    quarry = Quarry(Settings(data_dir=data), embedder=counting)
    yield quarry
    quarry.close()


_names = itertools.count()


@pytest.fixture()
def collection(service: Quarry) -> Iterator[str]:
    """A fresh, empty collection (language auto), dropped afterwards."""
    name = f"t{next(_names)}"
    service.create_collection(name)
    yield name
    service.drop_collection(name)


@pytest.fixture(scope="session")
def scifact_docs(shared_data: Path) -> list[SourceDocument]:
    """The first 300 SciFact documents plus the documents judged for the first 20 test queries."""
    docs = list(iter_jsonl(shared_data / "scifact" / "corpus.jsonl"))
    judged = set()
    with (shared_data / "scifact" / "qrels" / "test.tsv").open() as fh:
        next(fh)
        for line in itertools.islice(fh, 20):
            judged.add(line.split("\t")[1])
    return [d for i, d in enumerate(docs) if i < 300 or d.id in judged]


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def projected_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second real model: the packaged MiniLM plus a seeded 384 -> 128 dense layer."""
    import torch
    from sentence_transformers import SentenceTransformer, models

    from embedding.sentence_transformers import resolve_model_path

    torch.manual_seed(0)
    base = SentenceTransformer(str(resolve_model_path("all-MiniLM-L6-v2")), device="cpu", local_files_only=True)
    dense = models.Dense(384, 128, activation_function=torch.nn.Identity())
    model = SentenceTransformer(modules=[*base, dense, models.Normalize()], device="cpu")
    path = tmp_path_factory.mktemp("minilm-128")
    model.save(str(path))
    return path


PG_URL = os.environ.get("QUARRY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5433/quarry")


@pytest.fixture(scope="module", params=["milvus-lite", pytest.param("pgvector", marks=pytest.mark.integration)])
def svc(
    request: pytest.FixtureRequest, service: Quarry, counting: CountingEmbedder,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Quarry]:
    """The session's Milvus Lite service, or one on pgvector with the PostgreSQL docstore (per module)."""
    if request.param == "milvus-lite":
        yield service
        return
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("quarry-pg"), store=StoreSettings(url=PG_URL),
        docstore=DocstoreSettings(url=PG_URL),
    )
    quarry = Quarry(settings, embedder=counting)
    yield quarry
    quarry.close()
