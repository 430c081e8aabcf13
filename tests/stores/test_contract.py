"""The VectorStore contract, run unchanged against every backend of ``conftest.BACKENDS``.

Reference semantics: filters against :func:`stores.filters.matches`, scores against exact numpy
cosine / inner product / Euclidean distance.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quarry.errors import (
    CollectionExists,
    CollectionNotFound,
    DimensionMismatch,
    InvalidFilter,
    UnsupportedIndex,
)
from retrieval.ann_batching import BatchingSearch
from stores.base import IndexKind, IndexSpec, Metric, VectorRecord, VectorStore
from stores.factory import open_store
from stores.filters import And, Eq, Exists, Filter, In, Ne, Nin, Or, Prefix, Range, matches
from tests.stores.conftest import Backend

REPO = Path(__file__).resolve().parents[2]
DIM = 16
WEIRD = ['a"b', "a'b", "back\\slash", "x\\", '" or 1==1 or "', "' or ''='", "é中文", "", "tab\tt"]
WORDS = ["red", "green", "blue", *WEIRD]
TAGS = ["p", "q", "r", "s'q", 'd"q']
INJECTIONS = ['" or 1==1 or "', "' or 1==1 or '", 'x") or (1==1', "1; DROP TABLE t; --", "\\"]
INDEX_PARAMS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "HNSW": ({"M": 16, "efConstruction": 64}, {"ef": 64}),
    "IVF_FLAT": ({"nlist": 8}, {"nprobe": 8}),
    "IVF_PQ": ({"nlist": 8, "m": 4, "nbits": 8}, {"nprobe": 8}),
    "DISKANN": ({}, {"search_list": 64}),
    "FLAT": ({}, {}),
}


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def records(vectors: np.ndarray, payloads: list[dict[str, Any]] | None = None) -> list[VectorRecord]:
    return [VectorRecord(f"r{i}", vectors[i], payloads[i] if payloads else {"i": i}) for i in range(len(vectors))]


def random_payload(rnd: random.Random, i: int) -> dict[str, Any]:
    payload: dict[str, Any] = {"i": i}
    if rnd.random() < 0.9:
        payload["s"] = rnd.choice(WORDS)
    if rnd.random() < 0.9:
        payload["n"] = rnd.randint(-5, 5)
    if rnd.random() < 0.9:
        payload["f"] = round(rnd.uniform(-1.0, 1.0), 3)
    if rnd.random() < 0.9:
        payload["b"] = rnd.random() < 0.5
    if rnd.random() < 0.9:
        payload["tags"] = rnd.sample(TAGS, rnd.randint(1, 3))
    return payload


def filter_cases() -> list[Filter]:
    return [
        Eq("s", "red"),
        *[Eq("s", w) for w in WEIRD],
        Eq("n", 3),
        Eq("n", -2),
        Eq("b", True),
        Eq("b", False),
        Eq("tags", "q"),
        Eq("tags", "s'q"),
        Eq("tags", 'd"q'),
        In("s", ("red", 'a"b', "é中文")),
        In("n", (1, 2, 3)),
        In("tags", ("p", "zzz")),
        In("s", ("red", 1, True)),
        Range("n", gt=1),
        Range("n", gte=1),
        Range("n", lt=0),
        Range("n", lte=0),
        Range("n", gte=-2, lte=2),
        Range("f", gt=-0.25, lt=0.5),
        Range("f", gte=0.0),
        And((Eq("s", "blue"), Range("n", gte=0))),
        Or((Eq("s", "red"), Eq("tags", "p"))),
        And((Or((Eq("b", True), Range("f", lt=0.0))), In("n", (0, 1, 2, -1)))),
        Or((And((Eq("s", "green"), Eq("b", False))), Range("n", gt=4))),
        Eq("missing", 1),
        *[Eq("s", inj) for inj in INJECTIONS],
    ]


PATHS = ["docs/a.md", "docs/api/x.md", "docs%2Fa", "docs_api", "docsXapi", "100%", "50_50", "back\\slash\\x",
         "é/中文.md", 'q"uote/x', "it's/x", "", "*star"]
PREFIXES = ["docs/", "docs_", "docs%", "100%", "50_", "back\\", "back\\s", "é/", 'q"', "it'", "", "*", "%", "_",
            "\\", "zzz"]
NEW_OPERATOR_BACKENDS = {"stores.pgvector", "stores.qdrant", "stores.milvus"}
"""Backends that compile ``$ne``/``$nin``/``$exists``/``$prefix``; the others refuse them (400)."""


def operator_cases() -> list[Filter]:
    """``$ne``, ``$nin``, ``$exists``, ``$prefix`` (SQL semantics: ``$ne``/``$nin`` need the field)."""
    return [
        Ne("s", "red"),
        *[Ne("s", w) for w in WEIRD],
        Ne("n", 3),
        Ne("f", 0.5),
        Ne("b", True),
        Ne("tags", "q"),
        Ne("tags", "s'q"),
        Ne("missing", 1),
        Nin("s", ("red", 'a"b', "é中文")),
        Nin("n", (1, 2, 3)),
        Nin("tags", ("p", 'd"q')),
        Nin("s", ("red", 1, True)),
        *[Exists(field, flag) for field in ("s", "n", "b", "tags", "p", "missing") for flag in (True, False)],
        *[Prefix("p", pre) for pre in PREFIXES],
        Prefix("s", "a"),
        Prefix("s", "back\\"),
        Prefix("tags", "s'"),
        Prefix("n", "1"),
        Or((Ne("s", "red"), Exists("s", False))),
        And((Prefix("p", "docs"), Range("n", gte=0))),
        Or((Nin("n", (0, 1)), Prefix("p", "it'"))),
        And((Exists("b", True), Ne("b", False), Eq("tags", "p"))),
    ]


def exact_top(data: np.ndarray, queries: np.ndarray, k: int, metric: Metric) -> np.ndarray:
    if metric == "l2":
        scores = -np.linalg.norm(queries[:, None, :] - data[None, :, :], axis=2)
    else:
        scores = queries @ data.T
    return np.sort(scores, axis=1)[:, ::-1][:, :k]


# -- collections ---------------------------------------------------------------------------


def test_create_has_list_drop(store: VectorStore, names: Callable[[], str]) -> None:
    a, b = names(), names()
    assert not store.has_collection(a)
    store.create_collection(a, DIM)
    store.create_collection(b, 4, metric="ip")
    assert store.has_collection(a) and store.has_collection(b)
    listed = store.list_collections()
    assert listed == sorted(listed) and {a, b} <= set(listed)
    assert store.collection_dim(a) == DIM and store.collection_dim(b) == 4
    assert store.count(a) == 0
    with pytest.raises(CollectionExists):
        store.create_collection(a, DIM)
    store.drop_collection(a)
    assert not store.has_collection(a) and a not in store.list_collections()
    store.drop_collection(a)  # missing: not an error


def test_unknown_collection_raises(store: VectorStore, coll: str) -> None:
    with pytest.raises(CollectionNotFound):
        store.count(coll)
    with pytest.raises(CollectionNotFound):
        store.search(coll, np.zeros((1, DIM), np.float32), 3)
    with pytest.raises(CollectionNotFound):
        store.upsert(coll, records(unit(np.random.default_rng(0), 1)))


# -- records ---------------------------------------------------------------------------------


def test_upsert_is_idempotent_and_replaces(store: VectorStore, coll: str) -> None:
    rng = np.random.default_rng(1)
    store.create_collection(coll, DIM)
    first = unit(rng, 20)
    store.upsert(coll, records(first))
    store.upsert(coll, records(first))
    assert store.count(coll) == 20
    second = unit(rng, 20)
    store.upsert(coll, [VectorRecord(f"r{i}", second[i], {"v": 2}) for i in range(20)])
    assert store.count(coll) == 20
    got = store.get(coll, ["r3", "r7"])
    np.testing.assert_allclose(got[0].vector, second[3], atol=1e-6)
    assert got[1].payload == {"v": 2}


def test_delete_by_ids_and_get_order(store: VectorStore, coll: str) -> None:
    rng = np.random.default_rng(2)
    store.create_collection(coll, DIM)
    vectors = unit(rng, 10)
    store.upsert(coll, records(vectors))
    got = store.get(coll, ["r5", "nope", "r1", "r9"])
    assert [r.id for r in got] == ["r5", "r1", "r9"]
    np.testing.assert_allclose(got[0].vector, vectors[5], atol=1e-6)
    assert got[0].payload == {"i": 5}
    store.delete(coll, ["r1", "r2", "unknown"])
    assert store.count(coll) == 8
    assert store.get(coll, ["r1", "r2"]) == []


def test_odd_ids_round_trip(store: VectorStore, coll: str) -> None:
    rng = np.random.default_rng(3)
    store.create_collection(coll, DIM)
    ids = ["doc'1#0", 'doc"2#0', "doc\\3#0", "a' or id != '", "%41", "文档#1", "x y/z:1"]
    vectors = unit(rng, len(ids))
    store.upsert(coll, [VectorRecord(i, vectors[n], {"n": n}) for n, i in enumerate(ids)])
    assert [r.id for r in store.get(coll, ids)] == ids
    hits = store.search(coll, vectors[:1], 1)[0]
    assert hits[0].id == ids[0]
    store.delete(coll, ["a' or id != '"])
    assert store.count(coll) == len(ids) - 1
    assert [r.id for r in store.get(coll, ids)] == [i for i in ids if i != "a' or id != '"]


def test_filters_match_reference(store: VectorStore, coll: str) -> None:
    rnd = random.Random(4)
    n = 150
    payloads = [random_payload(rnd, i) for i in range(n)]
    vectors = unit(np.random.default_rng(4), n)
    store.create_collection(coll, DIM)
    store.upsert(coll, records(vectors, payloads))
    query = unit(np.random.default_rng(5), 1)
    for flt in filter_cases():
        expected = {f"r{i}" for i, p in enumerate(payloads) if matches(flt, p)}
        assert store.count(coll, flt) == len(expected), flt
        hits = store.search(coll, query, n, flt=flt)[0]
        assert {h.id for h in hits} == expected, flt
        assert all(matches(flt, h.payload) for h in hits), flt


def test_new_filter_operators_match_reference(store: VectorStore, coll: str, backend: Backend) -> None:
    rnd = random.Random(14)
    n = 150
    payloads = [random_payload(rnd, i) for i in range(n)]
    for payload in payloads:
        if rnd.random() < 0.8:
            payload["p"] = rnd.choice(PATHS)
    store.create_collection(coll, DIM)
    store.upsert(coll, records(unit(np.random.default_rng(14), n), payloads))
    query = unit(np.random.default_rng(15), 1)
    for flt in operator_cases():
        expected = {f"r{i}" for i, p in enumerate(payloads) if matches(flt, p)}
        if backend.module not in NEW_OPERATOR_BACKENDS:
            with pytest.raises(InvalidFilter, match="not supported by the"):
                store.count(coll, flt)
            continue
        assert store.count(coll, flt) == len(expected), flt
        hits = store.search(coll, query, n, flt=flt)[0]
        assert {h.id for h in hits} == expected, flt
        assert all(matches(flt, h.payload) for h in hits), flt


def test_delete_by_filter(store: VectorStore, coll: str) -> None:
    rnd = random.Random(6)
    payloads = [random_payload(rnd, i) for i in range(80)]
    store.create_collection(coll, DIM)
    store.upsert(coll, records(unit(np.random.default_rng(6), 80), payloads))
    flt = Or((Eq("s", 'a"b'), Range("n", gte=3)))
    keep = [f"r{i}" for i, p in enumerate(payloads) if not matches(flt, p)]
    store.delete_by_filter(coll, flt)
    assert store.count(coll) == len(keep)
    assert [r.id for r in store.get(coll, keep)] == keep


def test_injection_in_filter_values_is_inert(store: VectorStore, coll: str) -> None:
    rng = np.random.default_rng(7)
    store.create_collection(coll, DIM)
    store.upsert(coll, records(unit(rng, 30), [{"s": "plain", "n": i} for i in range(30)]))
    for value in INJECTIONS:
        assert store.count(coll, Eq("s", value)) == 0
        assert store.count(coll, In("s", (value, "nothing"))) == 0
        store.delete_by_filter(coll, Eq("s", value))
        store.delete(coll, [value, f"r1{value}"])
    assert store.count(coll) == 30
    assert store.count(coll, Eq("s", "plain")) == 30


# -- search ----------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
def test_batched_search_matches_exact(store: VectorStore, coll: str, metric: Metric) -> None:
    rng = np.random.default_rng(8)
    data = unit(rng, 300)
    if metric != "cosine":
        data = data * rng.uniform(0.5, 2.0, size=(300, 1)).astype(np.float32)
    queries = unit(rng, 7)
    store.create_collection(coll, DIM, metric=metric)
    store.upsert(coll, records(data))
    results = store.search(coll, queries, 10)
    assert len(results) == 7
    expected = exact_top(data, queries, 10, metric)
    for q, (hits, want) in enumerate(zip(results, expected, strict=True)):
        scores = np.array([h.score for h in hits])
        assert len(hits) == 10
        assert np.all(np.diff(scores) <= 1e-6), "best first"
        np.testing.assert_allclose(scores, want, atol=1e-3)
        own = exact_top(data[[int(h.id[1:]) for h in hits]], queries[q : q + 1], 10, metric)[0]
        np.testing.assert_allclose(np.sort(scores)[::-1], own, atol=1e-3)


def test_search_without_payload_gives_the_same_ids_and_scores(store: VectorStore, coll: str) -> None:
    rng = np.random.default_rng(12)
    data = unit(rng, 200)
    store.create_collection(coll, DIM)
    store.upsert(coll, records(data))
    queries = unit(rng, 3)
    full = store.search(coll, queries, 10)
    bare = store.search(coll, queries, 10, with_payload=False)
    assert [[h.id for h in hits] for hits in bare] == [[h.id for h in hits] for hits in full]
    for a, b in zip(full, bare, strict=True):
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-6)
    assert all(h.payload for hits in full for h in hits)
    assert all(h.payload == {} for hits in bare for h in hits)


def test_search_returns_fewer_only_when_fewer_exist(store: VectorStore, coll: str) -> None:
    store.create_collection(coll, DIM)
    assert store.search(coll, unit(np.random.default_rng(9), 2), 5) == [[], []]
    store.upsert(coll, records(unit(np.random.default_rng(9), 3)))
    assert [len(h) for h in store.search(coll, unit(np.random.default_rng(10), 2), 5)] == [3, 3]


def _best_index(store: VectorStore) -> IndexKind | None:
    kinds = store.capabilities().index_kinds
    for kind in ("HNSW", "IVF_FLAT"):
        if kind in kinds:
            return kind  # type: ignore[return-value]
    return None


def test_filtered_search_returns_exactly_k(store: VectorStore, coll: str) -> None:
    rng = np.random.default_rng(11)
    n, k = 3000, 10
    tagged = set(rng.choice(n, size=30, replace=False).tolist())
    payloads = [{"tag": "rare" if i in tagged else "common", "i": i} for i in range(n)]
    data = unit(rng, n)
    store.create_collection(coll, DIM)
    store.upsert(coll, records(data, payloads))
    kind = _best_index(store)
    if kind is not None:
        params, search = INDEX_PARAMS[kind]
        store.build_index(coll, IndexSpec(kind, params=params, search_params=search), 300)
    queries = unit(rng, 5)
    results = store.search(coll, queries, k, flt=Eq("tag", "rare"))
    ids = np.array(sorted(tagged))
    truth = np.argsort(-(queries @ data[ids].T), axis=1)[:, :k]
    recalls = []
    for hits, want in zip(results, truth, strict=True):
        assert len(hits) == k
        assert all(int(h.id[1:]) in tagged for h in hits)
        recalls.append(len({int(h.id[1:]) for h in hits} & set(ids[want].tolist())) / k)
    assert float(np.mean(recalls)) >= 0.9


def test_wrong_dimension_is_rejected_before_writing(store: VectorStore, coll: str) -> None:
    rng = np.random.default_rng(12)
    store.create_collection(coll, DIM)
    batch = records(unit(rng, 5))
    batch.append(VectorRecord("bad", unit(rng, 1, DIM + 1)[0], {}))
    with pytest.raises(DimensionMismatch) as info:
        store.upsert(coll, batch)
    assert str(DIM) in str(info.value) and str(DIM + 1) in str(info.value)
    assert store.count(coll) == 0
    with pytest.raises(DimensionMismatch):
        store.search(coll, unit(rng, 2, DIM - 1), 3)


# -- aliases -------------------------------------------------------------------------------


def test_alias_set_swap_drop(store: VectorStore, names: Callable[[], str]) -> None:
    rng = np.random.default_rng(13)
    blue, green, alias = names(), names(), names()
    store.create_collection(blue, DIM)
    store.create_collection(green, DIM)
    store.upsert(blue, records(unit(rng, 4)))
    store.upsert(green, [VectorRecord("g", unit(rng, 1)[0], {"c": "green"})])
    assert store.resolve(blue) == blue
    store.set_alias(alias, blue)
    assert store.has_collection(alias) and store.resolve(alias) == blue
    assert alias not in store.list_collections()
    assert store.count(alias) == 4 and store.collection_dim(alias) == DIM
    assert len(store.search(alias, unit(rng, 1), 10)[0]) == 4
    store.set_alias(alias, green)
    assert store.resolve(alias) == green
    assert [h.id for h in store.search(alias, unit(rng, 1), 10)[0]] == ["g"]
    store.upsert(alias, [VectorRecord("g2", unit(rng, 1)[0], {})])
    assert store.count(green) == 2
    with pytest.raises(CollectionExists):
        store.create_collection(alias, DIM)
    with pytest.raises(CollectionExists):
        store.set_alias(blue, green)
    with pytest.raises(CollectionNotFound):
        store.set_alias(alias, names())
    store.drop_alias(alias)
    store.drop_alias(alias)
    assert not store.has_collection(alias) and store.resolve(alias) == alias
    with pytest.raises(CollectionNotFound):
        store.count(alias)
    assert store.count(blue) == 4


# -- indexes -------------------------------------------------------------------------------


WEAK_INDEX: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "HNSW": ({"M": 4, "efConstruction": 8}, {"ef": 1}),
    "IVF_FLAT": ({"nlist": 64}, {"nprobe": 1}),
    "IVF_PQ": ({"nlist": 64, "m": 4, "nbits": 8}, {"nprobe": 1}),
}


@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_search_exact_ignores_a_weak_index(store: VectorStore, coll: str, metric: Metric) -> None:
    """``search_exact`` is the monitor's ground truth: exact whatever index is built, filter or not."""
    rng = np.random.default_rng(31)
    n, k = 2000, 10
    data = unit(rng, n)
    if metric == "l2":
        data = data * rng.uniform(0.5, 2.0, size=(n, 1)).astype(np.float32)
    payloads = [{"tag": "a" if i % 50 == 0 else "b", "i": i} for i in range(n)]
    store.create_collection(coll, DIM, metric=metric)
    store.upsert(coll, records(data, payloads))
    queries = unit(rng, 6)
    kinds = [kind for kind in WEAK_INDEX if kind in store.capabilities().index_kinds]
    for kind in [None, *kinds]:
        if kind is not None:
            params, search = WEAK_INDEX[kind]
            store.build_index(coll, IndexSpec(kind, metric, params, search), 300)  # type: ignore[arg-type]
        for flt, rows in ((None, np.arange(n)), (Eq("tag", "a"), np.arange(0, n, 50))):
            got = store.search_exact(coll, queries, k, flt)
            want = exact_top(data[rows], queries, k, metric)
            for q, (hits, best) in enumerate(zip(got, want, strict=True)):
                assert len(hits) == k, (kind, flt)
                np.testing.assert_allclose([h.score for h in hits], best, atol=1e-3, err_msg=f"{kind} {flt}")
                own = exact_top(data[[int(h.id[1:]) for h in hits]], queries[q : q + 1], k, metric)[0]
                np.testing.assert_allclose(sorted((h.score for h in hits), reverse=True), own, atol=1e-3)
                assert all(h.payload == {} for h in hits)


def test_index_build_describe_drop(store: VectorStore, coll: str) -> None:
    rng = np.random.default_rng(14)
    data = unit(rng, 500)
    store.create_collection(coll, DIM)
    store.upsert(coll, records(data))
    kinds = store.capabilities().index_kinds
    for kind in ("HNSW", "IVF_FLAT"):
        if kind not in kinds:
            continue
        params, search = INDEX_PARAMS[kind]
        store.build_index(coll, IndexSpec(kind, params=params, search_params=search), 300)
        spec = store.describe_index(coll)
        assert spec is not None and spec.kind == kind and spec.metric == "cosine"
        assert all(spec.params.get(key) == value for key, value in params.items())
        hits = store.search(coll, data[:3], 5)
        assert [h[0].id for h in hits] == ["r0", "r1", "r2"]
        store.drop_index(coll)
        assert store.describe_index(coll) is None
        assert [h[0].id for h in store.search(coll, data[:3], 5)] == ["r0", "r1", "r2"]
    assert store.count(coll) == 500


def test_unsupported_index_fails_fast(store: VectorStore, coll: str) -> None:
    store.create_collection(coll, DIM)
    store.upsert(coll, records(unit(np.random.default_rng(15), 50)))
    caps = store.capabilities()
    missing = [k for k in INDEX_PARAMS if k not in caps.index_kinds]
    for kind in missing:
        params, search = INDEX_PARAMS[kind]
        start = time.monotonic()
        with pytest.raises(UnsupportedIndex):
            store.build_index(coll, IndexSpec(kind, params=params, search_params=search), 300)  # type: ignore[arg-type]
        assert time.monotonic() - start < 5.0
    if not missing:
        assert caps.engine == "milvus", "only the Milvus server builds every kind"
    assert store.count(coll) == 50
    assert len(store.search(coll, unit(np.random.default_rng(16), 1), 5)[0]) == 5


# -- persistence and concurrency -------------------------------------------------------------


WRITER = """
import sys
import numpy as np
from stores.base import VectorRecord
from stores.factory import open_store

url, name, alias, dim = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
data = np.load(sys.argv[5])
store = open_store(url)
assert store.capabilities().persistent  # every store under contract keeps its data; this test checks the claim
store.create_collection(name, dim, metric="ip")
store.upsert(name, [VectorRecord(f"r{i}", data[i], {"i": i}) for i in range(len(data))])
store.set_alias(alias, name)
store.close()
"""


def test_reopen_after_restart(fresh_url: str, names: Callable[[], str], tmp_path: Path) -> None:
    """Data written by another process (which then exits) is there when the store reopens."""
    data = unit(np.random.default_rng(17), 40)
    np.save(tmp_path / "data.npy", data)
    name, alias = names(), names()
    argv = [fresh_url, name, alias, str(DIM), str(tmp_path / "data.npy")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", WRITER, *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    store = open_store(fresh_url)
    try:
        assert store.count(name) == 40 and store.collection_dim(name) == DIM
        assert store.resolve(alias) == name
        got = store.get(name, ["r7"])
        np.testing.assert_allclose(got[0].vector, data[7], atol=1e-6)
        assert got[0].payload == {"i": 7}
        hits = store.search(alias, data[:1], 3)[0]
        assert hits[0].id == "r0" and abs(hits[0].score - float(data[0] @ data[0])) < 1e-3
    finally:
        store.drop_alias(alias)
        store.drop_collection(name)
        store.close()


def test_concurrent_use_of_one_store(store: VectorStore, coll: str) -> None:
    rng = np.random.default_rng(18)
    store.create_collection(coll, DIM)
    store.upsert(coll, records(unit(rng, 200)))
    errors: list[BaseException] = []
    queries = unit(rng, 8)

    def work(worker: int) -> None:
        try:
            for step in range(15):
                hits = store.search(coll, queries[worker : worker + 1], 5)
                assert len(hits[0]) == 5
                vec = unit(np.random.default_rng(worker * 100 + step), 1)
                store.upsert(coll, [VectorRecord(f"w{worker}-{step}", vec[0], {"w": worker})])
                assert store.count(coll, Eq("w", worker)) == step + 1
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert store.count(coll) == 200 + 8 * 15


def test_coalesced_one_query_searches_equal_searching_alone(store: VectorStore, names: Callable[[], str]) -> None:
    """The query path's BatchingSearch: concurrent calls with mixed collections, k and filters
    share store calls, and each gets exactly what it would get alone; a failed call (unknown
    collection) fails only its own callers."""
    rng = np.random.default_rng(19)
    first, second = names(), names()
    rnd = random.Random(19)
    for name in (first, second):
        store.create_collection(name, DIM)
        store.upsert(name, records(unit(rng, 120), [random_payload(rnd, i) for i in range(120)]))
    queries = unit(rng, 24)
    cases = [
        (first if i % 3 else second, queries[i : i + 1], 5 + i % 4, None if i % 2 else Eq("tags", "p"))
        for i in range(24)
    ]
    batching = BatchingSearch(store, max_batch=6)
    with ThreadPoolExecutor(max_workers=12) as pool:
        got = list(pool.map(lambda c: batching.search(c[0], c[1], c[2], c[3], with_payload=False), cases))
        missing = pool.submit(batching.search, "t_no_such_collection", queries[:1], 5)
        with pytest.raises(CollectionNotFound):
            missing.result()
    for (name, query, k, flt), hits in zip(cases, got, strict=True):
        alone = store.search(name, query, k, flt, with_payload=False)[0]
        assert [h.id for h in hits] == [h.id for h in alone]
        assert len(hits) == k
        np.testing.assert_allclose([h.score for h in hits], [h.score for h in alone], atol=1e-5)
    with pytest.raises(ValueError, match=r"one \(1, dim\) query"):
        batching.submit(first, queries[:2], 5)
