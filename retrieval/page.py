"""A search request's checks and the page built from its channels: pure functions over :mod:`retrieval.results`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from indexing.document_rules import check_unicode, is_blank
from quarry.errors import InvalidQuery, clip
from retrieval.fusion import Fusion, fuse
from retrieval.results import MODES, Candidate, Channel, Hit, RerankOptions


class SearchRequest(NamedTuple):
    """A search's fusion (resolved) and score floor."""

    fusion: Fusion
    min_score: float | None


def check_min_score(min_score: float | None) -> None:
    """Refuse a non-finite ``min_score``.

    Raises:
        InvalidQuery: ``min_score`` is NaN or infinite.
    """
    if min_score is not None and not math.isfinite(min_score):
        raise InvalidQuery(f"min_score must be a finite number, got {min_score!r}")


def check_query(  # noqa: PLR0913 - the request's fields and the two limits
    query: str, top_k: int, offset: int, mode: str, rerank: RerankOptions | None, *, max_chars: int, window: int
) -> None:
    """Refuse a query the searcher cannot answer as asked.

    Raises:
        InvalidQuery: Too long (``max_chars``), blank, bad Unicode or a NUL, an unknown mode,
            ``top_k < 1``, ``offset < 0``, a page past ``window`` (``rank_window_size``) or past
            the reranked window.
    """
    limit = max_chars
    if len(query) > limit:
        raise InvalidQuery(
            f"query is {len(query):,} characters; the limit is {limit:,} (QUARRY_SEARCH__MAX_QUERY_CHARS)"
        )
    if is_blank(query):  # "   ", and "\u200b", "\u0000", "\ufeff": nothing visible, nothing to rank by
        raise InvalidQuery("query must not be empty (it holds no visible character)")
    check_unicode(query, "query", InvalidQuery)
    if "\x00" in query:  # as in a document's text: nothing stores or tokenizes it
        raise InvalidQuery(f"query holds a NUL character at character {query.index(chr(0))}")
    if mode not in MODES:
        raise InvalidQuery(f"unknown mode {clip(mode)}; use one of {', '.join(MODES)}")
    if top_k < 1:
        raise InvalidQuery(f"top_k must be >= 1, got {top_k}")
    if offset < 0:
        raise InvalidQuery(f"offset must be >= 0, got {offset}")
    if offset + top_k > window:
        raise InvalidQuery(
            f"offset + top_k must be <= {window} (rank_window_size, "
            f"QUARRY_SEARCH__CANDIDATES), got {offset} + {top_k}"
        )
    if rerank is not None and offset + top_k > rerank.top_n:
        raise InvalidQuery(
            f"offset + top_k must be <= rerank.top_n ({rerank.top_n}: the reranked window, as "
            f"Elasticsearch's rank_window_size), got {offset} + {top_k}; a page past it would mix "
            "cross-encoder and fusion scores"
        )


def fuse_channels(
    channels: dict[str, Channel], needed: int, request: SearchRequest
) -> tuple[list[Candidate], int]:
    """The best ``needed`` candidates passing ``min_score`` (hits of each channel attached) and how many pass.

    One channel: its own ranking and scores. Two: :func:`retrieval.fusion.fuse` (RRF, Cormack et
    al. 2009, k = 60 by default; or weighted); ``total`` counts the union of the weighted channels'
    keys, or those passing ``min_score``.
    """
    floor = request.min_score
    if len(channels) == 1:
        (name, only), = channels.items()
        passing = len(only) if floor is None else sum(1 for x in only.scores if x >= floor)  # scores descend
        head = range(min(needed, passing))
        return [Candidate(only.keys[i], only.scores[i], {name: only.hit(i)}) for i in head], passing
    lists = {n: list(zip(channel.keys, channel.scores, strict=True)) for n, channel in channels.items()}
    fused = fuse(lists, request.fusion, needed if floor is None else None)
    if floor is None:
        total = len(set().union(*(channels[n].keys for n in lists if request.fusion.weights.get(n, 1.0) > 0)))
    else:
        fused = [f for f in fused if f.score >= floor]
        total = len(fused)
        fused = fused[:needed]
    # A channel hit's rank is its 1-based position in that channel's list (keys are unique there).
    candidates = [
        Candidate(f.id, f.score, {n: channels[n].hit(r - 1) for n, r in f.ranks.items()}, True, f.normalized)
        for f in fused
    ]
    return candidates, total


def hydrate(page: Sequence[Candidate], fusion: Fusion, chunks: dict[str, Any]) -> list[Hit]:
    """The page's hits with their stored text and metadata and each channel's ``explain``.

    ``chunks``: chunk id -> the stored chunk (``DocStore.get_chunks``); a candidate whose chunk is
    gone (an orphan vector) is left out.
    """
    hits = []
    for item in page:
        best = item.best
        stored = chunks.get(best.chunk_id)
        if stored is None:  # a vector whose chunk is gone (orphan): never shown
            continue
        explain: dict[str, Any] = {
            name: {"rank": h.rank, "score": h.score, "chunk_id": h.chunk_id} for name, h in item.channels.items()
        }
        if item.fused:
            for name, part in (item.normalized or {}).items():
                explain[name]["normalized"] = part
            explain["fusion"] = {**fusion.describe(), "score": item.score}
        if item.rerank is not None:
            explain["rerank"] = item.rerank
        score = item.rerank["score"] if item.rerank is not None else item.score
        metadata = {k: v for k, v in stored.payload.items() if k != "document_id"}
        hits.append(Hit(stored.document_id, stored.chunk_id, float(score), stored.text, metadata, explain))
    return hits
