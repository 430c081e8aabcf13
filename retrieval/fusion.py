"""Rank and score fusion: pure functions over each channel's ranked ``(id, score)`` lists.

Two methods, chosen by :class:`Fusion` (per request, or a collection's default):

``rrf``: Reciprocal Rank Fusion (Cormack, Clarke & Büttcher, SIGIR 2009), as Elasticsearch's
  ``rrf`` retriever and Qdrant's ``Fusion.RRF``: ``RRF(d) = Σ_c w_c / (k + rank_c(d))`` with
  1-based ranks and ``k = 60``; a channel that did not return ``d`` contributes nothing. Only
  ranks count; the channel's scores are ignored.

``weighted``: a convex combination of normalised channel scores (Bruch, Gai & Ingber, "An
  Analysis of Fusion Functions for Hybrid Retrieval", ACM TOIS 2023: a tuned convex combination
  beats RRF in domain), as Elasticsearch's ``linear`` retriever and Milvus' ``WeightedRanker``:
  ``S(d) = Σ_c w_c · φ_c(s_c(d))``, where ``φ_c`` normalises channel ``c``'s scores over the list
  it returned (its candidate window) and a channel that did not return ``d`` contributes
  ``φ_c``'s floor (below). With weights summing to 1 the combination is convex. Normalisations:

  - ``minmax`` (Elasticsearch ``linear`` retriever, ``normalizer: minmax``):
    ``φ(s) = (s - min) / (max - min)`` in ``[0, 1]``; a list whose scores are all equal maps to 1
    (its hits are the channel's best). Floor 0.
  - ``zscore`` (Bruch et al. §4.2; OpenSearch's ``z_score`` technique): ``φ(s) = (s - μ) / σ``
    over the list (population σ); ``σ = 0`` maps to 0. Floor: the list's lowest ``φ`` (a document
    the channel did not return scores as its worst returned one, not as its average).
  - ``dbsf`` (Qdrant's distribution-based score fusion, qdrant-client ``hybrid/fusion.py``
    ``distribution_based_score_fusion``): ``φ(s) = (s - (μ - 3σ)) / 6σ``, clipped to ``[0, 1]``;
    ``σ = 0`` maps to 0.5. Floor 0.

Ties (both methods) are broken by the best single-channel rank, then by id, so the fused order
is deterministic. A document that only one channel returned is scored against the other
channel's floor, never dropped: with a weight ``w > 0`` on its channel it ranks by that channel's
score (``tests/core/test_fusion.py`` checks that a keyword-only top hit stays in the fused top 10
under every method for any dense weight below 1, beside equal-length channels).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

Method = Literal["rrf", "weighted"]
Normalization = Literal["minmax", "zscore", "dbsf"]
METHODS: tuple[Method, ...] = ("rrf", "weighted")
NORMALIZATIONS: tuple[Normalization, ...] = ("minmax", "zscore", "dbsf")


class Fused(NamedTuple):
    """One fused item.

    Attributes:
        id: The item's id.
        score: Fused score (higher is better).
        ranks: Channel -> 1-based rank, for each channel that returned the item.
        normalized: Channel -> the channel's contribution before its weight: ``1 / (k + rank)``
            for ``rrf``, ``φ_c(s)`` for ``weighted``; only channels that returned the item.
    """

    id: str
    score: float
    ranks: dict[str, int]
    normalized: dict[str, float] = {}  # noqa: RUF012 - a NamedTuple default, never mutated


@dataclass(frozen=True)
class Fusion:
    """A fusion setting: the method and its parameters.

    Attributes:
        method: ``rrf`` or ``weighted``.
        k: RRF constant (``rrf`` only), ``>= 1``.
        weights: Channel -> weight ``>= 0`` (a missing channel weighs 1.0; 0 drops the channel).
        normalization: Score normalisation (``weighted`` only).
    """

    method: Method = "rrf"
    k: int = 60
    weights: Mapping[str, float] = field(default_factory=dict)
    normalization: Normalization = "minmax"

    def describe(self) -> dict[str, object]:
        """The setting as JSON (what ``explain`` and the tuner print)."""
        out: dict[str, object] = {"method": self.method, "weights": dict(self.weights)}
        if self.method == "rrf":
            out["k"] = self.k
        else:
            out["normalization"] = self.normalization
        return out


def fuse(
    channels: Mapping[str, Sequence[tuple[str, float]]], setting: Fusion, limit: int | None = None
) -> list[Fused]:
    """Fuse the channels' ranked ``(id, score)`` lists by ``setting``.

    Args:
        channels: Channel name -> ``(id, score)`` best first (scores higher-is-better).
        setting: The method and its parameters.
        limit: Return only the best ``limit`` items (every id is still scored); ``None``: all.

    Returns:
        The ids returned by a channel of non-zero weight, best fused score first.

    Raises:
        ValueError: An unknown method or normalisation, ``k < 1``, a negative or non-finite
            weight, or a negative ``limit``.
    """
    if setting.method == "rrf":
        return rrf({c: [i for i, _ in hits] for c, hits in channels.items()}, setting.k, setting.weights, limit)
    if setting.method == "weighted":
        return weighted(channels, setting.weights, setting.normalization, limit)
    raise ValueError(f"unknown fusion method {setting.method!r}; use one of {', '.join(METHODS)}")


def rrf(
    rankings: Mapping[str, Sequence[str]],
    k: int = 60,
    weights: Mapping[str, float] | None = None,
    limit: int | None = None,
) -> list[Fused]:
    """Fuse ranked id lists by weighted Reciprocal Rank Fusion (see the module docstring).

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
    _check_limit(limit)
    scores: dict[str, float] = {}
    best: dict[str, int] = {}
    channel_ranks: list[tuple[str, dict[str, int]]] = []
    for channel, ids in rankings.items():
        weight = _weight(weights, channel)
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
        Fused(
            item,
            -neg,
            {c: ranks[item] for c, ranks in channel_ranks if item in ranks},
            {c: 1.0 / (k + ranks[item]) for c, ranks in channel_ranks if item in ranks},
        )
        for neg, _, item in order[:limit]
    ]


def weighted(
    channels: Mapping[str, Sequence[tuple[str, float]]],
    weights: Mapping[str, float] | None = None,
    normalization: Normalization = "minmax",
    limit: int | None = None,
) -> list[Fused]:
    """Fuse by a weighted sum of normalised channel scores (see the module docstring).

    Args:
        channels: Channel name -> ``(id, score)`` best first (duplicate ids after the first are
            ignored); scores are higher-is-better (BM25, cosine similarity).
        weights: Channel name -> weight (default 1.0); a weight of 0 drops the channel.
        normalization: ``minmax``, ``zscore`` or ``dbsf``.
        limit: Return only the best ``limit`` items (every id is still scored); ``None``: all.

    Returns:
        The ids that appear in a channel of non-zero weight, best fused score first.

    Raises:
        ValueError: An unknown normalisation, a negative or non-finite weight or score, or a
            negative ``limit``.
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"unknown normalization {normalization!r}; use one of {', '.join(NORMALIZATIONS)}")
    _check_limit(limit)
    scores: dict[str, float] = {}
    best: dict[str, int] = {}
    base = 0.0  # every item starts at the weighted floors; a channel that returned it adds w·(φ - floor)
    kept: list[tuple[str, dict[str, int], dict[str, float]]] = []
    for channel, hits in channels.items():
        weight = _weight(weights, channel)
        if weight == 0:
            continue
        first: dict[str, float] = {}
        for item, value in hits:
            if not math.isfinite(value):
                raise ValueError(f"non-finite score {value!r} in channel {channel!r}")
            first.setdefault(item, float(value))
        normed, floor = normalize(list(first.values()), normalization)
        ranks = {item: rank for rank, item in enumerate(first, start=1)}
        by_item = dict(zip(first, normed, strict=True))
        kept.append((channel, ranks, by_item))
        base += weight * floor
        for item, value in by_item.items():
            scores[item] = scores.get(item, 0.0) + weight * (value - floor)
            rank = ranks[item]
            if rank < best.get(item, rank + 1):
                best[item] = rank
    order = sorted([(-(base + score), best[item], item) for item, score in scores.items()])
    return [
        Fused(
            item,
            -neg,
            {c: ranks[item] for c, ranks, _ in kept if item in ranks},
            {c: normed[item] for c, _, normed in kept if item in normed},
        )
        for neg, _, item in order[:limit]
    ]


def normalize(scores: Sequence[float], normalization: Normalization) -> tuple[list[float], float]:
    """Normalise one channel's scores over its list.

    Args:
        scores: The channel's scores, in any order (finite).
        normalization: ``minmax``, ``zscore`` or ``dbsf`` (formulas in the module docstring).

    Returns:
        ``(normalised scores in the same order, floor)``: the floor is what a document the channel
        did not return contributes (0 for ``minmax`` and ``dbsf``; the lowest z-score for ``zscore``).

    Raises:
        ValueError: An unknown normalisation.
    """
    if not scores:
        return [], 0.0
    if normalization == "minmax":
        low, high = min(scores), max(scores)
        span = high - low
        return [(s - low) / span if span > 0 else 1.0 for s in scores], 0.0
    mean = math.fsum(scores) / len(scores)
    std = math.sqrt(math.fsum((s - mean) ** 2 for s in scores) / len(scores))
    if normalization == "zscore":
        z = [(s - mean) / std if std > 0 else 0.0 for s in scores]
        return z, min(z)
    if normalization == "dbsf":
        low, high = mean - 3 * std, mean + 3 * std
        if std == 0:
            return [0.5 for _ in scores], 0.0
        return [min(1.0, max(0.0, (s - low) / (high - low))) for s in scores], 0.0
    raise ValueError(f"unknown normalization {normalization!r}; use one of {', '.join(NORMALIZATIONS)}")


def _weight(weights: Mapping[str, float] | None, channel: str) -> float:
    weight = (weights or {}).get(channel, 1.0)
    if not math.isfinite(weight) or weight < 0:
        raise ValueError(f"weight of channel {channel!r} must be finite and >= 0, got {weight!r}")
    return weight


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
