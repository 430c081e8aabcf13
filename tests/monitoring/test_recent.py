"""Recorded queries survive the round trip through their SQLite file, filters included, and are trimmed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from monitoring import recent as recent_module
from monitoring.recent import RecentQueries, filter_to_json
from stores.filters import And, Eq, In, Or, Range, parse_filter


def test_round_trip_keeps_vectors_filters_and_top_k(tmp_path: Path) -> None:
    store = RecentQueries(tmp_path / "m" / "recent.sqlite")
    assert store.latest("c", 5) == [] and not (tmp_path / "m").exists()  # reading makes nothing
    filters = [
        None, Eq("s", 'a"b'), Eq("n", 3), Eq("b", True), In("t", ("x", "y")),
        Range("f", gte=0.5, lt=2.0), And((Eq("s", "x"), Or((Range("n", gt=1), Eq("b", False))))),
    ]
    vectors = np.random.default_rng(0).standard_normal((len(filters), 8)).astype(np.float32)
    for i, (vector, flt) in enumerate(zip(vectors, filters, strict=True)):
        store.record("c", vector, flt, 10 + i)
    store.record("other", vectors[0], None, 1)
    got = store.latest("c", 100)[::-1]  # newest first
    assert [q.top_k for q in got] == [10 + i for i in range(len(filters))]
    np.testing.assert_array_equal(np.stack([q.vector for q in got]), vectors)
    assert [q.flt for q in got] == filters
    store.forget("c")
    assert store.latest("c", 10) == [] and len(store.latest("other", 10)) == 1


def test_only_the_newest_are_kept(tmp_path: Path) -> None:
    store = RecentQueries(tmp_path / "recent.sqlite", keep=5)
    for i in range(recent_module.TRIM_EVERY):
        store.record("c", np.full(4, i, np.float32), None, 10)
    kept = store.latest("c", 1000)
    assert len(kept) == 5 and [int(q.vector[0]) for q in kept] == [63, 62, 61, 60, 59]


@pytest.mark.parametrize(
    "raw",
    [
        {"lang": {"$ne": "en"}},
        {"year": {"$nin": [2019, 2020]}},
        {"path": {"$exists": False}},
        {"path": {"$prefix": "docs/a_b%"}},
        {"$and": [{"path": {"$prefix": "x"}}, {"lang": {"$exists": True}}]},
    ],
)
def test_the_new_filter_operators_round_trip_through_the_recorded_form(raw: dict[str, Any]) -> None:
    flt = parse_filter(raw)
    assert flt is not None and parse_filter(filter_to_json(flt)) == flt
