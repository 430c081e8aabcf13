import math
from dataclasses import replace

import pytest

from retrieval.fusion import NORMALIZATIONS, Fusion, fuse, normalize, rrf, weighted


def test_rrf_matches_hand_computed_scores() -> None:
    fused = rrf({"bm25": ["a", "b", "c"], "dense": ["b", "d", "a"]}, k=60)
    scores = {f.id: f.score for f in fused}
    assert scores["a"] == pytest.approx(1 / 61 + 1 / 63)
    assert scores["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert scores["c"] == pytest.approx(1 / 63)
    assert scores["d"] == pytest.approx(1 / 62)
    assert [f.id for f in fused] == ["b", "a", "d", "c"]
    assert fused[0].ranks == {"bm25": 2, "dense": 1}


def test_rrf_weights_and_zero_weight_drop_a_channel() -> None:
    fused = rrf({"bm25": ["a", "b"], "dense": ["b", "a"]}, k=1, weights={"bm25": 2.0, "dense": 1.0})
    assert [f.id for f in fused] == ["a", "b"]  # a: 2/2 + 1/3; b: 2/3 + 1/2
    only = rrf({"bm25": ["a"], "dense": ["z"]}, weights={"dense": 0})
    assert [f.id for f in only] == ["a"]


def test_rrf_ties_are_deterministic_and_duplicates_ignored() -> None:
    fused = rrf({"x": ["a", "a", "b"], "y": ["b", "a"]}, k=60)
    assert [f.id for f in fused] == ["a", "b"]  # equal scores: best single rank 1 for both, then id
    with pytest.raises(ValueError):
        rrf({"x": ["a"]}, k=0)
    with pytest.raises(ValueError):
        rrf({"x": ["a"]}, weights={"x": -1})


def test_rrf_limit_returns_the_head_of_the_full_list() -> None:
    rankings = {"bm25": [f"d{i}" for i in range(50)], "dense": [f"d{i}" for i in range(70, 20, -1)]}
    full = rrf(rankings, k=60)
    assert len(full) == 71  # d0..d70
    assert rrf(rankings, k=60, limit=7) == full[:7]
    assert rrf(rankings, k=60, limit=0) == []
    assert rrf(rankings, k=60, limit=500) == full
    with pytest.raises(ValueError, match="limit"):
        rrf(rankings, limit=-1)


# --- weighted (convex combination) and the dispatcher -----------------------------------------

BM25 = [("a", 12.0), ("b", 9.0), ("c", 6.0), ("d", 3.0)]
DENSE = [("b", 0.9), ("d", 0.7), ("e", 0.5)]


def test_minmax_matches_hand_computed_scores() -> None:
    fused = weighted({"bm25": BM25, "dense": DENSE}, {"bm25": 0.5, "dense": 0.5}, "minmax")
    scores = {f.id: f.score for f in fused}
    # bm25: (s - 3) / 9 -> a 1, b 2/3, c 1/3, d 0; dense: (s - 0.5) / 0.4 -> b 1, d 0.5, e 0; missing -> 0
    assert scores == pytest.approx({"a": 0.5, "b": 0.5 * 2 / 3 + 0.5, "c": 0.5 / 3, "d": 0.25, "e": 0.0})
    assert [f.id for f in fused] == ["b", "a", "d", "c", "e"]
    assert fused[0].ranks == {"bm25": 2, "dense": 1}
    assert fused[0].normalized == pytest.approx({"bm25": 2 / 3, "dense": 1.0})


def test_zscore_and_dbsf_match_hand_computed_scores() -> None:
    values = [12.0, 9.0, 6.0, 3.0]
    mean, std = 7.5, math.sqrt(sum((v - 7.5) ** 2 for v in values) / 4)
    z, floor = normalize(values, "zscore")
    assert z == pytest.approx([(v - mean) / std for v in values]) and floor == pytest.approx(min(z))
    d, dfloor = normalize(values, "dbsf")
    assert d == pytest.approx([(v - (mean - 3 * std)) / (6 * std) for v in values]) and dfloor == 0.0
    clipped, _ = normalize([0.0] * 20 + [100.0], "dbsf")  # the outlier lies past mean + 3σ: clipped to 1
    assert clipped[-1] == 1.0 and all(0.0 <= x < 1.0 for x in clipped[:-1])
    assert normalize([5.0, 5.0], "minmax")[0] == [1.0, 1.0]
    assert normalize([5.0, 5.0], "zscore")[0] == [0.0, 0.0]
    assert normalize([5.0, 5.0], "dbsf")[0] == [0.5, 0.5]
    fused = weighted({"bm25": BM25, "dense": DENSE}, {"bm25": 1.0, "dense": 0.0}, "zscore")
    assert [f.id for f in fused] == ["a", "b", "c", "d"]  # weight 0 drops the dense channel
    assert fused[0].score == pytest.approx(z[0])


def test_fuse_dispatches_and_rejects_bad_settings() -> None:
    channels = {"bm25": BM25, "dense": DENSE}
    assert fuse(channels, Fusion("rrf", k=10)) == rrf({"bm25": list("abcd"), "dense": list("bde")}, k=10)
    assert fuse(channels, Fusion("weighted", normalization="dbsf"), limit=2) == weighted(channels, None, "dbsf")[:2]
    assert fuse(channels, Fusion("rrf"))[0].normalized == {"bm25": 1 / 62, "dense": 1 / 61}
    for bad in (Fusion("weighted", normalization="l2"), Fusion("borda"), Fusion("weighted", weights={"x": -1})):  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            fuse({"x": [("a", 1.0)]}, bad)
    with pytest.raises(ValueError, match="non-finite"):
        weighted({"x": [("a", math.nan)]})
    assert Fusion("weighted", weights={"dense": 0.3}).describe() == {
        "method": "weighted", "weights": {"dense": 0.3}, "normalization": "minmax"
    }


SETTINGS = [Fusion("rrf", k=k) for k in (1, 60, 200)] + [Fusion("weighted", normalization=n) for n in NORMALIZATIONS]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"{s.method}-{s.k}-{s.normalization}")
def test_a_keyword_only_top_hit_survives_any_dense_weight_below_one(setting: Fusion) -> None:
    """BM25's top hit, absent from the dense list, is never dropped for any dense weight < 1 (acceptance 4).

    With the BM25 weight at least the dense one it stays within the window a page is cut from
    (the first ``len(bm25)`` fused items), and under RRF and min-max, where a channel's top
    hit scores the channel's maximum, it outranks every document the dense channel alone found.
    """
    shared = [f"s{i}" for i in range(60)]
    bm25 = [("kw", 31.0)] + [(d, 30.0 - i * 0.4) for i, d in enumerate(shared)]
    dense = [(f"v{i}", 0.82 - i * 0.001) for i in range(20)] + [(d, 0.8 - i * 0.005) for i, d in enumerate(shared)]
    for w in [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999]:
        weights = {"bm25": 1 - w, "dense": w}
        ids = [f.id for f in fuse({"bm25": bm25, "dense": dense}, replace(setting, weights=weights))]
        assert "kw" in ids, (w, setting)
        if w <= 0.5:
            assert ids.index("kw") < len(bm25), (w, setting, ids.index("kw"))
        if 0 < w <= 0.5 and (setting.method == "rrf" or setting.normalization == "minmax"):
            assert all(ids.index("kw") < ids.index(f"v{i}") for i in range(20)), (w, setting)
    gone = fuse({"bm25": bm25, "dense": dense}, replace(setting, weights={"bm25": 0.0, "dense": 1.0}))
    assert "kw" not in [f.id for f in gone]
    # and symmetrically, the dense channel's own top hit survives any BM25 weight below 1
    for w in [0.5, 0.9, 0.999]:
        fused = fuse({"bm25": bm25, "dense": dense}, replace(setting, weights={"bm25": w, "dense": 1 - w}))
        assert "v0" in [f.id for f in fused]
