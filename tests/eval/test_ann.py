"""ANN vs exact: the recall of a real, deliberately weak HNSW index (Qdrant edge) against the numpy scan."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from eval.ann import ann_vs_exact, similarities, tie_aware_recall
from indexing.ann_data import exact_top_k, recall_at_k
from stores.base import IndexSpec, VectorRecord, VectorStore
from stores.factory import open_store

N, DIM, QUERIES = 3000, 32, 50
Loaded = tuple[VectorStore, np.ndarray, np.ndarray]


def unit(rng: np.random.Generator, rows: int) -> np.ndarray:
    x = rng.normal(size=(rows, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def weak_hnsw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    pytest.importorskip("qdrant_edge")
    rng = np.random.default_rng(0)
    base, queries = unit(rng, N), unit(rng, QUERIES)
    store = open_store(f"qdrant://{Path(tmp_path_factory.mktemp('ann'))}/q")
    store.create_collection("c", DIM)
    store.upsert("c", [VectorRecord(f"r{i}", v) for i, v in enumerate(base)])
    # M 4, efConstruction 8, ef 4 and a 10 KiB full-scan threshold: a graph that misses neighbours.
    spec = IndexSpec("HNSW", "cosine", {"M": 4, "efConstruction": 8, "full_scan_threshold_kb": 10}, {"ef": 4})
    store.build_index("c", spec)
    yield store, base, queries
    store.close()


def test_recall_of_a_weak_index_matches_an_independent_count(weak_hnsw: Loaded) -> None:
    store, base, queries = weak_hnsw
    ids = [f"r{i}" for i in range(N)]
    got = ann_vs_exact(store, "c", ids, [f"q{i}" for i in range(QUERIES)], queries, "cosine")
    assert got["index"]["kind"] == "HNSW" and got["vectors"] == N and got["queries"] == QUERIES
    found = store.search("c", queries, 100, with_payload=False)
    for k in (10, 100):
        rows = np.array([[int(h.id[1:]) for h in hits[:k]] for hits in found], dtype=np.int64)
        assert got["recall"][str(k)] == pytest.approx(recall_at_k(rows, exact_top_k(base, queries, k), k), abs=1e-9)
    assert got["recall"]["10"] < 0.95 and got["recall"]["100"] < 0.95, got["recall"]  # the index costs recall
    assert got["worst"] and got["worst"][0]["recall"] == min(w["recall"] for w in got["worst"])


def test_near_ties_are_not_misses() -> None:
    scores = {"a": 0.9, "b": 0.8, "c": 0.8, "d": 0.1}
    assert tie_aware_recall(["a", "c"], scores, kth_best=0.8, k=2) == 1.0  # c ties b, the exact second
    assert tie_aware_recall(["a", "d"], scores, kth_best=0.8, k=2) == 0.5
    base = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    query = np.array([[0.6, 0.8]], dtype=np.float32)
    assert similarities(base, query, "cosine").tolist() == [[pytest.approx(0.6), pytest.approx(0.8)]]
    assert similarities(base, query, "ip").tolist() == [[pytest.approx(0.6), pytest.approx(1.6)]]
    assert similarities(base, query, "l2")[0, 0] == pytest.approx(-np.hypot(0.4, 0.8))
