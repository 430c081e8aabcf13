import pytest

from retrieval.fusion import rrf


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
