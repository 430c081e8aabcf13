"""Length-grouped model calls: a permutation of the rows, capped, and the cheapest contiguous plan."""

from __future__ import annotations

import itertools
import random

import pytest

from embedding.length_batches import plan_batches


def _cost(groups: list[list[int]], lengths: list[int], call: float) -> float:
    return sum(call + len(g) * max(lengths[i] for i in g) for g in groups)


def _brute_force(lengths: list[int], max_batch: int, call: float) -> float:
    """Cheapest cost over every split of the length-sorted rows into runs of at most max_batch."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = float("inf")
    for cuts in itertools.product([False, True], repeat=len(order) - 1):
        groups, current = [], [order[0]]
        for row, cut in zip(order[1:], cuts, strict=True):
            if cut:
                groups.append(current)
                current = []
            current.append(row)
        groups.append(current)
        if all(len(g) <= max_batch for g in groups):
            best = min(best, _cost(groups, lengths, call))
    return best


@pytest.mark.parametrize("seed", range(20))
def test_plan_is_an_optimal_capped_permutation(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 11))]
    max_batch, call = rng.randint(1, 6), rng.choice([0.0, 3.0, 25.0])
    groups = plan_batches(lengths, max_batch, call)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(1 <= len(g) <= max_batch for g in groups)
    assert all([lengths[i] for i in g] == sorted(lengths[i] for i in g) for g in groups)
    assert _cost(groups, lengths, call) == pytest.approx(_brute_force(lengths, max_batch, call))


def test_free_calls_mean_one_call_per_distinct_length_and_dear_calls_mean_one_call() -> None:
    lengths = [12, 40, 12, 41, 13]
    assert plan_batches(lengths, 8, 0.0) == [[0, 2], [4], [1], [3]]
    assert plan_batches(lengths, 8, 1000.0) == [[0, 2, 4, 1, 3]]


def test_arrival_order_queries_split_where_padding_costs_more_than_a_call() -> None:
    # 6 short queries and 2 long ones: padding the short ones to 48 tokens would cost 6 × 36.
    lengths = [12, 48, 11, 12, 47, 10, 12, 11]
    assert plan_batches(lengths, 64, 25.0) == [[5, 2, 7, 0, 3, 6], [4, 1]]


def test_edge_cases() -> None:
    assert plan_batches([], 4, 3.0) == []
    assert plan_batches([5], 4, 3.0) == [[0]]
    with pytest.raises(ValueError, match="max_batch"):
        plan_batches([1], 0, 3.0)
    with pytest.raises(ValueError, match="call_cost_tokens"):
        plan_batches([1], 1, -1.0)
