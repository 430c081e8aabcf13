"""Tie-aware recall@k and filter-selectivity buckets: pure functions.

Recall@k of an ANN answer against the exact one counts a returned neighbour when it is one of the
exact top ``k`` *or* its true score is within ``tol`` of the exact ``k``-th score: with tied (or
duplicated) vectors the exact top ``k`` is one arbitrary choice among equals, and an ANN answer
that picks other members of the tie is not wrong (turbopuffer and pgvector's recall estimate face
the same; a set intersection reports 0.5 for a perfect answer over pairs of duplicates).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

Bucket = Literal["none", ">=10%", "1-10%", "<1%"]
BUCKETS: tuple[Bucket, ...] = ("none", ">=10%", "1-10%", "<1%")
DEFAULT_TOL = 1e-5


def recall_at_k(
    ann_ids: Sequence[str],
    ann_scores: Sequence[float],
    exact_ids: Sequence[str],
    exact_scores: Sequence[float],
    k: int,
    tol: float = DEFAULT_TOL,
) -> float:
    """Tie-aware recall@k of an ANN answer.

    Args:
        ann_ids: The ANN answer's ids, best first (only the first ``k`` count).
        ann_scores: Their *true* scores (higher is better), parallel to ``ann_ids``.
        exact_ids: The exact answer's ids, best first (at least ``k`` when that many rows match).
        exact_scores: Their scores, parallel to ``exact_ids``, non-increasing.
        k: The cut-off, ``>= 1``.
        tol: Absolute score tolerance of a tie (scores within it of the ``k``-th count), scaled
            by ``max(1, |k-th score|)``.

    Returns:
        Counted neighbours / ``min(k, len(exact_ids))``, in ``[0, 1]``; ``1.0`` when nothing
        matches exactly (an empty answer is then right).

    Raises:
        ValueError: ``k < 1`` or a list and its scores differ in length.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if len(ann_ids) != len(ann_scores) or len(exact_ids) != len(exact_scores):
        raise ValueError("ids and scores must have the same length")
    wanted = min(k, len(exact_ids))
    if wanted == 0:
        return 1.0
    kth = exact_scores[wanted - 1]
    floor = kth - tol * max(1.0, abs(kth))
    top = set(exact_ids[:wanted])
    seen: set[str] = set()
    counted = 0
    for neighbour, score in zip(ann_ids[:k], ann_scores[:k], strict=True):
        if neighbour in seen:
            continue
        seen.add(neighbour)
        if neighbour in top or score >= floor:
            counted += 1
    return min(counted, wanted) / wanted


def selectivity_bucket(matching: int | None, total: int) -> Bucket:
    """The bucket of a filter that matches ``matching`` of ``total`` rows (``None``: no filter).

    Returns:
        ``"none"`` without a filter; ``">=10%"``, ``"1-10%"`` or ``"<1%"`` by ``matching / total``
        (an empty collection counts as ``"<1%"``).
    """
    if matching is None:
        return "none"
    share = matching / total if total > 0 else 0.0
    if share >= 0.10:
        return ">=10%"
    if share >= 0.01:
        return "1-10%"
    return "<1%"
