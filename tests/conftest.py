"""Shared fixtures: offline model hub, the shared evaluation data, the one torch MiniLM and its vectors."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from embedding import sentence_transformers as st
from indexing.chunking import chunk_text
from indexing.document_plan import indexed_text
from indexing.sources import read_documents
from quarry.settings import IngestSettings
from tests.embedding_cache import MODEL_CACHE_ENV, CachedEmbedder, shared_model_cache, torch_vectors
from tests.tiny_embedder import build_tiny_bi_encoder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The default encoder (ONNX int8) is exported once for the whole suite, not once per test's data
# dir: every Settings() here and every child process that inherits the environment reads it.
os.environ.setdefault(MODEL_CACHE_ENV, str(shared_model_cache()))
# A REST query waits QUARRY_SEARCH__DENSE_TIMEOUT_S (5 s by default) for its query vector before it
# degrades to BM25. Three workers on 2 loaded cores passed that deadline (a cold CI run: three
# test_api searches came back BM25-only), so the suite's services wait 120 s; the tests of the
# deadline itself set their own (0.5-30 s) against a store or embedder that stalls on purpose.
os.environ.setdefault("QUARRY_SEARCH__DENSE_TIMEOUT_S", "120")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` beside the checkout (SciFact, CMRC2018, GloVe-100k); never copied in."""
    for candidate in (REPO.parent / "shared" / "data", REPO / "shared" / "data"):
        if candidate.is_dir():
            return candidate
    raise RuntimeError(f"shared evaluation data not found beside {REPO} (expected ../shared/data)")


@pytest.fixture(scope="session")
def minilm() -> st.SentenceTransformerEmbedder:
    """The packaged MiniLM in torch on CPU, loaded once per session: for tests of the embedder itself."""
    model = st.SentenceTransformerEmbedder("all-MiniLM-L6-v2", batch_size=64, device="cpu")
    model.warm_up()
    return model


@pytest.fixture(scope="session")
def minilm_vectors(minilm: st.SentenceTransformerEmbedder) -> Iterator[CachedEmbedder]:
    """The torch MiniLM's own vectors, each distinct text run once per machine (``tests/embedding_cache.py``).

    For tests that need its vectors as data: the reference other backends are compared with,
    the service's embedder in the pipeline, API and quality tests.
    """
    cached = torch_vectors(minilm)
    yield cached
    cached.close()


@pytest.fixture(scope="session")
def tiny_bi_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random bi-encoder folder (``tests/tiny_embedder.py``) for tests that score no vector."""
    return build_tiny_bi_encoder(tmp_path_factory.mktemp("tiny-bi"), seed=0)


@pytest.fixture(scope="session")
def scifact_chunks(shared_data: Path) -> list[list[str]]:
    """What the service embeds when it ingests SciFact with the default chunking: per document, its texts.

    5,183 documents, 7,559 texts in all; each is a chunk as ``indexing.pipeline`` builds it (title,
    newline, chunk), documents and chunks in corpus order. The quality tests' ingest embeds them
    all and the ONNX-vs-torch check the first chunks, so the torch model runs over SciFact once
    per machine (``minilm_vectors``), not once per test. A document's first chunk has the same word-pieces as
    ``title + " " + text`` cut at the model's 256 tokens.
    """
    ingest = IngestSettings()
    return [
        [
            indexed_text(doc.title if doc.text else "", piece.text)
            for piece in chunk_text(doc.text or doc.title, ingest.chunk_size, ingest.chunk_overlap)
        ]
        for doc in read_documents(shared_data / "scifact")
    ]
