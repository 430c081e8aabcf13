"""Rank fusion: pure functions over ranked lists of ids.

Reciprocal Rank Fusion (Cormack, Clarke & Büttcher, SIGIR 2009):
``RRF(d) = Σ_c w_c / (k + rank_c(d))`` with 1-based ranks and ``k = 60``; a list in which
``d`` does not appear contributes nothing. Ties are broken by the best single-channel rank,
then by id, so the fused order is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple


class Fused(NamedTuple):
    """One fused item: its id, fused score, and 1-based rank per channel it appeared in."""

    id: str
    score: float
    ranks: dict[str, int]


def rrf(
    rankings: Mapping[str, Sequence[str]],
    k: int = 60,
    weights: Mapping[str, float] | None = None,
    limit: int | None = None,
) -> list[Fused]:
    """Fuse ranked id lists by weighted Reciprocal Rank Fusion.

    Args:
        rankings: Channel name -> ids, best first (duplicates after the first are ignored).
        k: The RRF constant (60 in the paper); larger ``k`` flattens the rank discount.
        weights: Channel name -> weight (default 1.0); a weight of 0 drops the channel.
        limit: Return only the best ``limit`` items (every id is still scored); ``None``: all.

    Returns:
        The ids that appear in a channel of non-zero weight, best fused score first.

    Raises:
        ValueError: ``k < 1``, a negative weight or a negative ``limit``.
    """
    if k < 1:
        raise ValueError("RRF k must be >= 1")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    weights = weights or {}
    scores: dict[str, float] = {}
    best: dict[str, int] = {}
    channel_ranks: list[tuple[str, dict[str, int]]] = []
    for channel, ids in rankings.items():
        weight = weights.get(channel, 1.0)
        if weight < 0:
            raise ValueError(f"negative weight for channel {channel!r}")
        if weight == 0:
            continue
        ranks = {item: rank for rank, item in enumerate(dict.fromkeys(ids), start=1)}
        channel_ranks.append((channel, ranks))
        for item, rank in ranks.items():
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
            if rank < best.get(item, rank + 1):
                best[item] = rank
    order = sorted([(-score, best[item], item) for item, score in scores.items()])
    return [
        Fused(item, -neg, {c: ranks[item] for c, ranks in channel_ranks if item in ranks})
        for neg, _, item in order[:limit]
    ]
