"""Fixtures of the embedding tests: SciFact texts, an ONNX cache, the ONNX embedders and their vectors.

The torch model and its vectors are in ``tests/conftest.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from embedding.onnx import OnnxEmbedder
from tests.embedding_cache import CachedEmbedder, onnx_vectors


def scifact_texts(shared_data: Path, limit: int | None = None) -> list[str]:
    """SciFact documents as ``title + " " + text`` (most exceed the 256-token limit)."""
    texts = []
    with (shared_data / "scifact" / "corpus.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)
            texts.append(f"{doc['title']} {doc['text']}".strip())
            if limit is not None and len(texts) >= limit:
                break
    return texts


@pytest.fixture(scope="session")
def scifact_subset(shared_data: Path) -> list[str]:
    return scifact_texts(shared_data, 96)


@pytest.fixture(scope="session")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model cache for the session: each ONNX export happens once."""
    return tmp_path_factory.mktemp("models")


def _onnx(onnx_cache: Path, quantize: str) -> OnnxEmbedder:
    embedder = OnnxEmbedder.from_url(f"onnx://all-MiniLM-L6-v2?quantize={quantize}", onnx_cache, batch_size=32)
    embedder.warm_up()
    return embedder


@pytest.fixture(scope="session")
def fp32(onnx_cache: Path) -> OnnxEmbedder:
    """The packaged MiniLM exported to ONNX, fp32 (one session for the whole run)."""
    return _onnx(onnx_cache, "none")


@pytest.fixture(scope="session")
def int8(onnx_cache: Path) -> OnnxEmbedder:
    """The packaged MiniLM exported to ONNX, int8 (one session for the whole run)."""
    return _onnx(onnx_cache, "int8")


def _onnx_vectors(embedder: OnnxEmbedder) -> CachedEmbedder:
    """The embedder's rows, each distinct text run once per machine (``tests/embedding_cache.py``)."""
    return onnx_vectors(embedder)


@pytest.fixture(scope="session")
def int8_vectors(int8: OnnxEmbedder) -> Iterator[CachedEmbedder]:
    """int8 ONNX rows as data: the SciFact check against torch and the int8 nDCG test share them."""
    cached = _onnx_vectors(int8)
    yield cached
    cached.close()


@pytest.fixture(scope="session")
def fp32_vectors(fp32: OnnxEmbedder) -> Iterator[CachedEmbedder]:
    """fp32 ONNX rows as data (the SciFact check against torch)."""
    cached = _onnx_vectors(fp32)
    yield cached
    cached.close()
