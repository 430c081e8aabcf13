"""Fixtures of the embedding tests: SciFact texts, an ONNX cache (the torch model is in ``tests/conftest.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


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
