"""pgvector-specific checks against the real PostgreSQL 18 + pgvector 0.8 server.

The server comes from ``scripts/services/postgres.sh start`` (URL in ``QUARRY_TEST_PG_URL``,
default ``postgresql://postgres@127.0.0.1:5433/quarry``). Each test module run works in its own
schema, dropped at the end, so that runs on the shared server do not see each other.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector
from psycopg import sql

from quarry.errors import (
    CollectionNotFound,
    DimensionMismatch,
    IndexBuildFailed,
    InvalidFilter,
    InvalidQuery,
    InvalidRequest,
    StoreUnavailable,
    UnsupportedIndex,
)
from stores import pgvector_sql as q
from stores.base import IndexSpec, VectorRecord
from stores.filters import And, Eq, In, Or, Range, parse_filter
from stores.pgvector import PgVectorStore

pytestmark = pytest.mark.integration

PG_URL = os.environ.get("QUARRY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5433/quarry")
N, DIM, K = 20_000, 32, 10


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def schema() -> Iterator[str]:
    name = f"pgv_test_{uuid.uuid4().hex[:10]}"
    yield name
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def pg(schema: str) -> Iterator[PgVectorStore]:
    store = PgVectorStore.from_url(f"{PG_URL}?schema={schema}")
    yield store
    store.close()


@pytest.fixture(scope="module")
def big(pg: PgVectorStore) -> tuple[str, np.ndarray]:
    """20k random unit vectors, 1% tagged ``rare`` (and ``bucket == 7``), with an HNSW index."""
    data = unit(np.random.default_rng(0), N, DIM)
    payloads = [{"tag": "rare" if i % 100 == 7 else "common", "bucket": i % 100} for i in range(N)]
    pg.create_collection("big", DIM)
    pg.upsert("big", [VectorRecord(f"r{i}", data[i], payloads[i]) for i in range(N)])
    spec = IndexSpec("HNSW", params={"M": 16, "efConstruction": 64}, search_params={"ef": 40})
    pg.build_index("big", spec, timeout_s=600)
    return "big", data


def plan_of(pg: PgVectorStore, schema: str, name: str, flt: Any, dim: int, no_seqscan: bool = False) -> str:
    cond, params = q.compile_filter(flt)
    index = pg.describe_index(name)
    halfvec = bool(index and index.params.get("halfvec"))
    metric = index.metric if index else "cosine"
    stmt = q.search_sql(schema, name, dim, metric, halfvec, cond)
    query = [np.ones(dim, np.float32)]
    with psycopg.connect(PG_URL) as conn:
        register_vector(conn)
        if no_seqscan:  # small tables: prove the index *can* serve the query expression
            conn.execute("SET enable_seqscan = off")
        rows = conn.execute(sql.SQL("EXPLAIN ") + stmt, [query, *params, K]).fetchall()
    return "\n".join(r[0] for r in rows)


# -- server and capabilities ----------------------------------------------------------------


def test_capabilities_name_postgres_18_and_pgvector_0_8(pg: PgVectorStore) -> None:
    caps = pg.capabilities()
    assert caps.engine == "pgvector" and caps.persistent
    assert caps.index_kinds == frozenset({"FLAT", "HNSW", "IVF_FLAT"})
    assert caps.max_dim == 2000
    server, ext = caps.version.removeprefix("PostgreSQL ").split(" + pgvector ")
    assert int(server.split(".")[0]) >= 18
    assert tuple(int(p) for p in ext.split(".")[:2]) >= (0, 8)


def test_unreachable_server_is_store_unavailable() -> None:
    start = time.monotonic()
    with pytest.raises(StoreUnavailable):
        PgVectorStore.from_url("postgresql://postgres@127.0.0.1:1/quarry")
    assert time.monotonic() - start < 15


# -- filtered search: iterative index scans ---------------------------------------------------


@pytest.mark.parametrize("flt", [Eq("tag", "rare"), Range("bucket", gte=7, lt=8)])
def test_filtered_search_at_1_percent_returns_exactly_k(
    pg: PgVectorStore, schema: str, big: tuple[str, np.ndarray], flt: Any
) -> None:
    name, data = big
    # The index alone (no exact fallback) must deliver: this is pgvector's iterative scan.
    index_only = PgVectorStore(PG_URL, schema=schema, exact_fallback=False)
    try:
        assert "Index Scan using c_big_vec" in plan_of(pg, schema, name, flt, DIM)
        queries = unit(np.random.default_rng(1), 30, DIM)
        results = index_only.search(name, queries, K, flt=flt, search_params={"exact": False})
    finally:
        index_only.close()
    tagged = np.arange(7, N, 100)
    truth = tagged[np.argsort(-(queries @ data[tagged].T), axis=1)[:, :K]]
    recalls = []
    for hits, want in zip(results, truth, strict=True):
        assert len(hits) == K
        assert all(int(h.id[1:]) % 100 == 7 for h in hits)
        recalls.append(len({int(h.id[1:]) for h in hits} & set(want.tolist())) / K)
    assert float(np.mean(recalls)) >= 0.9


def test_exact_fallback_fills_queries_the_index_left_short(pg: PgVectorStore, big: tuple[str, np.ndarray]) -> None:
    name, data = big
    queries = unit(np.random.default_rng(2), 5, DIM)
    flt = Eq("tag", "rare")
    off = {"iterative_scan": "off", "exact": False}
    results = pg.search(name, queries, K, flt=flt, search_params=off)
    tagged = np.arange(7, N, 100)
    truth = tagged[np.argsort(-(queries @ data[tagged].T), axis=1)[:, :K]]
    for hits, want in zip(results, truth, strict=True):
        assert [int(h.id[1:]) for h in hits] == want.tolist()  # exact re-run: exact order


def test_selective_indexed_filter_is_answered_exactly(pg: PgVectorStore, big: tuple[str, np.ndarray]) -> None:
    name, data = big
    assert q.index_served(And((Eq("tag", "rare"), Range("bucket", lt=50))))
    assert not q.index_served(Or((Eq("tag", "rare"), Range("bucket", lt=50))))
    assert q.exact_row_limit(10, 100_000) == 3605 and q.exact_row_limit(10, -1) == 1000
    queries = unit(np.random.default_rng(7), 20, DIM)
    tagged = np.arange(7, N, 100)  # 200 rows: under the limit, so an exact scan of them
    truth = tagged[np.argsort(-(queries @ data[tagged].T), axis=1)[:, :K]]
    for flt in (Eq("tag", "rare"), In("tag", ("rare", "none")), And((Eq("tag", "rare"),))):
        results = pg.search(name, queries, K, flt=flt)
        assert [[int(h.id[1:]) for h in hits] for hits in results] == truth.tolist()
    exact = pg.search(name, queries, K, search_params={"exact": True})
    full = np.argsort(-(queries @ data.T), axis=1)[:, :K]
    assert [[int(h.id[1:]) for h in hits] for hits in exact] == full.tolist()


def test_search_params_are_validated(pg: PgVectorStore, big: tuple[str, np.ndarray]) -> None:
    name, _ = big
    query = unit(np.random.default_rng(3), 1, DIM)
    for bad in (
        {"ef": 0},
        {"ef": 5000},
        {"iterative_scan": "sideways"},
        {"ef": "40; SELECT 1"},
        {"exact": "yes"},
    ):
        with pytest.raises(InvalidQuery):
            pg.search(name, query, K, search_params=bad)
    assert len(pg.search(name, query, 50, search_params={"ef": 10})[0]) == 50  # ef >= top_k


def test_timed_out_build_is_rolled_back(pg: PgVectorStore, schema: str, big: tuple[str, np.ndarray]) -> None:
    name, data = big
    before = pg.describe_index(name)
    slow = IndexSpec("HNSW", params={"M": 48, "efConstruction": 500})
    start = time.monotonic()
    with pytest.raises(IndexBuildFailed):
        pg.build_index(name, slow, timeout_s=0.2)
    assert time.monotonic() - start < 10
    assert pg.describe_index(name) == before
    with psycopg.connect(PG_URL) as conn:
        rows = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = %s",
            (schema, "c_big"),
        ).fetchall()
    assert sorted(r[0] for r in rows) == ["c_big_payload", "c_big_pkey", "c_big_vec"]
    assert pg.search(name, data[:1], 1)[0][0].id == "r0"


# -- index kinds ----------------------------------------------------------------------------


def test_halfvec_index_round_trip(pg: PgVectorStore, schema: str) -> None:
    dim = 3000  # above the 2000-dim vector index limit, within halfvec's 4000
    data = unit(np.random.default_rng(4), 300, dim)
    pg.create_collection("half", dim, metric="ip")
    pg.upsert("half", [VectorRecord(f"h{i}", data[i], {"i": i}) for i in range(300)])
    with pytest.raises(UnsupportedIndex, match="halfvec"):
        pg.build_index("half", IndexSpec("HNSW"))
    pg.build_index("half", IndexSpec("HNSW", params={"M": 8, "efConstruction": 32, "halfvec": True}))
    spec = pg.describe_index("half")
    assert spec is not None and spec.params["halfvec"] is True and spec.metric == "ip"
    plan = plan_of(pg, schema, "half", None, dim, no_seqscan=True)
    assert "Index Scan using c_half_vec" in plan and "halfvec(3000)" in plan
    hits = pg.search("half", data[:20], 3)
    assert [h[0].id for h in hits] == [f"h{i}" for i in range(20)]
    for i, h in enumerate(hits):  # scores recomputed in full precision, not half
        assert abs(h[0].score - float(data[i] @ data[i])) < 1e-5
    got = pg.get("half", ["h5"])[0]
    assert got.vector.dtype == np.float32
    np.testing.assert_array_equal(got.vector, data[5])  # the table keeps float32


def test_ivfflat_with_probes_and_filter(pg: PgVectorStore) -> None:
    rng = np.random.default_rng(5)
    data = unit(rng, 3000, 16)
    pg.create_collection("ivf", 16, metric="l2")
    payloads = [{"tag": "rare" if i % 100 == 1 else "common"} for i in range(3000)]
    pg.upsert("ivf", [VectorRecord(f"v{i}", data[i], payloads[i]) for i in range(3000)])
    pg.build_index("ivf", IndexSpec("IVF_FLAT", params={"nlist": 30}, search_params={"nprobe": 10}))
    spec = pg.describe_index("ivf")
    assert spec == IndexSpec("IVF_FLAT", "l2", {"nlist": 30}, {"nprobe": 10})
    hits = pg.search("ivf", data[:10], 5)
    assert [h[0].id for h in hits] == [f"v{i}" for i in range(10)]
    assert all(abs(h[0].score) < 1e-5 for h in hits)  # -distance to itself
    filtered = pg.search("ivf", data[:10], 10, flt=Eq("tag", "rare"))
    assert all(len(h) == 10 and all(int(x.id[1:]) % 100 == 1 for x in h) for h in filtered)


def test_unsupported_indexes_fail_fast(pg: PgVectorStore) -> None:
    pg.create_collection("small", 8)
    bad = [
        IndexSpec("IVF_PQ", params={"nlist": 8, "m": 4}),
        IndexSpec("DISKANN"),
        IndexSpec("HNSW", params={"M": 1}),
        IndexSpec("HNSW", params={"M": 16, "efConstruction": 16}),
        IndexSpec("HNSW", params={"quantization": "int8"}),
        IndexSpec("HNSW", params={"M": "16); DROP TABLE x; --"}),
        IndexSpec("IVF_FLAT", params={"nlist": 0}),
        IndexSpec("FLAT", params={"M": 16}),
        IndexSpec("HNSW", search_params={"search_list": 10}),
    ]
    for spec in bad:
        start = time.monotonic()
        with pytest.raises(UnsupportedIndex):
            pg.build_index("small", spec)
        assert time.monotonic() - start < 5
    assert pg.describe_index("small") is None
    pg.build_index("small", IndexSpec("FLAT"))
    assert pg.describe_index("small") == IndexSpec("FLAT", "cosine", {}, {})


# -- injection attempts ---------------------------------------------------------------------

EVIL = [
    "x'); DROP TABLE quarry.meta_collections; --",
    'x"; DROP SCHEMA public CASCADE; --',
    "' OR '1'='1",
    "$$; SELECT pg_sleep(10); $$",
    "\\'; --",
]


def test_evil_collection_and_alias_names_are_rejected(pg: PgVectorStore) -> None:
    pg.create_collection("victim", 4)
    for name in [*EVIL, "", "a" * 49, "1abc", "a.b", "a b"]:
        with pytest.raises(InvalidRequest):
            pg.create_collection(name, 4)
        with pytest.raises(InvalidRequest):
            pg.set_alias(name, "victim")
        assert not pg.has_collection(name)
        assert pg.resolve(name) == name
        with pytest.raises(CollectionNotFound):
            pg.count(name)
        with pytest.raises(CollectionNotFound):
            pg.set_alias("ok_alias", name)
        pg.drop_collection(name)
        pg.drop_alias(name)
    with pytest.raises(InvalidRequest):
        PgVectorStore.from_url(f"{PG_URL}?schema=x%22%3B%20DROP%20SCHEMA%20public%3B%20--")
    assert "victim" in pg.list_collections()


def test_evil_filter_values_and_ids_are_plain_data(pg: PgVectorStore) -> None:
    rng = np.random.default_rng(6)
    data = unit(rng, len(EVIL) + 1, 4)
    pg.create_collection("inj", 4)
    records = [VectorRecord(v, data[i], {"s": v, "l": [v, "x"]}) for i, v in enumerate(EVIL)]
    records.append(VectorRecord("plain", data[-1], {"s": "plain", "l": ["x"]}))
    pg.upsert("inj", records)
    for i, value in enumerate(EVIL):
        assert pg.count("inj", Eq("s", value)) == 1
        assert pg.count("inj", Eq("l", value)) == 1
        assert pg.count("inj", In("s", (value, "nothing"))) == 1
        hits = pg.search("inj", data[:1], 10, flt=Eq("s", value))[0]
        assert [h.id for h in hits] == [value] and hits[0].payload["s"] == value
        assert [r.id for r in pg.get("inj", [value])] == [EVIL[i]]
        cond, params = q.compile_filter(Or((Eq("s", value), In("l", (value,)))))
        assert value not in cond.as_string()  # values are bound, never in the text
    with pytest.raises(InvalidFilter):
        parse_filter({"s'); DROP TABLE x; --": 1})
    for flt in (Eq("a') OR 1=1 --", 1), Range("n' OR 1=1", gt=0), In("s s", ("x",))):
        with pytest.raises(InvalidFilter):
            pg.count("inj", flt)
        with pytest.raises(InvalidFilter):
            pg.delete_by_filter("inj", And((Eq("s", "plain"), flt)))
    pg.delete("inj", ["' OR '1'='1", "nope' OR '1'='1"])
    assert pg.count("inj") == len(EVIL)
    assert pg.count("inj", Eq("s", "plain")) == 1


def test_range_ignores_non_numbers_without_cast_errors(pg: PgVectorStore) -> None:
    pg.create_collection("mixed", 2)
    payloads: list[dict[str, Any]] = [
        {"n": 5},
        {"n": 5.5},
        {"n": "7"},
        {"n": True},
        {"n": ["6"]},
        {"n": "not a number"},
        {},
    ]
    vec = np.array([1.0, 0.0], np.float32)
    pg.upsert("mixed", [VectorRecord(f"m{i}", vec, p) for i, p in enumerate(payloads)])
    assert pg.count("mixed", Range("n", gte=5)) == 2
    assert pg.count("mixed", Eq("n", 5.0)) == 1  # numeric equality, as in matches()
    assert pg.count("mixed", Eq("n", 1)) == 0  # true is not 1
    assert pg.count("mixed", Eq("n", True)) == 1


def test_dimension_guard_names_both_dims(pg: PgVectorStore) -> None:
    pg.create_collection("dims", 8)
    good = VectorRecord("a", np.zeros(8, np.float32))
    bad = VectorRecord("b", np.zeros(9, np.float32))
    with pytest.raises(DimensionMismatch, match="9.*8"):
        pg.upsert("dims", [good, bad])
    assert pg.count("dims") == 0
    with pytest.raises(InvalidRequest, match="NaN"):
        pg.upsert("dims", [VectorRecord("n", np.full(8, np.nan, np.float32))])
    assert pg.count("dims") == 0
