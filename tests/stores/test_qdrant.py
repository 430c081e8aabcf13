"""Qdrant-specific checks beyond the contract suite (``test_contract.py`` covers the Protocol).

Against the real engines: qdrant-edge (Qdrant's engine in process) and qdrant-client's local
mode. What is checked here is what the contract cannot see: that an HNSW build really builds
and walks a graph (not a brute-force scan), that a filtered graph search at 1 % selectivity still
returns exactly k hits, that a stalled build is killed and rolled back, quantized builds, the
hidden id/boolean payload keys, and the URL forms.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quarry.errors import (
    ConfigError,
    IndexBuildFailed,
    InvalidRequest,
    StoreUnavailable,
    UnsupportedIndex,
)
from stores import qdrant_filters as qf
from stores.base import IndexSpec, VectorRecord
from stores.factory import open_store
from stores.filters import And, Eq, In, Or, Range, matches
from stores.qdrant import QdrantClientStore, QdrantEdgeStore

N, DIM, K = 20_000, 50, 10


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def exact_ids(data: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(queries @ data.T), axis=1)[:, :k]


def recall(hits: list[list[Any]], truth: np.ndarray) -> float:
    found = [{int(h.id) for h in row} for row in hits]
    return float(np.mean([len(f & set(t.tolist())) / len(t) for f, t in zip(found, truth, strict=True)]))


@pytest.fixture()
def edge(tmp_path: Path) -> Iterator[QdrantEdgeStore]:
    store = open_store(f"qdrant://{tmp_path}/edge")
    assert isinstance(store, QdrantEdgeStore)
    yield store
    store.close()


@pytest.fixture()
def local(tmp_path: Path) -> Iterator[QdrantClientStore]:
    store = open_store(f"qdrant+local://{tmp_path}/local")
    assert isinstance(store, QdrantClientStore)
    yield store
    store.close()


# -- URLs ------------------------------------------------------------------------------------


def test_url_forms(tmp_path: Path) -> None:
    for bad in ("qdrant:relative/dir", "qdrant+local:relative/dir", "qdrant+local://host/dir"):
        with pytest.raises(ConfigError):
            open_store(bad)
    with pytest.raises(StoreUnavailable):
        open_store("qdrant://127.0.0.1:1")
    local = open_store(f"qdrant+local://{tmp_path}/l")
    try:
        caps = local.capabilities()
        assert caps.engine == "qdrant-local" and caps.index_kinds == {"FLAT", "HNSW"}
    finally:
        local.close()
    edge = open_store(f"qdrant://{tmp_path}/e")
    try:
        caps = edge.capabilities()
        assert (caps.engine, caps.version, caps.persistent) == ("qdrant-edge", "0.9.0", True)
    finally:
        edge.close()


def test_search_threads_option(tmp_path: Path) -> None:
    for bad in ("?search_threads=0", "?search_threads=x", "?threads=2"):
        with pytest.raises(ConfigError, match="search_threads"):
            open_store(f"qdrant://{tmp_path}/bad{bad}")
    rng = np.random.default_rng(3)
    data = rng.standard_normal((300, 8)).astype(np.float32)
    url = f"qdrant://{tmp_path}/one?search_threads=1"
    store = open_store(url)
    try:
        store.create_collection("c", 8)
        store.upsert("c", [VectorRecord(str(i), data[i], {"i": i}) for i in range(300)])
        store.build_index("c", IndexSpec("HNSW", "cosine", {"M": 8, "efConstruction": 32}, {"ef": 64}))
        before = [h.id for h in store.search("c", data[:2], 5)[0]]
    finally:
        store.close()
    again = open_store(url)  # reopened with the built index's config plus the pool size
    try:
        assert [h.id for h in again.search("c", data[:2], 5)[0]] == before
        assert again.describe_index("c") is not None
    finally:
        again.close()


# -- filters, ids and payloads ---------------------------------------------------------------


def test_filter_compiler_is_structured() -> None:
    from qdrant_client import models as m

    dialect = qf.Dialect(
        m.Filter, m.FieldCondition, lambda v: m.MatchValue(value=v),
        lambda vs: m.MatchAny(any=vs), m.Range,
        lambda key: m.IsEmptyCondition(is_empty=m.PayloadField(key=key)), lambda ids: m.HasIdCondition(has_id=ids),
    )
    flt = qf.compile_filter(And((Eq("s", '" or 1==1'), In("n", (1, 2.5)), Range("f", lt=0.5))), dialect)
    must = flt.must
    assert must[0] == m.FieldCondition(key="s", match=m.MatchValue(value='" or 1==1'))
    assert must[1] == m.Filter(should=[
        m.FieldCondition(key="n", range=m.Range(gte=1, lte=1)),
        m.FieldCondition(key="n", range=m.Range(gte=2.5, lte=2.5)),
    ])
    assert must[2] == m.FieldCondition(key="f", range=m.Range(lt=0.5))
    mixed = qf.compile_filter(In("s", ("a", "b", True)), dialect)
    assert mixed.must[0].should[0] == m.FieldCondition(key="s", match=m.MatchAny(any=["a", "b"]))


@pytest.mark.parametrize("which", ["edge", "local"])
def test_payload_round_trip_hides_internal_keys(which: str, request: pytest.FixtureRequest) -> None:
    store = request.getfixturevalue(which)
    rng = np.random.default_rng(0)
    store.create_collection("c", 8)
    payloads = [{"b": True, "n": 3, "x": 3.0, "tags": ["a", "b"]}, {"b": False, "n": 3.0}, {}]
    vectors = unit(rng, 3, 8)
    store.upsert("c", [VectorRecord(f"id{i}", vectors[i], p) for i, p in enumerate(payloads)])
    assert [r.payload for r in store.get("c", ["id0", "id1", "id2"])] == payloads
    hits = store.search("c", vectors[:1], 3)[0]
    assert {h.id: h.payload for h in hits} == {f"id{i}": p for i, p in enumerate(payloads)}
    for flt in (Eq("b", True), Eq("b", False), Eq("n", 3), In("b", (True, False)), Or(())):
        want = sum(matches(flt, p) for p in payloads)
        assert store.count("c", flt) == want, flt
    with pytest.raises(InvalidRequest):
        store.upsert("c", [VectorRecord("bad", vectors[0], {"_id": "other"})])
    assert store.count("c") == 3


def test_spec_mapping() -> None:
    s = qf.hnsw_settings(IndexSpec("HNSW", params={"M": 8, "quantization": "pq", "m": 25}), 50)
    assert (s.m, s.ef_construct, s.quantization, s.pq_ratio) == (8, 100, "product", 8)
    s = qf.hnsw_settings(IndexSpec("HNSW", params={"quantization": "scalar", "on_disk": True}), 50)
    assert (s.quantization, s.on_disk, s.full_scan_kb) == ("scalar", True, 10_000)
    for bad in ({"quantization": "binary"}, {"compression": "x3", "quantization": "pq"}, {"M": 1}):
        with pytest.raises(UnsupportedIndex):
            qf.hnsw_settings(IndexSpec("HNSW", params=bad), 50)
    with pytest.raises(UnsupportedIndex):
        qf.hnsw_settings(IndexSpec("IVF_PQ"), 50)
    spec = IndexSpec("HNSW", params={"quantization": "int8"}, search_params={"ef": 32})
    assert qf.search_knobs(spec, None) == (32, False, {"rescore": True})
    assert qf.search_knobs(spec, {"exact": True}) == (32, True, None)
    # search_exact: the full vectors only, never the int8 codes
    assert qf.search_knobs(spec, {"exact": True, "ignore_quantization": True}) == (32, True, {"ignore": True})
    assert qf.search_knobs(None, None) == (None, True, None)


# -- the edge engine: HNSW really built and walked ------------------------------------------


def pause_build(edge: QdrantEdgeStore, name: str) -> int:
    """Wait for the optimizer child of ``name``'s build and stop it (SIGSTOP); return its pid.

    A stopped build lasts as long as the test needs, on a fast machine as on a loaded one.
    """
    deadline = time.monotonic() + 120
    while (proc := edge._builds.get(name)) is None:
        assert time.monotonic() < deadline, f"no build of {name!r} started"
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGSTOP)
    return proc.pid


def _load(store: QdrantEdgeStore, name: str, data: np.ndarray, rare: set[int]) -> None:
    store.create_collection(name, data.shape[1])
    store.upsert(name, [
        VectorRecord(str(i), data[i], {"tag": "rare" if i in rare else "common"})
        for i in range(len(data))
    ])


def test_edge_hnsw_is_walked_and_filtered_search_returns_k(edge: QdrantEdgeStore) -> None:
    rng = np.random.default_rng(1)
    data, queries = unit(rng, N), unit(rng, 50)
    rare = set(rng.choice(N, N // 100, replace=False).tolist())
    _load(edge, "big", data, rare)
    _load(edge, "other", data[:100], set())
    spec = IndexSpec(
        "HNSW", params={"M": 16, "efConstruction": 100, "full_scan_threshold_kb": 10},
        search_params={"ef": 64},
    )
    build = threading.Thread(target=edge.build_index, args=("big", spec, 600))
    build.start()
    child = pause_build(edge, "big")
    try:
        with pytest.raises(StoreUnavailable):
            edge.count("big")  # the shard belongs to the build process meanwhile
        assert edge.count("other") == 100  # other collections keep serving
    finally:
        os.kill(child, signal.SIGCONT)
    build.join()
    shard_info = edge._coll("big").shard.info()
    assert shard_info.indexed_vectors_count == N  # the whole collection is in the graph
    assert edge.describe_index("big") == IndexSpec("HNSW", "cosine", spec.params, spec.search_params)

    truth = exact_ids(data, queries, K)
    exact = edge.search("big", queries, K, search_params={"exact": True})
    assert recall(exact, truth) == 1.0
    coarse = recall(edge.search("big", queries, K, search_params={"ef": 10}), truth)
    fine = recall(edge.search("big", queries, K, search_params={"ef": 256}), truth)
    print(f"edge HNSW on {N} random vectors: recall@10 ef=10 {coarse:.3f}, ef=256 {fine:.3f}")
    assert coarse < fine and coarse < 0.99, (coarse, fine)  # ef matters: a graph walk, not a scan
    assert fine >= 0.95

    ids = np.array(sorted(rare))
    sub_truth = ids[exact_ids(data[ids], queries, K)]
    hits = edge.search("big", queries, K, flt=Eq("tag", "rare"))
    assert all(len(row) == K and all(int(h.id) in rare for h in row) for row in hits)
    assert recall(hits, sub_truth) >= 0.9

    extra = unit(rng, 1)
    edge.upsert("big", [VectorRecord("new", extra[0], {"tag": "rare"})])  # unindexed segment
    assert edge.search("big", extra, 1, flt=Eq("tag", "rare"))[0][0].id == "new"


def test_small_collection_is_scanned_below_full_scan_threshold(edge: QdrantEdgeStore) -> None:
    rng = np.random.default_rng(2)
    data = unit(rng, 3000)
    _load(edge, "small", data, set())
    edge.build_index("small", IndexSpec("HNSW", params={"M": 16}), 300)
    assert edge._coll("small").shard.info().indexed_vectors_count == 0  # 600 KiB < 10,000 KiB
    queries = unit(rng, 10)
    assert recall(edge.search("small", queries, K), exact_ids(data, queries, K)) == 1.0


def test_edge_build_timeout_kills_and_rolls_back(edge: QdrantEdgeStore, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    data = unit(rng, N)
    _load(edge, "slow", data, set())
    config = tmp_path / "edge" / "collections" / "slow" / "shard" / "edge_config.json"
    before = config.read_bytes()
    spec = IndexSpec("HNSW", params={"M": 32, "efConstruction": 400, "full_scan_threshold_kb": 10})
    pauser = threading.Thread(target=pause_build, args=(edge, "slow"))  # a hung build, however fast the machine
    pauser.start()
    start = time.monotonic()
    with pytest.raises(IndexBuildFailed, match="did not finish within 0.5 s"):
        edge.build_index("slow", spec, timeout_s=0.5)
    assert time.monotonic() - start < 15
    pauser.join()
    assert config.read_bytes() == before
    assert edge.describe_index("slow") is None
    assert edge.count("slow") == N
    assert edge.search("slow", data[:1], 1)[0][0].id == "0"


def test_edge_quantized_builds(edge: QdrantEdgeStore) -> None:
    rng = np.random.default_rng(4)
    data = unit(rng, 3000, 32)
    _load(edge, "q", data, set())
    for params in ({"quantization": "int8"}, {"quantization": "pq", "compression": "x8", "on_disk": True}):
        spec = IndexSpec("HNSW", params={"M": 16, "full_scan_threshold_kb": 10, **params},
                         search_params={"ef": 64, "oversampling": 2.0})
        edge.build_index("q", spec, 300)
        assert edge.describe_index("q") == IndexSpec("HNSW", "cosine", spec.params, spec.search_params)
        hits = edge.search("q", data[:5], 3)
        assert [row[0].id for row in hits] == ["0", "1", "2", "3", "4"]
        assert abs(hits[0][0].score - 1.0) < 1e-3  # rescored with the original vectors
        queries = unit(rng, 4, 32)
        exact = edge.search_exact("q", queries, 10)  # the full vectors, not the codes
        want = np.sort(queries @ data.T, axis=1)[:, ::-1][:, :10]
        np.testing.assert_allclose([[h.score for h in row] for row in exact], want, atol=1e-5)


def test_edge_root_is_owned_by_one_store(tmp_path: Path) -> None:
    first = open_store(f"qdrant://{tmp_path}/shared")
    first.create_collection("c", 4)
    first.upsert("c", [VectorRecord("a", np.ones(4, np.float32), {})])
    first.set_alias("live", "c")
    assert json.loads((tmp_path / "shared" / "aliases.json").read_text()) == {"live": "c"}
    second = open_store(f"qdrant://{tmp_path}/shared")
    try:
        with pytest.raises(StoreUnavailable):
            second.count("c")
        first.close()
        assert second.count("live") == 1
    finally:
        first.close()
        second.close()
