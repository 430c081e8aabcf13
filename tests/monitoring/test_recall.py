"""Tie-aware recall@k and the selectivity buckets, against answers worked by hand."""

from __future__ import annotations

import pytest

from monitoring.recall import recall_at_k, selectivity_bucket


def test_identical_answers_are_perfect() -> None:
    ids, scores = ["a", "b", "c"], [0.9, 0.8, 0.7]
    assert recall_at_k(ids, scores, ids, scores, 3) == 1.0


def test_a_missed_neighbour_costs_one_kth() -> None:
    exact = (["a", "b", "c", "d"], [0.9, 0.8, 0.7, 0.6])
    assert recall_at_k(["a", "b", "x", "d"], [0.9, 0.8, 0.1, 0.6], *exact, 4) == 0.75
    assert recall_at_k(["x", "y"], [0.2, 0.1], *exact, 2) == 0.0


def test_duplicated_vectors_count_as_ties() -> None:
    # every vector stored twice: the exact answer keeps one twin of each pair, the ANN the other
    exact_ids, exact_scores = ["a1", "a2", "b1", "b2"], [0.9, 0.9, 0.8, 0.8]
    assert recall_at_k(["a2", "a1", "b2", "b3"], [0.9, 0.9, 0.8, 0.8], exact_ids, exact_scores, 4) == 1.0
    # a neighbour tied with the k-th counts; one just below it (past the tolerance) does not
    assert recall_at_k(["a1", "c"], [0.9, 0.9 - 1e-7], ["a1", "a2"], [0.9, 0.9], 2) == 1.0
    assert recall_at_k(["a1", "c"], [0.9, 0.89], ["a1", "a2"], [0.9, 0.9], 2) == 0.5


def test_repeated_ids_count_once_and_short_answers_count_what_they_hold() -> None:
    exact = (["a", "b", "c"], [0.9, 0.8, 0.7])
    assert recall_at_k(["a", "a", "a"], [0.9, 0.9, 0.9], *exact, 3) == pytest.approx(1 / 3)
    assert recall_at_k(["a"], [0.9], *exact, 3) == pytest.approx(1 / 3)


def test_fewer_matching_rows_than_k() -> None:
    assert recall_at_k(["a", "b"], [0.9, 0.8], ["a", "b"], [0.9, 0.8], 10) == 1.0
    assert recall_at_k([], [], [], [], 10) == 1.0
    assert recall_at_k([], [], ["a"], [0.5], 10) == 0.0


def test_l2_scores_are_negative_and_the_tolerance_scales() -> None:
    exact = (["a", "b"], [-10.0, -20.0])
    assert recall_at_k(["a", "c"], [-10.0, -20.0 - 1e-5], *exact, 2) == 1.0
    assert recall_at_k(["a", "c"], [-10.0, -20.01], *exact, 2) == 0.5


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="k must be"):
        recall_at_k([], [], [], [], 0)
    with pytest.raises(ValueError, match="same length"):
        recall_at_k(["a"], [], [], [], 1)


@pytest.mark.parametrize(
    ("matching", "total", "bucket"),
    [(None, 100, "none"), (10, 100, ">=10%"), (100, 100, ">=10%"), (9, 100, "1-10%"), (1, 100, "1-10%"),
     (99, 10_000, "<1%"), (0, 100, "<1%"), (0, 0, "<1%")],
)
def test_selectivity_buckets(matching: int | None, total: int, bucket: str) -> None:
    assert selectivity_bucket(matching, total) == bucket
