"""Rerank under a time budget, and reorder hits by the scores.

The query path calls :func:`rerank_within_budget` on the fused top-N passages. Pairs are scored
batch by batch; the clock is read after each batch, and once the budget is spent the call stops
and returns ``reranked=False`` with the reason, so the caller keeps the fused order. The budget is
strict: a rerank that finished but took longer than the budget is also reported as not done.
The overshoot is at most one batch, so ``batch_size`` bounds how far past the budget a request
can run. Model failures are not swallowed: :class:`~quarry.errors.RerankError` propagates.

:func:`reorder` then sorts the hits by score, highest first, stable (ties keep the fused order).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from quarry.errors import ConfigError, RerankError
from rerank.base import Reranker

T = TypeVar("T")


@dataclass(frozen=True)
class RerankOutcome:
    """Result of a budgeted rerank.

    Attributes:
        scores: ``(n,) float32`` cross-encoder scores in the input order when ``reranked``;
            ``None`` when the budget ran out (the caller keeps the fused order).
        reranked: Whether every pair was scored within the budget.
        reason: Why the rerank was abandoned, e.g. ``"rerank budget 5 ms exceeded after 32/50
            pairs"``; ``None`` when ``reranked``.
        elapsed_ms: Wall time spent in the reranker, in milliseconds.
    """

    scores: npt.NDArray[np.float32] | None
    reranked: bool
    reason: str | None
    elapsed_ms: float


def _budget_reason(budget_ms: float, done: int, total: int, elapsed_ms: float) -> str:
    return (
        f"rerank budget {budget_ms:g} ms exceeded after {done}/{total} pairs "
        f"({elapsed_ms:.1f} ms spent)"
    )


def rerank_within_budget(
    reranker: Reranker,
    query: str,
    passages: Sequence[str],
    budget_ms: float,
    batch_size: int,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> RerankOutcome:
    """Score ``passages`` for ``query`` in batches, giving up once ``budget_ms`` is spent.

    Args:
        reranker: A warmed-up :class:`~rerank.base.Reranker`.
        query: The query text.
        passages: ``n`` passages, in fused order.
        budget_ms: Time budget in milliseconds (> 0).
        batch_size: Pairs scored between two reads of the clock (>= 1).
        clock: Seconds from a monotonic clock; :func:`time.perf_counter` by default.

    Returns:
        A :class:`RerankOutcome`: all ``n`` scores and ``reranked=True`` when every batch was
        scored within the budget, else ``scores=None``, ``reranked=False`` and the reason.

    Raises:
        ConfigError: ``budget_ms`` <= 0 or ``batch_size`` < 1.
        RerankError: The model failed.
    """
    if budget_ms <= 0 or batch_size < 1:
        raise ConfigError(
            f"rerank needs budget_ms > 0 and batch_size >= 1, got {budget_ms} and {batch_size}"
        )
    total = len(passages)
    parts: list[npt.NDArray[np.float32]] = []
    start = clock()
    elapsed_ms = 0.0
    for begin in range(0, total, batch_size):
        batch = passages[begin : begin + batch_size]
        parts.append(np.asarray(reranker.score(query, batch), dtype=np.float32))
        elapsed_ms = (clock() - start) * 1000.0
        if elapsed_ms > budget_ms:
            reason = _budget_reason(budget_ms, begin + len(batch), total, elapsed_ms)
            return RerankOutcome(None, False, reason, elapsed_ms)
    scores = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    return RerankOutcome(scores, True, None, elapsed_ms)


def rerank_order(scores: npt.NDArray[np.float32]) -> npt.NDArray[np.intp]:
    """Indices that sort ``scores`` from highest to lowest, ties in input order.

    Args:
        scores: ``(n,)`` scores.

    Returns:
        ``(n,) intp`` permutation: ``scores[order]`` is non-increasing.
    """
    return np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")


def reorder(items: Sequence[T], scores: npt.NDArray[np.float32]) -> list[T]:
    """Sort ``items`` by their ``scores``, highest first; ties keep their input order.

    Args:
        items: ``n`` hits in fused order.
        scores: ``(n,)`` scores aligned with ``items``.

    Returns:
        The items, reordered.

    Raises:
        RerankError: ``items`` and ``scores`` differ in length.
    """
    if len(items) != len(scores):
        raise RerankError(f"{len(items)} items but {len(scores)} scores")
    return [items[i] for i in rerank_order(scores)]
