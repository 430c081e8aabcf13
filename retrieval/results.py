"""What a search returns and the hits it is built of: channels, fused candidates, pages."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from embedding.base import Embeddings, QueryEncoder
from indexing.chunking import document_id_of

Mode = Literal["bm25", "dense", "hybrid"]
MODES: tuple[Mode, ...] = ("bm25", "dense", "hybrid")


class ChannelHit(NamedTuple):
    """A chunk found by one channel: 1-based rank (after grouping), score, chunk id (a named tuple: cheap to build)."""

    key: str
    chunk_id: str
    document_id: str
    rank: int
    score: float


@dataclass(frozen=True, slots=True)
class Channel:
    """One channel's ranked hits as parallel lists (position ``i`` has rank ``i + 1``).

    Columns, not a :class:`ChannelHit` per hit: a channel keeps up to ``rank_window_size``
    hits per query, and fusion reads only their keys; hits are built for the fused page alone.
    """

    keys: list[str]
    chunk_ids: list[str]
    document_ids: list[str]
    scores: list[float]

    def __len__(self) -> int:
        return len(self.keys)

    def hit(self, i: int) -> ChannelHit:
        """The hit at position ``i`` (rank ``i + 1``)."""
        return ChannelHit(self.keys[i], self.chunk_ids[i], self.document_ids[i], i + 1, self.scores[i])


class Candidate(NamedTuple):
    """A fused candidate: its key, fused (or single-channel) score and the hit of each channel."""

    key: str
    score: float
    channels: dict[str, ChannelHit]
    fused: bool = False  # scored by the fusion over two channels
    normalized: dict[str, float] | None = None  # each channel's contribution before its weight
    rerank: dict[str, float] | None = None  # cross-encoder score and rank before it

    @property
    def best(self) -> ChannelHit:
        """The channel hit whose chunk represents this candidate (the best-ranked one)."""
        return min(self.channels.values(), key=lambda h: h.rank)


@dataclass
class Hit:
    """One result returned to the caller."""

    document_id: str
    chunk_id: str
    score: float
    text: str
    metadata: dict[str, Any]
    explain: dict[str, Any]


@dataclass
class SearchResult:
    """A page of hits plus how it was produced.

    ``total`` is the number of candidates the page is cut from: the distinct hits (documents
    when grouping) of the channels' candidate windows (``rank_window_size`` each; in hybrid mode
    their union, at most twice that) whose score passes ``min_score``. Pages reach
    ``min(total, rank_window_size)`` of them.
    """

    hits: list[Hit]
    total: int
    mode: Mode
    degraded: list[str] = field(default_factory=list)
    reranked: bool | None = None
    rerank_reason: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    # (start, end) of each stage in time.perf_counter() seconds: embed, bm25, ann, fusion, rerank, hydrate
    stage_times: dict[str, tuple[float, float]] = field(default_factory=dict, repr=False, compare=False)
    # the collection version that served it (set by the query service; None: the searcher's default target)
    version: int | None = None
    # under a gray release, the served version's role: "candidate" or "live"; None: no rollout active
    rollout: str | None = None
    # the query's vector as the searcher's own encoder computed it (None: BM25 only, or another encoder's),
    # for a second search of the same query (a gray release's shadow run) to reuse
    embedded: Future[Embeddings] | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class DenseTarget:
    """Where a query's dense channel searches: a version's store collection and that version's model.

    Chosen together from one version record (``indexing.versions``), so that a query vector is
    only ever searched against vectors of the same model.
    """

    physical: str
    encoder: QueryEncoder


@dataclass(frozen=True)
class RerankOptions:
    """Rerank the fused top ``top_n`` within ``budget_ms``."""

    top_n: int
    budget_ms: float
    batch_size: int = 32


def ranked(chunk_ids: Sequence[str], scores: Sequence[float], group: bool, window: int) -> Channel:
    """A channel's chunks (best first) as its first ``window`` ranked hits, one per document if grouping."""
    if not group:
        kept = list(chunk_ids[:window])
        return Channel(kept, kept, [document_id_of(c) for c in kept], list(scores[:window]))
    keys: list[str] = []
    kept_chunks: list[str] = []
    kept_scores: list[float] = []
    seen: set[str] = set()
    for chunk_id, score in zip(chunk_ids, scores, strict=True):
        document_id = document_id_of(chunk_id)
        if document_id in seen:
            continue
        seen.add(document_id)
        keys.append(document_id)
        kept_chunks.append(chunk_id)
        kept_scores.append(score)
        if len(keys) == window:
            break
    return Channel(keys, kept_chunks, keys, kept_scores)
