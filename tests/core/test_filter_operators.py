"""``$ne``/``$nin``/``$exists``/``$prefix``: parsing, typed 400s, limits and reference semantics."""

from __future__ import annotations

import pytest

from quarry.errors import InvalidFilter
from stores.filters import Exists, FilterLimits, Ne, Nin, Prefix, matches, parse_filter, predicate
from stores.routing import scanned_ids

SCHEMA = {"path": "str", "n": "int", "b": "bool", "tags": "str"}


def test_operators_parse_to_typed_nodes() -> None:
    assert parse_filter({"path": {"$ne": "a"}}, SCHEMA) == Ne("path", "a")
    assert parse_filter({"n": {"$nin": [1, 2]}}, SCHEMA) == Nin("n", (1, 2))
    assert parse_filter({"b": {"$exists": False}}, SCHEMA) == Exists("b", False)
    assert parse_filter({"path": {"$prefix": "docs/%_"}}, SCHEMA) == Prefix("path", "docs/%_")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"n": {"$ne": "x"}}, "holds int values"),
        ({"n": {"$nin": []}}, "non-empty list"),
        ({"n": {"$nin": [1, "x"]}}, "holds int values"),
        ({"b": {"$exists": 1}}, "true or false"),
        ({"path": {"$prefix": 3}}, "takes a string"),
        ({"n": {"$prefix": "1"}}, "needs a string field"),
        ({"path": {"$prefix": "a\x00"}}, "NUL"),
        ({"nope": {"$exists": True}}, "unknown filter field"),
        ({"path": {"$like": "a"}}, "$prefix"),
    ],
)
def test_bad_operator_values_are_typed_400s(raw: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidFilter, match=message.replace("$", r"\$")):
        parse_filter(raw, SCHEMA)


def test_limits_count_the_new_operators() -> None:
    limits = FilterLimits(in_values=3, values=4, depth=8)
    with pytest.raises(InvalidFilter, match="MAX_FILTER_IN_VALUES"):
        parse_filter({"n": {"$nin": [1, 2, 3, 4]}}, SCHEMA, limits)
    with pytest.raises(InvalidFilter, match="MAX_FILTER_VALUES"):
        parse_filter({"n": {"$nin": [1, 2, 3]}, "path": {"$prefix": "a"}, "b": {"$exists": True}}, SCHEMA, limits)


def test_semantics_sql_ne_and_literal_prefix() -> None:
    rows = [{"path": "a_b"}, {"path": "axb"}, {}, {"path": None}, {"tags": []}, {"tags": ["p", "q"]}, {"path": 5}]
    cases = {
        Ne("path", "axb"): [True, False, False, False, False, False, True],
        Exists("path", True): [True, True, False, False, False, False, True],
        Exists("tags", False): [True, True, True, True, True, False, True],
        Nin("tags", ("q",)): [False, False, False, False, False, False, False],
        Nin("tags", ("z",)): [False, False, False, False, False, True, False],
        Prefix("path", "a_"): [True, False, False, False, False, False, False],
        Prefix("tags", "q"): [False, False, False, False, False, True, False],
    }
    for flt, want in cases.items():
        assert [matches(flt, r) for r in rows] == want, flt
        assert [predicate(flt)(r) for r in rows] == want, flt


def test_scanned_ids_refuses_past_the_limit() -> None:
    rows = [(f"r{i}", {"path": f"docs/{i}"}) for i in range(5)]
    assert scanned_ids(Prefix("path", "docs/1"), rows, 2, "Qdrant") == ["r1"]
    with pytest.raises(InvalidFilter, match="QUARRY_STORE__MAX_SCAN_IDS"):
        scanned_ids(Prefix("path", "docs/"), rows, 2, "Qdrant")
