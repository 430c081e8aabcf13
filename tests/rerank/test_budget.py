"""rerank_within_budget and reorder: the budget is honoured, the order follows the scores."""

from __future__ import annotations

import numpy as np
import pytest

from quarry.errors import ConfigError, RerankError
from rerank.budget import RerankOutcome, reorder, rerank_order, rerank_within_budget
from rerank.cross_encoder import CrossEncoderReranker
from tests.rerank.conftest import Pairs, stepping_clock


def test_a_generous_budget_reranks_everything(reranker: CrossEncoderReranker, scifact_pairs: Pairs) -> None:
    outcome = rerank_within_budget(
        reranker, scifact_pairs.query, scifact_pairs.passages, budget_ms=60_000, batch_size=16
    )
    assert outcome.reranked
    assert outcome.reason is None
    assert outcome.scores is not None
    assert outcome.scores.shape == (50,)
    assert outcome.elapsed_ms > 0
    whole = reranker.score(scifact_pairs.query, scifact_pairs.passages)
    np.testing.assert_allclose(outcome.scores, whole, rtol=0, atol=1e-5)
    hits = list(range(50))  # hit i is passage i, in fused order
    assert reorder(hits, outcome.scores) == list(np.argsort(-outcome.scores, kind="stable"))
    reordered = outcome.scores[reorder(hits, outcome.scores)]
    assert (np.diff(reordered) <= 0).all()


def test_a_budget_of_a_few_ms_keeps_the_fused_order(reranker: CrossEncoderReranker, scifact_pairs: Pairs) -> None:
    # Each clock read advances 1 ms, whatever the machine: batches end at 1, 2, 3 ms; the third is past 2 ms.
    outcome = rerank_within_budget(
        reranker, scifact_pairs.query, scifact_pairs.passages, budget_ms=2, batch_size=8, clock=stepping_clock(0.001)
    )
    assert not outcome.reranked
    assert outcome.scores is None
    assert outcome.reason == "rerank budget 2 ms exceeded after 24/50 pairs (3.0 ms spent)"
    assert outcome.elapsed_ms == pytest.approx(3.0)


def test_the_real_clock_is_read(reranker: CrossEncoderReranker, scifact_pairs: Pairs) -> None:
    # The default clock: a model call takes more than a nanosecond on any machine.
    outcome = rerank_within_budget(reranker, scifact_pairs.query, scifact_pairs.passages, budget_ms=1e-6, batch_size=8)
    assert not outcome.reranked
    assert (outcome.reason or "").startswith("rerank budget 1e-06 ms exceeded after 8/50 pairs")
    assert outcome.elapsed_ms > 1e-6


def test_the_budget_is_checked_after_every_batch(reranker: CrossEncoderReranker, scifact_pairs: Pairs) -> None:
    # Each clock read advances 250 ms: batch 1 ends at 250 ms (within 300), batch 2 at 500 ms.
    outcome = rerank_within_budget(
        reranker,
        scifact_pairs.query,
        scifact_pairs.passages,
        budget_ms=300,
        batch_size=16,
        clock=stepping_clock(0.25),
    )
    assert outcome == RerankOutcome(
        None, False, "rerank budget 300 ms exceeded after 32/50 pairs (500.0 ms spent)", 500.0
    )


def test_finishing_past_the_budget_is_not_a_rerank(reranker: CrossEncoderReranker, scifact_pairs: Pairs) -> None:
    outcome = rerank_within_budget(
        reranker,
        scifact_pairs.query,
        scifact_pairs.passages,
        budget_ms=200,
        batch_size=64,
        clock=stepping_clock(0.25),
    )
    assert not outcome.reranked
    assert outcome.scores is None
    assert outcome.reason == "rerank budget 200 ms exceeded after 50/50 pairs (250.0 ms spent)"


def test_no_passages_is_a_trivial_rerank(reranker: CrossEncoderReranker) -> None:
    outcome = rerank_within_budget(reranker, "q", [], budget_ms=5, batch_size=8)
    assert outcome.reranked
    assert outcome.scores is not None and outcome.scores.shape == (0,)


@pytest.mark.parametrize(("budget_ms", "batch_size"), [(0, 8), (-1, 8), (5, 0)])
def test_bad_budget_or_batch_is_a_config_error(
    reranker: CrossEncoderReranker, budget_ms: float, batch_size: int
) -> None:
    with pytest.raises(ConfigError):
        rerank_within_budget(reranker, "q", ["p"], budget_ms=budget_ms, batch_size=batch_size)


def test_rerank_order_is_descending_and_stable() -> None:
    scores = np.array([1.0, 3.0, 3.0, 2.0, -1.0, 3.0], dtype=np.float32)
    assert rerank_order(scores).tolist() == [1, 2, 5, 3, 0, 4]
    assert reorder(["a", "b", "c", "d", "e", "f"], scores) == ["b", "c", "f", "d", "a", "e"]


def test_reorder_needs_one_score_per_item() -> None:
    with pytest.raises(RerankError, match="3 items but 2 scores"):
        reorder([1, 2, 3], np.array([0.5, 0.1], dtype=np.float32))
