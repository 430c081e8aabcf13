"""Fixtures of the reranker tests: a tiny cross-encoder built locally, SciFact pairs."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from rerank.cross_encoder import CrossEncoderReranker
from rerank.tiny import build_tiny_cross_encoder

N_PASSAGES = 50


def stepping_clock(step_s: float) -> Callable[[], float]:
    """A clock that advances ``step_s`` seconds at every read (a budget's outcome is then known in advance)."""
    now = [0.0]

    def read() -> float:
        now[0] += step_s
        return now[0]

    return read


@dataclass(frozen=True)
class Pairs:
    query: str
    passages: list[str]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-ce"), seed=0)


@pytest.fixture(scope="session")
def reranker(tiny_model_dir: Path) -> CrossEncoderReranker:
    model = CrossEncoderReranker(str(tiny_model_dir), device="cpu", batch_size=32)
    model.warm_up()
    return model


@pytest.fixture(scope="session")
def scifact_pairs(shared_data: Path) -> Pairs:
    """The first SciFact test query and 50 corpus passages, its relevant documents among them."""
    root = shared_data / "scifact"
    rows = (root / "qrels" / "test.tsv").read_text().splitlines()[1:]
    query_id = rows[0].split("\t")[0]
    relevant = {r.split("\t")[1] for r in rows if r.split("\t")[0] == query_id}
    queries = (json.loads(line) for line in (root / "queries.jsonl").open())
    query = next(q["text"] for q in queries if q["_id"] == query_id)
    hits: list[str] = []
    others: list[str] = []
    with (root / "corpus.jsonl").open() as corpus:
        for line in corpus:
            doc = json.loads(line)
            text = f"{doc['title']} {doc['text']}"
            if doc["_id"] in relevant:
                hits.append(text)
            elif len(others) < N_PASSAGES - len(relevant):
                others.append(text)
    passages = others[:20] + hits + others[20:]
    assert len(passages) == N_PASSAGES
    return Pairs(query, passages)
