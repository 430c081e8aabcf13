"""Abstention: when retrieval found nothing close enough, answer "not in the corpus" without asking the LLM.

The evidence of a question is one number, :func:`evidence_score`: the best similarity of the
dense channel among the retrieved hits (the store's cosine for the collection's model), in every
mode that has a dense channel, because the fused score of hybrid search is rank-based (RRF: the
top hit scores about 1/61 whether or not it is relevant) and says nothing of how close the
evidence is. In ``bm25`` mode it is the best BM25 score. ``None`` when there is no such score
(no hit, or the dense channel failed in a hybrid search): then the LLM is asked (or, with no hit,
told nothing).

The threshold is the request's ``min_score`` if given, else the collection's calibrated one
(``QUARRY_LLM__MIN_SCORES``, a map collection -> threshold, tuned by
``bench/answer_quality.py abstention`` on SciFact's train queries against out-of-corpus
questions: docs/answers.md), else none (always answer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class _Hit(Protocol):
    score: float
    explain: dict[str, Any]


def evidence_score(hits: Sequence[_Hit], mode: str) -> float | None:
    """The best dense similarity among ``hits`` (``bm25`` mode: the best BM25 score); ``None``: none known."""
    channel = "bm25" if mode == "bm25" else "dense"
    scores = []
    for hit in hits:
        score = _channel(hit, channel)
        if score is None and mode != "hybrid" and "rerank" not in hit.explain:
            score = hit.score  # a single channel's hit is scored by that channel
        if score is not None:
            scores.append(score)
    return max(scores) if scores else None


def threshold(min_scores: Mapping[str, float], collection: str, requested: float | None) -> float | None:
    """The request's ``min_score``, else the collection's calibrated threshold, else ``None``."""
    return requested if requested is not None else min_scores.get(collection)


def _channel(hit: _Hit, name: str) -> float | None:
    part = hit.explain.get(name)
    score = part.get("score") if isinstance(part, dict) else None
    return float(score) if isinstance(score, int | float) else None
