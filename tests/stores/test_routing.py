"""The filter router and the canonical filter form (issue 20, finding 10); no engine needed."""

from __future__ import annotations

import random
from collections.abc import Callable

from stores.filters import And, Eq, Filter, In, Or, Range, canonical, matches
from stores.routing import FilterRouter, exact_row_limit


def test_limit_rule_and_override() -> None:
    assert exact_row_limit(10, 100_000) == 3605
    assert exact_row_limit(10, 20_000) == 1612
    assert exact_row_limit(10, -1) == 1000
    assert exact_row_limit(10, 100_000, exact_rows=50) == 50
    assert FilterRouter(exact_rows=7).limit(10, 1e6) == 7


def test_one_count_per_filter_and_route_by_it() -> None:
    router = FilterRouter()
    calls: list[int] = []

    def count(n: int) -> int:
        def inner(cap: int) -> int:
            calls.append(cap)
            return n

        return inner

    few = router.decide("c", Eq("t", "a"), 10, lambda: 20_000, count(200))
    assert (few.route, few.matching, few.limit) == ("exact", 200, 1612)
    again = router.decide("c", Eq("t", "a"), 10, lambda: 20_000, count(10**6))
    assert again == few and len(calls) == 1  # cached: the second count is never asked
    many = router.decide("c", Eq("t", "b"), 10, lambda: 20_000, count(10**6))
    assert (many.route, many.matching) == ("index", 1613)  # capped at limit + 1
    assert router.routes == {"exact": 2, "index": 1}


def test_counts_keep_one_and_true_apart_and_are_forgotten_on_writes() -> None:
    router = FilterRouter()
    router.decide("c", Eq("f", 1), 10, lambda: 1000, lambda cap: 5)
    assert router.decide("c", Eq("f", True), 10, lambda: 1000, lambda cap: 10**6).route == "index"
    router.forget("c")
    assert router.decide("c", Eq("f", 1), 10, lambda: 1000, lambda cap: 10**6).route == "index"


def test_ttl_zero_counts_every_time() -> None:
    router = FilterRouter(ttl_s=0.0)
    seen: list[int] = []
    for _ in range(2):
        router.decide("c", Range("n", lt=3), 10, lambda: 100, lambda cap: seen.append(cap) or 1)
    assert len(seen) == 2


def test_canonical_merges_equalities_of_an_or() -> None:
    flt = Or((Eq("b", 0), Or((Eq("b", 1), Range("c", lt=3))), In("b", (1, True, 1.0)), Eq("s", "x")))
    assert canonical(flt) == Or((In("b", (0, 1, True, 1.0)), Range("c", lt=3), Eq("s", "x")))
    assert canonical(Or((Eq("a", 1), Eq("a", 1)))) == Eq("a", 1)
    assert canonical(And((Eq("a", 1),))) == Eq("a", 1)
    assert canonical(And((Eq("a", 1), And((Eq("b", 2),))))) == And((Eq("a", 1), Eq("b", 2)))
    assert canonical(Range("c", gt=1)) == Range("c", gt=1)


def test_canonical_keeps_the_semantics() -> None:
    rnd = random.Random(7)
    values = [0, 1, 1.0, True, False, "a", "b"]
    stored = [*values, ["a", "b"], [], ["b"]]
    payloads = [{"b": rnd.choice(stored), "c": rnd.choice([0, 2, 5, "x"])} for _ in range(300)]
    for _ in range(200):
        leaves = [
            rnd.choice([Eq("b", rnd.choice(values)), In("b", tuple(rnd.sample(values, 2))), Range("c", lt=3)])
            for _ in range(rnd.randint(1, 4))
        ]
        flt = Or(tuple(leaves)) if rnd.random() < 0.7 else And((Or(tuple(leaves)), Eq("c", 0)))
        for p in payloads:
            assert matches(canonical(flt), p) == matches(flt, p), (flt, p)


def test_qdrant_knobs_follow_the_route() -> None:
    """Both Qdrant backends share these knobs (the server one has no server in the test run)."""
    from stores.base import IndexSpec
    from stores.qdrant_filters import Knobs, routed_knobs

    spec = IndexSpec("HNSW", "cosine", {"quantization": "int8"}, {"ef": 64})
    router = FilterRouter()
    few = Eq("t", "rare")

    def counts(n: int) -> Callable[[Filter | None], int]:
        return lambda flt: 20_000 if flt is None else n

    assert routed_knobs(spec, None, None, 10, router, "c", counts(0)) == Knobs(64, False, {"rescore": True}, False)
    assert routed_knobs(spec, None, few, 10, router, "c", counts(200)) == Knobs(64, True, None, False)
    broad = Range("n", lt=9)
    assert routed_knobs(spec, None, broad, 10, router, "c", counts(10_000)) == Knobs(64, False, {"rescore": True}, True)
    forced = routed_knobs(spec, {"exact": False}, Eq("t", "x"), 10, router, "c", counts(5))
    assert forced.exact is False and forced.acorn is True
    assert router.routes == {"exact": 1, "index": 1}
    assert routed_knobs(None, None, few, 10, router, "c", counts(5)) == Knobs(None, True, None, False)
