"""Milvus-specific checks: the expression compiler, Lite limits, and the 2.3 server's index builds."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from quarry.errors import (
    CollectionNotFound,
    ConfigError,
    IndexBuildFailed,
    InvalidFilter,
    InvalidRequest,
    UnsupportedIndex,
)
from stores.base import IndexSpec, VectorRecord, VectorStore
from stores.factory import open_store
from stores.filters import And, Eq, In, Or, Range
from stores.milvus import MilvusStore
from stores.milvus_expr import compile_filter, decode_id, encode_id, quote_str

REPO = Path(__file__).resolve().parents[2]
DIM = 16


def unit(n: int, seed: int = 0, dim: int = DIM) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def fill(store: VectorStore, name: str, n: int, **kwargs: object) -> np.ndarray:
    data = unit(n, dim=int(kwargs.get("dim", DIM)))  # type: ignore[call-overload]
    store.create_collection(name, data.shape[1])
    for start in range(0, n, 5000):
        store.upsert(
            name,
            [VectorRecord(f"r{i}", data[i], {"i": i}) for i in range(start, min(start + 5000, n))],
        )
    return data


@pytest.fixture()
def name() -> str:
    return f"m_{uuid.uuid4().hex[:12]}"


# -- the expression compiler (no engine) ---------------------------------------------------


def test_string_literals_are_escaped() -> None:
    assert quote_str('a"b', lite=True) == '"a\\"b"'
    assert quote_str("a\\b", lite=True) == '"a\\\\b"'
    assert quote_str('" or 1==1 or "', lite=True) == '"\\" or 1==1 or \\""'
    assert quote_str("a\nb", lite=False) == '"a\\nb"'
    with pytest.raises(InvalidFilter, match="line breaks"):
        quote_str("a\nb", lite=True)


def test_compiled_filters() -> None:
    assert compile_filter(Eq("tag", "x"), lite=True) == '(payload["tag"] == "x" or json_contains(payload["tag"], "x"))'
    assert compile_filter(Range("n", gte=1, lt=2.5), lite=True) == ('(payload["n"] >= 1 and payload["n"] < 2.5)')
    mixed = compile_filter(In("v", ("a", 1, True)), lite=True)
    assert mixed.count(" in [") == 3, "one in-clause per value type (Milvus asserts on mixes)"
    nested = compile_filter(Or((And((Eq("a", 1), Eq("b", False))), Eq("c", 2.0))), lite=True)
    assert nested.startswith("((") and "false" in nested and "2.0" in nested


@pytest.mark.parametrize(
    "bad",
    [Eq('a"]==1 or payload["b', 1), Eq("1abc", 1), Range("n", lt=float("nan")), Eq("n", float("inf"))],
)
def test_bad_fields_and_numbers_are_rejected(bad: Eq | Range) -> None:
    with pytest.raises(InvalidFilter):
        compile_filter(bad, lite=False)


def test_id_encoding_round_trips() -> None:
    rnd = random.Random(0)
    alphabet = "ab%'\"\\\n\t\x00\x7f中é %41%%"
    for _ in range(2000):
        raw = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 12)))
        key = encode_id(raw)
        assert decode_id(key) == raw
        assert not set(key) & set("'\"\\\n\t\x00\x7f")
    assert encode_id("doc-1#0") == "doc-1#0"


# -- Milvus Lite -------------------------------------------------------------------------------


def test_url_forms() -> None:
    with pytest.raises(ConfigError):
        open_store("milvus:///tmp/not-a-db-file")
    with pytest.raises(ConfigError):
        open_store("milvus://")


def test_milvus_names_are_checked(milvus_lite: VectorStore, name: str) -> None:
    for bad in ("my-docs", "1abc", "a b", 'x"y'):
        with pytest.raises(InvalidRequest, match="name"):
            milvus_lite.create_collection(bad, DIM)
    milvus_lite.create_collection(name, DIM)
    with pytest.raises(InvalidRequest, match="name"):
        milvus_lite.set_alias("live-docs", name)


def test_lite_refuses_hnsw_pq_diskann_fast(milvus_lite: VectorStore, name: str) -> None:
    fill(milvus_lite, name, 200)
    assert milvus_lite.capabilities().index_kinds == {"FLAT", "IVF_FLAT"}
    for kind in ("HNSW", "IVF_PQ", "DISKANN"):
        start = time.monotonic()
        with pytest.raises(UnsupportedIndex, match=kind):
            milvus_lite.build_index(name, IndexSpec(kind))  # type: ignore[arg-type]
        assert time.monotonic() - start < 2.0
    with pytest.raises(UnsupportedIndex, match="metric"):
        milvus_lite.build_index(name, IndexSpec("IVF_FLAT", metric="l2", params={"nlist": 4}))
    assert milvus_lite.count(name) == 200 and milvus_lite.describe_index(name) is None


def test_lite_line_break_filter_is_rejected_not_ignored(milvus_lite: VectorStore, name: str) -> None:
    milvus_lite.create_collection(name, DIM)
    milvus_lite.upsert(name, [VectorRecord("a", unit(1)[0], {"s": "x\ny"})])
    with pytest.raises(InvalidFilter):
        milvus_lite.count(name, Eq("s", "x\ny"))


def test_lite_ivf_flat_keeps_search_params(milvus_lite: VectorStore, name: str) -> None:
    data = fill(milvus_lite, name, 2000)
    spec = IndexSpec("IVF_FLAT", params={"nlist": 16}, search_params={"nprobe": 16})
    milvus_lite.build_index(name, spec, timeout_s=120)
    assert milvus_lite.describe_index(name) == spec
    hits = milvus_lite.search(name, data[:5], 3)
    assert [h[0].id for h in hits] == [f"r{i}" for i in range(5)]


def test_lite_file_is_held_by_one_process(tmp_path: Path) -> None:
    url = f"milvus://{tmp_path}/held.db"
    probe = (
        "import sys\nfrom quarry.errors import StoreUnavailable\nfrom stores.factory import open_store\n"
        "try:\n    open_store(sys.argv[1]).close()\nexcept StoreUnavailable as exc:\n"
        "    print(exc)\n    sys.exit(7)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def other_process() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", probe, url],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    store = open_store(url)
    try:
        held = other_process()
        assert held.returncode == 7, held.stderr[-2000:]
        assert "another process" in held.stdout and f"pid {os.getpid()}" in held.stdout
        # and again: milvus-lite's own lock file is unlinked by the process it refused, so a
        # second try used to open the database beside its owner
        assert other_process().returncode == 7
    finally:
        store.close()
    assert other_process().returncode == 0, "closing the last store frees the file"


def test_lite_alias_table_is_hidden(milvus_lite: VectorStore, name: str) -> None:
    milvus_lite.create_collection(name, DIM)
    milvus_lite.set_alias(f"{name}_live", name)
    assert milvus_lite.list_collections() == [name]
    assert not milvus_lite.has_collection("_quarry_meta")
    with pytest.raises(CollectionNotFound):
        milvus_lite.count("_quarry_meta")
    milvus_lite.drop_collection(name)
    assert not milvus_lite.has_collection(f"{name}_live"), "dropping drops its aliases"


# -- Milvus 2.3 server ---------------------------------------------------------------------


@pytest.fixture()
def server_coll(milvus_server: VectorStore, name: str) -> Iterator[str]:
    yield name
    milvus_server.drop_collection(name)


@pytest.mark.integration
def test_server_diskann_stall_is_rolled_back(milvus_server: VectorStore, server_coll: str) -> None:
    data = fill(milvus_server, server_coll, 3000)
    caps = milvus_server.capabilities()
    assert caps.version.lstrip("v").startswith("2.3."), f"the stall is Milvus 2.3's: {caps.version}"
    start = time.monotonic()
    with pytest.raises(IndexBuildFailed, match=rf"DISKANN build on '{server_coll}' stalled: .* at the timeout"):
        milvus_server.build_index(server_coll, IndexSpec("DISKANN"), timeout_s=20)
    assert time.monotonic() - start < 60, "bounded by the timeout (plus the rollback)"
    assert milvus_server.describe_index(server_coll) is None
    assert milvus_server.count(server_coll) == 3000
    assert milvus_server.search(server_coll, data[:1], 3)[0][0].id == "r0"
    hnsw = IndexSpec("HNSW", params={"M": 16, "efConstruction": 64}, search_params={"ef": 8})
    milvus_server.build_index(server_coll, hnsw, timeout_s=120)
    assert milvus_server.describe_index(server_coll) == hnsw
    hits = milvus_server.search(server_coll, data[:2], 50)
    assert [len(h) for h in hits] == [50, 50], "ef is raised to top_k"
    assert [h[0].id for h in hits] == ["r0", "r1"]


@pytest.mark.integration
def test_server_ivf_pq_and_bad_params(milvus_server: VectorStore, server_coll: str) -> None:
    data = fill(milvus_server, server_coll, 3000)
    start = time.monotonic()
    with pytest.raises(UnsupportedIndex):
        milvus_server.build_index(server_coll, IndexSpec("HNSW", params={"M": 100000}))
    assert time.monotonic() - start < 10
    assert milvus_server.describe_index(server_coll) is None
    pq = IndexSpec("IVF_PQ", params={"nlist": 16, "m": 4, "nbits": 8}, search_params={"nprobe": 16})
    milvus_server.build_index(server_coll, pq, timeout_s=120)
    assert milvus_server.describe_index(server_coll) == pq
    assert len(milvus_server.search(server_coll, data[:1], 10)[0]) == 10


@pytest.mark.integration
def test_server_matches_line_breaks_and_drops_aliases(milvus_server: VectorStore, server_coll: str) -> None:
    milvus_server.create_collection(server_coll, DIM)
    milvus_server.upsert(server_coll, [VectorRecord("a", unit(1)[0], {"s": "x\ny"})])
    assert milvus_server.count(server_coll, Eq("s", "x\ny")) == 1
    alias = f"{server_coll}_live"
    milvus_server.set_alias(alias, server_coll)
    milvus_server.drop_collection(server_coll)
    assert not milvus_server.has_collection(alias), "Milvus 2.3 would leave a dangling alias"


@pytest.mark.integration
def test_server_session_consistency_reads_own_writes(name: str) -> None:
    """``?consistency=Session`` skips Strong's wait for a time tick but still reads our writes."""
    url = os.environ.get("QUARRY_TEST_MILVUS_URL", "milvus://127.0.0.1:19530")
    store = open_store(f"{url}?consistency=Session")
    try:
        data = unit(200, seed=3)
        store.create_collection(name, DIM)
        for step in range(5):
            ids = [f"s{step}-{i}" for i in range(40)]
            store.upsert(name, [VectorRecord(i, data[n], {"step": step}) for n, i in enumerate(ids)])
            assert store.count(name) == 40 * (step + 1)
            assert store.search(name, data[:1], 1, flt=Eq("step", step))[0][0].id == f"s{step}-0"
        store.delete_by_filter(name, Eq("step", 0))
        assert store.count(name) == 160
    finally:
        store.drop_collection(name)
        store.close()
    with pytest.raises(ConfigError, match="consistency"):
        open_store(f"{url}?consistency=Sometimes")


@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_payload_free_search_reads_the_answer_arrays_like_the_public_api(
    milvus_lite: VectorStore, name: str, metric: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path (ids/scores from the protobuf answer) and pymilvus' public search agree,
    with a filter, on ids that need escaping, for several queries; without the internals the
    store falls back to the public API."""
    store = cast(MilvusStore, milvus_lite)
    assert store._fast_ids
    data = unit(300, seed=5)
    store.create_collection(name, DIM, metric)
    store.upsert(name, [VectorRecord(f"d'{i}%:\"x", v, {"tag": i % 3}) for i, v in enumerate(data)])
    queries, flt = unit(4, seed=6), In("tag", [0, 2])
    fast = store.search(name, queries, 20, flt, with_payload=False)
    public = store.search(name, queries, 20, flt)
    assert [[h.id for h in q] for q in fast] == [[h.id for h in q] for q in public]
    assert all(h.id.startswith("d'") and int(h.id[2:].split("%")[0]) % 3 != 1 for q in fast for h in q)
    for a, b in zip(fast, public, strict=True):
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], atol=1e-6)
    monkeypatch.setattr(store, "_fast_ids", False)
    slow = store.search(name, queries, 20, flt, with_payload=False)
    assert [[(h.id, h.score) for h in q] for q in slow] == [[(h.id, h.score) for h in q] for q in fast]


def test_fast_path_is_off_when_pymilvus_lacks_its_internals() -> None:
    from stores import milvus_fastpath

    assert not milvus_fastpath.available(object())  # no _get_connection(): the public API is used


def test_fast_path_transport_errors_fall_back_to_the_public_search(
    milvus_lite: VectorStore, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stores import milvus_fastpath

    fill(milvus_lite, name, 50)
    expected = milvus_lite.search(name, unit(2, seed=3), 5, with_payload=False)
    # search_ids answers None when its raw gRPC call fails in transport (it cannot be made to
    # fail here without breaking the public path's shared channel too).
    monkeypatch.setattr(milvus_fastpath, "search_ids", lambda *args, **kwargs: None)
    assert milvus_lite.search(name, unit(2, seed=3), 5, with_payload=False) == expected


@pytest.mark.parametrize("page", [1000, 40], ids=["one-query", "iterator"])
@pytest.mark.parametrize("engine", ["lite", pytest.param("server", marks=pytest.mark.integration)])
def test_id_set_route_reads_every_payload_in_one_query_or_in_pages(
    engine: str, page: int, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$prefix``/``$ne`` scan the payloads: one query under a page, ``query_iterator`` past it; same ids."""
    from stores import milvus
    from stores.filters import Ne, Prefix

    url = f"milvus://{tmp_path}/quarry.db" if engine == "lite" else os.environ.get(
        "QUARRY_TEST_MILVUS_URL", "milvus://127.0.0.1:19530"
    )
    store = open_store(url)
    try:
        monkeypatch.setattr(milvus, "_BATCH", page)  # 150 records: one page of 1,000 or four of 40
        data = unit(150)
        store.create_collection(name, DIM)
        store.upsert(name, [VectorRecord(f"r{i}", data[i], {"p": f"d/{i % 7}", "i": i}) for i in range(150)])
        cases = ((Prefix("p", "d/3"), {i for i in range(150) if i % 7 == 3}), (Ne("i", 5), set(range(150)) - {5}))
        for flt, want in cases:
            assert store.count(name, flt) == len(want), flt
            assert {h.id for h in store.search(name, data[:1], 150, flt=flt)[0]} == {f"r{i}" for i in want}, flt
    finally:
        store.drop_collection(name)
        store.close()
