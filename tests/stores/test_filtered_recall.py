"""Filtered recall does not depend on how a filter is written (issue 20, finding 10).

Per backend, one collection of 20k x 32 random unit vectors with an ANN index actually built
(:func:`eval.filtered.ann_spec`: HNSW, IVF_FLAT on Milvus Lite; the planner would pick FLAT at
this size and Qdrant would scan it exactly), loaded once per module. The same 0.1 % (20 rows)
and 1 % (200 rows) sets are selected as a string equality, a numeric equality, a ``$in``, a range
and an ``$or`` of equalities (:func:`eval.filtered.selections`); each form must give exactly 10
hits, all matching, at recall@10 >= 0.95 against numpy brute force over the matching rows, and
every form of one set must take the same route (:class:`stores.routing.FilterRouter`). A broad
filter (50 %) takes the index and still gives exactly 10 hits.

``qdrant-local`` (qdrant-client's brute-force emulation: exact by construction, it never routes)
is left out: it commits every point to SQLite, and 20k points take about 7 minutes to load.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from eval.filtered import FORMS, FilteredData, Selection, ann_spec, exact_top, make_data, recall, selections
from stores.factory import open_store
from stores.filters import In, Range, matches
from tests.stores.conftest import BACKENDS, Backend, _require_service

TOP_K = 10
ROUTED = [b for b in BACKENDS if b.id != "qdrant-local"]
DATA = make_data()
SELECTIONS = selections(DATA)


@dataclass
class Loaded:
    """One backend holding the dataset under an ANN index."""

    backend: str
    store: Any
    name: str
    data: FilteredData


def _params() -> list[Any]:
    return [pytest.param(b, id=b.id, marks=[pytest.mark.integration] if b.server else []) for b in ROUTED]


@pytest.fixture(scope="module", params=_params())
def loaded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    b: Backend = request.param
    url = b.url(tmp_path_factory.mktemp(b.id))
    if b.server:
        _require_service(b, url)
    store = open_store(url)
    name = f"t_fr_{uuid.uuid4().hex[:10]}"
    try:
        store.create_collection(name, DATA.vectors.shape[1])
        for start in range(0, len(DATA.vectors), 2000):
            store.upsert(name, DATA.records(start, start + 2000))
        caps = store.capabilities()
        spec = ann_spec(caps.index_kinds, caps.engine)
        store.build_index(name, spec, timeout_s=600)
        described = store.describe_index(name)
        assert described is not None and described.kind == spec.kind  # an ANN index, not FLAT
        yield Loaded(b.id, store, name, DATA)
    finally:
        store.drop_collection(name)
        store.close()


def _check(loaded: Loaded, sel: Selection) -> float:
    hits = loaded.store.search(loaded.name, loaded.data.queries, TOP_K, flt=sel.flt)
    rows = set(sel.rows.tolist())
    for per_query in hits:
        assert len(per_query) == TOP_K, f"{sel.level} {sel.form}: {len(per_query)} hits"
        assert {int(h.id[1:]) for h in per_query} <= rows
    return recall([[h.id for h in q] for q in hits], exact_top(loaded.data, sel.rows, TOP_K))


@pytest.mark.parametrize("sel", SELECTIONS, ids=[f"{s.level}-{s.form}" for s in SELECTIONS])
def test_every_form_gives_k_hits_at_high_recall(loaded: Loaded, sel: Selection) -> None:
    assert all(matches(sel.flt, DATA.payload(int(i))) for i in sel.rows)
    assert _check(loaded, sel) >= 0.95


@pytest.mark.parametrize("level", ["0.1%", "1%"])
def test_every_form_of_one_row_set_takes_the_same_route(loaded: Loaded, level: str) -> None:
    router = loaded.store.router
    taken = {}
    for sel in (s for s in SELECTIONS if s.level == level):
        before = dict(router.routes)
        loaded.store.search(loaded.name, loaded.data.queries[:2], TOP_K, flt=sel.flt)
        taken[sel.form] = {r: n - before.get(r, 0) for r, n in router.routes.items() if n != before.get(r, 0)}
    assert set(taken) == set(FORMS)
    assert all(t == {"exact": 1} for t in taken.values()), taken  # 20 and 200 rows: under the limit


def test_a_broad_filter_takes_the_index_and_keeps_k_hits(loaded: Loaded) -> None:
    router = loaded.store.router
    half = np.flatnonzero(DATA.rank < len(DATA.rank) // 2)
    values = tuple(f"c{v}" for v in range(len(half) // 200))
    for flt in (Range("b", lt=len(half) // 2), In("s1", values)):
        before = router.routes["index"]
        hits = loaded.store.search(loaded.name, DATA.queries, TOP_K, flt=flt)
        assert router.routes["index"] == before + 1
        assert all(len(q) == TOP_K for q in hits)
        assert {int(h.id[1:]) for q in hits for h in q} <= set(half.tolist())


def test_the_route_follows_the_store_setting(loaded: Loaded) -> None:
    """``exact_filter_rows`` below the matching rows sends a 1 % filter to the index (k hits kept)."""
    router = loaded.store.router
    saved = router.exact_rows
    router.exact_rows = 100
    router.forget()
    try:
        sel = next(s for s in SELECTIONS if s.level == "1%" and s.form == "range")
        before = router.routes["index"]
        _check(loaded, sel)
        assert router.routes["index"] == before + 1
    finally:
        router.exact_rows = saved
        router.forget()
