"""Index planner: choices per backend for 10k / 1M / 50M / 500M vectors of dim 384 and 768.

Pure tests (no engine). The capability fixtures mirror what each backend's ``capabilities()``
declares (``stores/milvus.py``, ``stores/pgvector.py``, ``stores/qdrant.py``); the GloVe recall
test checks the plans against the real engines.
"""

from __future__ import annotations

import itertools
import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from indexing.index_sizing import GIB, flat_bytes, hnsw_bytes, ivf_nlist, ivf_pq_bytes
from indexing.planner import IndexPlan, ensure_buildable, format_plan, plan_index, plan_kind
from quarry.errors import InvalidRequest, UnsupportedIndex
from stores.base import IndexSpec, StoreCapabilities

BUDGET = 16 * GIB

CAPS = {
    "milvus-lite": StoreCapabilities("milvus-lite", "2.5.1", frozenset({"FLAT", "IVF_FLAT"}), max_dim=32768),
    "milvus": StoreCapabilities(
        "milvus",
        "2.3.5",
        frozenset({"FLAT", "HNSW", "IVF_FLAT", "IVF_PQ", "DISKANN"}),
        max_dim=32768,
    ),
    "qdrant-edge": StoreCapabilities("qdrant-edge", "0.9", frozenset({"FLAT", "HNSW"})),
    "pgvector": StoreCapabilities(
        "pgvector", "PostgreSQL 18 + pgvector 0.8", frozenset({"FLAT", "HNSW", "IVF_FLAT"}), 2000
    ),
}

SIZES = (10_000, 1_000_000, 50_000_000, 500_000_000)
DIMS = (384, 768)

# (backend, n, dim) -> (ideal, chosen kind, fits, substrings of params/fallback reason)
EXPECTED: dict[tuple[str, int, int], tuple[str, str, bool, tuple[str, ...]]] = {}
for _b, _d in itertools.product(CAPS, DIMS):
    EXPECTED[(_b, 10_000, _d)] = ("FLAT", "FLAT", True, ())
for _d, _m in ((384, 24), (768, 32)):
    for _b in ("milvus", "qdrant-edge", "pgvector"):
        EXPECTED[(_b, 1_000_000, _d)] = ("HNSW", "HNSW", True, (f"'M': {_m}",))
    EXPECTED[("milvus-lite", 1_000_000, _d)] = (
        "HNSW",
        "IVF_FLAT",
        True,
        ("milvus-lite 2.5.1 cannot build HNSW; using IVF_FLAT",),
    )
EXPECTED.update(
    {
        ("milvus", 50_000_000, 384): ("IVF_PQ", "IVF_PQ", True, ("'m': 192", "'nlist': 32768")),
        ("milvus", 50_000_000, 768): ("IVF_PQ", "IVF_PQ", True, ("'m': 192", "'nlist': 32768")),
        ("qdrant-edge", 50_000_000, 384): (
            "IVF_PQ",
            "HNSW",
            True,
            ("qdrant-edge 0.9 cannot build IVF_PQ", "product quantization x8 (vectors and graph on disk)", "'M': 32"),
        ),
        ("qdrant-edge", 50_000_000, 768): (
            "IVF_PQ",
            "HNSW",
            True,
            ("cannot build IVF_PQ", "product quantization x16 (vectors and graph on disk)", "'on_disk': True"),
        ),
        ("pgvector", 50_000_000, 384): (
            "IVF_PQ",
            "HNSW",
            False,
            ("cannot build IVF_PQ; using HNSW on halfvec", "'halfvec': True", "none of"),
        ),
        ("pgvector", 50_000_000, 768): (
            "IVF_PQ",
            "HNSW",
            False,
            ("cannot build IVF_PQ; using HNSW on halfvec", "none of"),
        ),
        ("milvus-lite", 50_000_000, 384): (
            "IVF_PQ",
            "IVF_FLAT",
            False,
            ("milvus-lite 2.5.1 cannot build IVF_PQ; using IVF_FLAT", "none of"),
        ),
        ("milvus-lite", 50_000_000, 768): ("IVF_PQ", "IVF_FLAT", False, ("cannot build IVF_PQ",)),
        ("milvus", 500_000_000, 384): ("DISKANN", "DISKANN", True, ("'search_list': 100",)),
        ("milvus", 500_000_000, 768): ("DISKANN", "DISKANN", True, ("'search_list': 100",)),
        ("qdrant-edge", 500_000_000, 384): (
            "DISKANN",
            "HNSW",
            True,
            ("cannot build DISKANN", "product quantization x64 (vectors and graph on disk)"),
        ),
        ("qdrant-edge", 500_000_000, 768): (
            "DISKANN",
            "HNSW",
            False,
            ("cannot build DISKANN", "x64 (vectors and graph on disk)", "none of"),
        ),
        ("pgvector", 500_000_000, 384): ("DISKANN", "HNSW", False, ("cannot build DISKANN",)),
        ("pgvector", 500_000_000, 768): ("DISKANN", "HNSW", False, ("HNSW on halfvec",)),
        ("milvus-lite", 500_000_000, 384): ("DISKANN", "IVF_FLAT", False, ("cannot build",)),
        ("milvus-lite", 500_000_000, 768): ("DISKANN", "IVF_FLAT", False, ("cannot build",)),
    }
)


def _text(plan: IndexPlan) -> str:
    return f"{plan.spec.params} {plan.spec.search_params} {plan.fallback_reason}"


@pytest.mark.parametrize(("backend", "n", "dim"), sorted(EXPECTED))
def test_choice_per_backend(backend: str, n: int, dim: int) -> None:
    ideal, kind, fits, needles = EXPECTED[(backend, n, dim)]
    plan = plan_index(n, dim, CAPS[backend], BUDGET)
    assert (plan.ideal, plan.spec.kind, plan.fits) == (ideal, kind, fits), format_plan(plan)
    for needle in needles:
        assert needle in _text(plan), format_plan(plan)
    assert (plan.fallback_reason is None) == (plan.ideal == plan.spec.kind and plan.fits)


def test_every_grid_point_is_covered() -> None:
    assert set(EXPECTED) == set(itertools.product(CAPS, SIZES, DIMS))


@pytest.mark.parametrize(
    ("backend", "n", "dim", "top_k"),
    [
        (b, n, d, k)
        for b, n, d, k in itertools.product(
            CAPS,
            (0, 1, 19_999, 20_000, 100_000, *SIZES, 2_000_000_000),
            (50, 384, 768, 1536),
            (1, 10, 100),
        )
    ],
)
def test_invariants(backend: str, n: int, dim: int, top_k: int) -> None:
    caps = CAPS[backend]
    plan = plan_index(n, dim, caps, BUDGET, top_k=top_k)
    spec = plan.spec
    assert spec.kind in caps.index_kinds
    ensure_buildable(spec, caps, dim)
    assert plan.fits == (plan.estimated_bytes <= BUDGET)
    if spec.kind == "IVF_PQ":
        assert dim % spec.params["m"] == 0
        assert dim // spec.params["m"] in (2, 4, 8)
        assert spec.params["nbits"] == 8
    if spec.kind in ("IVF_PQ", "IVF_FLAT"):
        nlist = spec.params["nlist"]
        assert nlist & (nlist - 1) == 0 and 16 <= nlist <= 65_536
        if backend == "pgvector":
            assert nlist <= 32_768  # ivfflat lists limit
        assert top_k <= spec.search_params["nprobe"] <= nlist
    if spec.kind == "HNSW":
        assert 16 <= spec.params["M"] <= 48
        assert spec.params["efConstruction"] == 200
        assert spec.search_params["ef"] >= max(top_k, 64)
    if spec.kind == "DISKANN":
        assert top_k <= spec.search_params["search_list"] <= 200
    if plan.ideal == spec.kind and plan.fits:
        assert plan.fallback_reason is None
    else:
        assert plan.fallback_reason
    json.dumps(plan.to_dict())
    assert spec.kind in format_plan(plan)


def test_small_collections_are_exact_everywhere() -> None:
    for caps in CAPS.values():
        plan = plan_index(19_999, 768, caps, BUDGET)
        assert (plan.ideal, plan.spec.kind, plan.spec.params) == ("FLAT", "FLAT", {})
        assert "recall 1.0" in plan.reason


def test_glove_100k_defaults() -> None:
    """The plan the GloVe recall test builds: HNSW M=16, ef 64; Milvus Lite goes exact."""
    for name in ("milvus", "qdrant-edge", "pgvector"):
        plan = plan_index(100_000, 50, CAPS[name], BUDGET)
        assert plan.spec == IndexSpec("HNSW", "cosine", {"M": 16, "efConstruction": 200}, {"ef": 64})
    lite = plan_index(100_000, 50, CAPS["milvus-lite"], BUDGET)
    assert lite.spec.kind == "FLAT" and lite.ideal == "HNSW"
    assert lite.fallback_reason is not None
    assert "cannot build HNSW; using FLAT (exact" in lite.fallback_reason


def test_memory_formulas_match_the_documented_rules() -> None:
    assert flat_bytes(1_000_000, 384) == 1_536_000_000
    assert hnsw_bytes(1_000_000, 384, 16) == 1_000_000 * (384 * 4 + 16 * 2 * 4)
    assert hnsw_bytes(1_000_000, 384, 16, 2) == 1_000_000 * (384 * 2 + 16 * 2 * 4)
    assert ivf_pq_bytes(50_000_000, 384, 32_768, 192) == 50_000_000 * 200 + 32_768 * 384 * 4
    assert [ivf_nlist(n) for n in (20_000, 1_000_000, 50_000_000, 500_000_000)] == [
        512,
        4096,
        32_768,
        65_536,
    ]


def test_plan_estimate_is_the_chosen_formula() -> None:
    plan = plan_index(1_000_000, 768, CAPS["milvus"], BUDGET)
    assert plan.estimated_bytes == hnsw_bytes(1_000_000, 768, 32)
    ivf = plan_index(50_000_000, 384, CAPS["milvus"], BUDGET)
    assert ivf.estimated_bytes == ivf_pq_bytes(50_000_000, 384, 32_768, 192)
    assert ivf.estimated_bytes <= BUDGET


def test_budget_drives_the_choice() -> None:
    caps = CAPS["milvus"]
    assert plan_index(10_000_000, 768, caps, 64 * GIB).spec.kind == "HNSW"
    assert plan_index(10_000_000, 768, caps, 8 * GIB).spec.kind == "IVF_PQ"
    tight = plan_index(10_000_000, 768, caps, 1 * GIB)
    assert tight.spec.kind == "DISKANN" and tight.fits
    assert tight.server_config["DiskIndex.PQCodeBudgetGBRatio"] <= 0.125


def test_diskann_codes_stay_within_milvus_range_and_floor() -> None:
    plan = plan_index(500_000_000, 384, CAPS["milvus"], BUDGET)
    ratio = plan.server_config["DiskIndex.PQCodeBudgetGBRatio"]
    assert 0 < ratio <= 0.125
    assert plan.estimated_bytes / 500_000_000 >= 32
    huge = plan_index(2_000_000_000, 768, CAPS["milvus"], BUDGET)
    assert huge.spec.kind == "DISKANN" and not huge.fits
    assert huge.estimated_bytes == 2_000_000_000 * 32


def test_pgvector_wide_vectors_use_halfvec() -> None:
    plan = plan_index(1_000_000, 3072, CAPS["pgvector"], BUDGET)
    assert plan.spec.kind == "HNSW" and plan.spec.params["halfvec"] is True
    assert plan.fallback_reason is not None
    assert "cannot index 3072-dim vectors with HNSW (max 2000)" in plan.fallback_reason
    ensure_buildable(plan.spec, CAPS["pgvector"], 3072)
    too_wide = plan_index(1_000_000, 5000, CAPS["pgvector"], BUDGET)
    assert too_wide.spec.kind == "FLAT"


def test_ivf_flat_fallback_and_cheap_exact_fallback() -> None:
    caps = StoreCapabilities("toy", "1", frozenset({"FLAT", "IVF_FLAT"}))
    assert plan_index(100_000, 50, caps, BUDGET).spec.kind == "FLAT"
    plan = plan_index(2_000_000, 384, caps, BUDGET)
    assert plan.spec.kind == "IVF_FLAT"
    assert plan.spec.search_params["nprobe"] == plan.spec.params["nlist"] // 16


def test_pgvector_ivfflat_lists_are_capped() -> None:
    caps = StoreCapabilities("pgvector", "0.8", frozenset({"FLAT", "IVF_FLAT"}), 2000)
    plan = plan_index(500_000_000, 384, caps, BUDGET)
    assert plan.spec.kind == "IVF_FLAT" and plan.spec.params["nlist"] == 32_768


def test_engine_without_flat_gets_hnsw_for_small_collections() -> None:
    caps = StoreCapabilities("toy", "1", frozenset({"HNSW"}))
    plan = plan_index(1000, 384, caps, BUDGET)
    assert plan.spec.kind == "HNSW" and plan.fallback_reason is not None


def test_explain_and_dict_carry_the_reasons() -> None:
    plan = plan_index(50_000_000, 384, CAPS["pgvector"], BUDGET)
    text = plan.explain()
    assert "WARNING" in text and "cannot build IVF_PQ" in text
    data = plan.to_dict()
    assert data["ideal"] == "IVF_PQ" and data["kind"] == "HNSW" and data["fits"] is False
    assert data["estimated_bytes"] == plan.estimated_bytes
    rendered = format_plan(plan)
    assert "DOES NOT FIT" in rendered and "fallback" in rendered


@pytest.mark.parametrize(
    ("n", "dim", "budget", "top_k"),
    [(-1, 8, GIB, 10), (10, 0, GIB, 10), (10, 8, 0, 10), (10, 8, GIB, 0)],
)
def test_bad_inputs_are_rejected(n: int, dim: int, budget: int, top_k: int) -> None:
    with pytest.raises(InvalidRequest):
        plan_index(n, dim, CAPS["milvus"], budget, top_k=top_k)


def test_engine_with_no_usable_kind_is_a_typed_error() -> None:
    with pytest.raises(UnsupportedIndex):
        plan_index(1000, 8, StoreCapabilities("none", "0", frozenset()), GIB)


@pytest.mark.parametrize("backend", ["milvus", "pgvector", "milvus-lite", "qdrant-edge"])
def test_a_kind_asked_for_gets_the_planners_parameters(backend: str) -> None:
    """``reindex --index KIND`` at a size where the planner itself picks FLAT: the kind still gets its parameters."""
    caps = CAPS[backend]
    for kind in ("ivf_flat", "IVF_FLAT", "hnsw"):
        if kind.upper() not in caps.index_kinds:
            with pytest.raises(UnsupportedIndex, match=f"cannot build {kind.upper()}"):
                plan_kind(kind, 2_000, 384, caps, BUDGET, top_k=200)
            continue
        spec = plan_kind(kind, 2_000, 384, caps, BUDGET, "ip", top_k=200)
        assert spec.kind == kind.upper() and spec.metric == "ip"
        if spec.kind == "IVF_FLAT":  # nlist 4·sqrt(2000) ~ 179 -> 128; every list probed for 200 candidates
            assert spec.params == {"nlist": ivf_nlist(2_000)} == {"nlist": 128} and spec.search_params["nprobe"] == 128
        else:
            assert spec.params == {"M": 24, "efConstruction": 200} and spec.search_params["ef"] == 400  # 2 x depth
    assert plan_kind("flat", 10, 384, caps, BUDGET) == IndexSpec("FLAT", "cosine")


def test_a_kind_asked_for_follows_the_engines_limits() -> None:
    pg = CAPS["pgvector"]
    wide = plan_kind("hnsw", 2_000, 3_000, pg, BUDGET, top_k=200)  # over pgvector's 2000 dims: halfvec
    assert wide.kind == "HNSW" and wide.params["halfvec"] is True
    assert plan_kind("ivf_flat", 10**9, 384, pg, 10**6 * GIB).params["nlist"] == 32_768  # pgvector's cap
    pq = plan_kind("ivf_pq", 1_000_000, 384, CAPS["milvus"], BUDGET)
    assert pq.params["m"] == 192 and pq.params["nbits"] == 8  # the least compression that fits
    assert plan_kind("diskann", 10**6, 384, CAPS["milvus"], BUDGET, top_k=200).search_params["search_list"] == 200
    with pytest.raises(UnsupportedIndex, match="unknown index kind 'annoy'"):
        plan_kind("annoy", 10, 384, pg, BUDGET)
    with pytest.raises(UnsupportedIndex, match="cannot build HNSW on 40000-dim"):
        plan_kind("hnsw", 10, 40_000, CAPS["milvus"], BUDGET)


def test_ensure_buildable_fails_fast() -> None:
    with pytest.raises(UnsupportedIndex, match="milvus-lite 2.5.1 cannot build a HNSW index"):
        ensure_buildable(IndexSpec("HNSW"), CAPS["milvus-lite"], 384)
    with pytest.raises(UnsupportedIndex, match="at most 2000"):
        ensure_buildable(IndexSpec("HNSW"), CAPS["pgvector"], 3000)
    with pytest.raises(UnsupportedIndex, match="at most 4000"):
        ensure_buildable(IndexSpec("HNSW", params={"halfvec": True}), CAPS["pgvector"], 5000)
    ensure_buildable(IndexSpec("FLAT"), CAPS["pgvector"], 16000)


# ---------------------------------------------------------------- fallback specs on the real engines

FALLBACK_CASES = [
    ("qdrant-edge", 50_000_000, 384),  # HNSW + PQ x8, vectors and graph on disk
    ("qdrant-edge", 500_000_000, 384),  # HNSW + PQ x64, on disk
    ("pgvector", 50_000_000, 384),  # HNSW on halfvec
    ("pgvector", 1_000_000, 3072),  # wider than vector's 2000: HNSW on halfvec
    ("milvus-lite", 1_000_000, 384),  # IVF_FLAT instead of HNSW
]


def _fallback_params() -> list[object]:
    from tests.stores.conftest import BACKENDS

    by_id = {b.id: b for b in BACKENDS}
    return [
        pytest.param(by_id[b], n, d, id=f"{b}-{n}-{d}", marks=[pytest.mark.integration] if by_id[b].server else [])
        for b, n, d in FALLBACK_CASES
    ]


@pytest.mark.parametrize(("backend", "n", "dim"), _fallback_params())
def test_fallback_specs_build_on_the_real_engine(backend: Any, n: int, dim: int, tmp_path: Path) -> None:
    """The planner's fallback spec (planned for n vectors) is accepted by the engine it was planned for."""
    from stores.base import VectorRecord
    from stores.factory import open_store
    from tests.stores.conftest import _require_service

    url = backend.url(tmp_path)
    if backend.server:
        _require_service(backend, url)
    store = open_store(url)
    name = f"plan_{uuid.uuid4().hex[:8]}"
    try:
        plan = plan_index(n, dim, store.capabilities(), BUDGET)
        assert plan.fallback_reason, format_plan(plan)
        store.create_collection(name, dim)
        rows = np.random.default_rng(7).standard_normal((2000, dim)).astype(np.float32)
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        store.upsert(name, [VectorRecord(str(i), v) for i, v in enumerate(rows)])
        spec = plan.spec
        if spec.kind == "IVF_FLAT":  # the planned nlist is for n vectors; 2,000 rows train 32 lists
            spec = IndexSpec(spec.kind, spec.metric, {**spec.params, "nlist": 32}, {"nprobe": 8})
        store.build_index(name, spec, timeout_s=600)
        hits = store.search(name, rows[:5], 10)
        assert [len(h) for h in hits] == [10] * 5
        assert [h[0].id for h in hits] == [str(i) for i in range(5)]
    finally:
        store.drop_collection(name)
        store.close()
