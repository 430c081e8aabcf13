"""eval/tune.py: the grid is scored from channel runs retrieved once; never on the test split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval.metrics import evaluate_rankings
from eval.tune import DEFAULT, Point, default_grid, fused_rankings, read_fusion, score, tune, write_setting
from indexing.collections import FusionConfig
from quarry.errors import InvalidRequest
from retrieval.fusion import Fusion, fuse

# q1: BM25 finds the relevant d1 at rank 3 with a score close to its top; dense finds it first by a
# margin. RRF (equal ranks' worth) keeps d9 first; a weighted minmax fusion lifts d1.
RUNS = {
    "bm25": {"q1": [("d9", 10.0), ("d8", 9.9), ("d1", 9.8), ("d7", 1.0)], "q2": [("d2", 5.0), ("d3", 1.0)]},
    "dense": {"q1": [("d1", 0.9), ("d9", 0.2), ("d6", 0.19)], "q2": [("d3", 0.5), ("d2", 0.49)]},
}
QRELS = {"q1": {"d1": 1}, "q2": {"d2": 1}}


def test_scores_are_the_pure_fusion_of_the_runs() -> None:
    point = Point(Fusion("weighted", weights={"bm25": 0.5, "dense": 0.5}), 3)
    ranked = fused_rankings(RUNS, point)
    assert ranked["q1"] == [f.id for f in fuse({c: RUNS[c]["q1"][:3] for c in RUNS}, point.fusion, 100)]
    assert "d7" not in ranked["q1"]  # candidates per channel: 3
    assert score(RUNS, QRELS, point) == evaluate_rankings(QRELS, ranked)


def test_tune_picks_the_best_point_and_refuses_the_test_split() -> None:
    grid = default_grid((3, 4))
    assert len(grid) == 2 * 22 and grid[0] == Point(DEFAULT, 3)
    best, scored = tune(RUNS, QRELS, "train", grid)
    assert scored[0].point == best and scored[0].metrics["ndcg@10"] == max(s.metrics["ndcg@10"] for s in scored)
    assert score(RUNS, QRELS, best)["ndcg@10"] > score(RUNS, QRELS, Point(DEFAULT, 4))["ndcg@10"]
    with pytest.raises(InvalidRequest, match="test split"):
        tune(RUNS, QRELS, "test", grid)
    with pytest.raises(InvalidRequest, match="objective"):
        tune(RUNS, QRELS, "dev", grid, objective="map")


def test_the_written_setting_is_what_a_collection_and_a_request_take(tmp_path: Path) -> None:
    best = Point(Fusion("weighted", weights={"bm25": 0.4, "dense": 0.6}, normalization="zscore"), 200)
    written = write_setting(tmp_path / "tuned.json", best, {"split": "train"})
    raw = json.loads((tmp_path / "tuned.json").read_text())
    assert raw == written and raw["candidates"] == 200 and raw["tuned"] == {"split": "train"}
    assert read_fusion(raw) == best.fusion
    assert FusionConfig.model_validate(raw["fusion"]).over(DEFAULT) == best.fusion
    with pytest.raises(InvalidRequest):
        read_fusion({"fusion": {"method": "rrf", "alpha": 1}})
