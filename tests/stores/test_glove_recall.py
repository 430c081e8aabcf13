"""Recall on real GloVe vectors with the planner's default index, on every backend (issue 3: 2, 3).

Data: ``../shared/data/glove-50-angular-100k`` (100k base, 1k queries, exact top-100 ground truth,
cosine). Per backend: ingest the 100k L2-normalised vectors with a ``tag`` payload (1 % of the rows,
chosen with a fixed seed, get ``"rare"``), build the index :func:`indexing.planner.plan_for_store`
chooses for (100k, 50) under a 16 GiB budget, then

* unfiltered: recall@10 >= 0.95 against the ground truth;
* filtered on ``tag == "rare"`` (1,000 matching rows): exactly 10 hits per query, all matching,
  recall@10 >= 0.90 against exact search over the filtered subset (numpy).

The backend table is the contract suite's (``tests/stores/conftest.py``); ``qdrant-local`` is
qdrant-client's brute-force emulation (exact by construction) and is left out: it evaluates
payload filters in Python and would dominate the run. Build/search times are printed (``-s``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from indexing.ann_data import AnnDataset, exact_top_k, load_ann_dataset, recall_at_k
from indexing.index_sizing import GIB
from indexing.planner import IndexPlan, plan_for_store
from stores.base import ScoredId, VectorRecord, VectorStore
from stores.factory import open_store
from stores.filters import Eq
from tests.stores.conftest import BACKENDS, Backend, _require_service

pytestmark = pytest.mark.slow

TOP_K = 10
RARE_SHARE = 0.01
SEED = 20240601
BATCH = 10_000
GLOVE_BACKENDS = [b for b in BACKENDS if b.id != "qdrant-local"]


@dataclass
class GloveRun:
    """One backend loaded with the GloVe base and indexed with the planner's choice."""

    backend: str
    store: VectorStore
    collection: str
    data: AnnDataset
    rare: npt.NDArray[np.int64]
    plan: IndexPlan
    build_s: float


@pytest.fixture(scope="module")
def glove(shared_data: Path) -> AnnDataset:
    return load_ann_dataset(shared_data / "glove-50-angular-100k")


def rare_rows(n: int) -> npt.NDArray[np.int64]:
    """The deterministic 1 % of row ids tagged ``rare``."""
    rng = np.random.default_rng(SEED)
    return np.sort(rng.choice(n, int(n * RARE_SHARE), replace=False)).astype(np.int64)


def ingest(store: VectorStore, name: str, data: AnnDataset, rare: npt.NDArray[np.int64]) -> None:
    tags = np.full(len(data.base), "common", dtype=object)
    tags[rare] = "rare"
    for start in range(0, len(data.base), BATCH):
        rows = range(start, min(start + BATCH, len(data.base)))
        store.upsert(name, [VectorRecord(str(i), data.base[i], {"tag": str(tags[i])}) for i in rows])


def _params() -> list[object]:
    return [pytest.param(b, id=b.id, marks=[pytest.mark.integration] if b.server else []) for b in GLOVE_BACKENDS]


@pytest.fixture(scope="module", params=_params())
def run(
    request: pytest.FixtureRequest, glove: AnnDataset, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GloveRun]:
    b: Backend = request.param
    url = b.url(tmp_path_factory.mktemp(f"glove-{b.id}"))
    if b.server:
        _require_service(b, url)
    store = open_store(url)
    name = f"glove_{uuid.uuid4().hex[:8]}"
    try:
        store.create_collection(name, glove.dim, "cosine")
        rare = rare_rows(len(glove.base))
        t0 = time.perf_counter()
        ingest(store, name, glove, rare)
        plan = plan_for_store(store, len(glove.base), glove.dim, 16 * GIB, top_k=TOP_K)
        t1 = time.perf_counter()
        store.build_index(name, plan.spec, timeout_s=900)
        build_s = time.perf_counter() - t1
        print(f"\n[{b.id}] ingest {t1 - t0:.1f}s, build {build_s:.1f}s: {plan.explain()}")
        yield GloveRun(b.id, store, name, glove, rare, plan, build_s)
    finally:
        store.drop_collection(name)
        store.close()


def ids_matrix(hits: list[list[ScoredId]]) -> npt.NDArray[np.int64]:
    out = np.full((len(hits), TOP_K), -1, dtype=np.int64)
    for row, found in enumerate(hits):
        ids = [int(h.id) for h in found[:TOP_K]]
        out[row, : len(ids)] = ids
    return out


def test_unfiltered_recall_at_planner_defaults(run: GloveRun) -> None:
    t0 = time.perf_counter()
    hits = run.store.search(run.collection, run.data.queries, TOP_K)
    elapsed = time.perf_counter() - t0
    found = ids_matrix(hits)
    recall = recall_at_k(found, run.data.groundtruth, TOP_K)
    print(f"[{run.backend}] {run.plan.spec.kind} recall@10 = {recall:.4f} ({elapsed:.1f}s / 1k queries)")
    assert all(len(h) == TOP_K for h in hits)
    assert recall >= 0.95, run.plan.explain()


def test_filtered_recall_at_one_percent(run: GloveRun) -> None:
    subset = run.data.base[run.rare]
    truth = run.rare[exact_top_k(subset, run.data.queries, TOP_K)]
    t0 = time.perf_counter()
    hits = run.store.search(run.collection, run.data.queries, TOP_K, flt=Eq("tag", "rare"))
    elapsed = time.perf_counter() - t0
    assert [len(h) for h in hits] == [TOP_K] * len(hits), "fewer than k hits while 1,000 rows match"
    found = ids_matrix(hits)
    assert np.isin(found, run.rare).all(), "a hit does not match the filter"
    assert all(h.payload.get("tag") == "rare" for row in hits for h in row)
    recall = recall_at_k(found, truth, TOP_K)
    print(f"[{run.backend}] filtered recall@10 = {recall:.4f} ({elapsed:.1f}s / 1k queries)")
    assert recall >= 0.90, run.plan.explain()
