"""Known answers for the pytrec_eval metrics, worked by hand, plus an oracle on real qrels."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from eval.beir import iter_corpus, load_split
from eval.metrics import (
    METRICS,
    evaluate_rankings,
    mean_metrics,
    per_query_metrics,
    to_trec_run,
)


def fillers(n: int, prefix: str = "x") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def test_two_relevant_at_ranks_1_and_3() -> None:
    got = evaluate_rankings({"q": {"a": 1, "b": 1}}, {"q": ["a", "x", "b"]})
    ideal = 1 + 1 / math.log2(3)
    assert got["ndcg@10"] == pytest.approx((1 + 1 / math.log2(4)) / ideal, abs=1e-12)
    assert got["recall@10"] == 1.0
    assert got["recall@100"] == 1.0
    assert got["mrr@10"] == 1.0


def test_single_relevant_at_rank_2() -> None:
    got = evaluate_rankings({"q": {"a": 1}}, {"q": ["x", "a", "y"]})
    assert got["ndcg@10"] == pytest.approx(1 / math.log2(3), abs=1e-12)
    assert got["mrr@10"] == 0.5


def test_graded_relevance_uses_linear_gain() -> None:
    # trec_eval ndcg: gain = grade, discount 1/log2(rank + 1); ideal puts grade 2 first.
    got = evaluate_rankings({"q": {"a": 2, "b": 1}}, {"q": ["b", "a"]})
    expected = (1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3))
    assert got["ndcg@10"] == pytest.approx(expected, abs=1e-12)


def test_first_relevant_at_rank_11_gives_zero_mrr_at_10() -> None:
    ranking = [*fillers(10), "a"]
    got = evaluate_rankings({"q": {"a": 1}}, {"q": ranking})
    assert got["mrr@10"] == 0.0  # plain recip_rank would give 1/11
    assert got["ndcg@10"] == 0.0
    assert got["recall@10"] == 0.0
    assert got["recall@100"] == 1.0


def test_relevant_at_rank_10_counts() -> None:
    got = evaluate_rankings({"q": {"a": 1}}, {"q": [*fillers(9), "a"]})
    assert got["mrr@10"] == pytest.approx(0.1, abs=1e-12)
    assert got["recall@10"] == 1.0
    assert got["ndcg@10"] == pytest.approx(1 / math.log2(11), abs=1e-12)


def test_recall_cut_offs() -> None:
    # 3 relevant: ranks 1, 5 (top 10), 50 (top 100); a 4th relevant at rank 101 is outside.
    ranking = fillers(150)
    for rank, doc in ((1, "a"), (5, "b"), (50, "c"), (101, "d")):
        ranking[rank - 1] = doc
    got = evaluate_rankings({"q": {"a": 1, "b": 1, "c": 1, "d": 1}}, {"q": ranking})
    assert got["recall@10"] == 0.5
    assert got["recall@100"] == 0.75
    assert got["mrr@10"] == 1.0


def test_order_given_wins_over_id_order_and_repeats_keep_first_position() -> None:
    # Equal scores would let trec_eval break ties by id; we score the order as returned.
    assert evaluate_rankings({"q": {"a": 1}}, {"q": ["z", "a"]})["mrr@10"] == 0.5
    assert evaluate_rankings({"q": {"a": 1}}, {"q": ["a", "z", "a"]})["mrr@10"] == 1.0
    assert to_trec_run({"q": ["b", "a", "b"]}) == {"q": {"b": 2.0, "a": 1.0}}


def test_unanswered_judged_query_scores_zero_and_counts_in_the_mean() -> None:
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}}
    per_query = per_query_metrics(qrels, {"q1": ["a"], "unjudged": ["b"]})
    assert set(per_query) == {"q1", "q2"}
    assert per_query["q2"] == dict.fromkeys(METRICS, 0.0)
    assert mean_metrics(per_query) == {
        "ndcg@10": 0.5,
        "recall@10": 0.5,
        "recall@100": 0.5,
        "mrr@10": 0.5,
    }


def test_empty_ranking_and_no_queries() -> None:
    assert evaluate_rankings({"q": {"a": 1}}, {"q": []}) == dict.fromkeys(METRICS, 0.0)
    assert mean_metrics({}) == dict.fromkeys(METRICS, 0.0)


def test_mean_is_arithmetic_over_queries() -> None:
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 1}}
    got = evaluate_rankings(qrels, {"q1": ["a"], "q2": ["x", "b"], "q3": [*fillers(20), "c"]})
    assert got["mrr@10"] == pytest.approx((1 + 0.5 + 0) / 3, abs=1e-12)
    assert got["ndcg@10"] == pytest.approx((1 + 1 / math.log2(3) + 0) / 3, abs=1e-12)
    assert got["recall@100"] == 1.0


def test_keyword_oracle_on_real_scifact_qrels(shared_data: Path) -> None:
    """Judged documents ranked first: perfect; pushed past rank 100: worthless."""
    beir = shared_data / "scifact"
    split = load_split(beir, "test")
    corpus_ids = [doc["_id"] for doc in iter_corpus(beir)]

    def ranking(qid: str, relevant_first: bool) -> list[str]:
        relevant = sorted(split.qrels[qid], key=lambda d: -split.qrels[qid][d])
        others = [d for d in corpus_ids if d not in split.qrels[qid]][:100]
        return relevant + others if relevant_first else others + relevant

    oracle = evaluate_rankings(split.qrels, {q: ranking(q, True) for q in split.qrels})
    assert oracle == {"ndcg@10": 1.0, "recall@10": 1.0, "recall@100": 1.0, "mrr@10": 1.0}
    worst = evaluate_rankings(split.qrels, {q: ranking(q, False) for q in split.qrels})
    assert worst == dict.fromkeys(METRICS, 0.0)
    assert len(per_query_metrics(split.qrels, {})) == 300
