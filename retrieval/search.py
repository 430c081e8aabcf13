"""The query path: BM25 and dense recall, grouped by document, fused, optionally reranked.

Over 500 lines by design: one query's steps, written once, and the three drivers that run them
(blocking, awaited on the loop, several together for a shadow run) share the Searcher's state.

Each channel fetches a fixed depth of chunks (``DEPTH_FACTOR × rank_window_size``), groups them
by document and keeps ``rank_window_size`` hits (as Elasticsearch's RRF retriever does), so a page
``[offset, offset + top_k)`` is always a slice of one and the same fused list: joined pages equal
the top-``(offset + top_k)`` list. The fusion (:mod:`retrieval.fusion`: ``rrf`` or ``weighted``) is
the request's over the collection's default over the server's settings (:meth:`Searcher.fusion`).
``min_score`` keeps the candidates whose score (the fused score in hybrid mode, the channel's own
score in a single-channel mode) is at least it, before paging; ``total`` counts the candidates
that pass it. Hits are grouped by document by default (a document's best
chunk stands for it), since relevance is judged per document. In hybrid mode a failing embedder
or vector store (or, on the REST path, one slower than ``dense_timeout_s``) degrades the query to
BM25 only, and the response says so; in dense mode the error propagates (503). After an outage
of either, queries skip it for ``retry_after_s`` (:class:`~quarry.breaker.OutageBreaker`); one
query that the store answers late (``StoreTimeout``) is that query's failure, not an outage. The
query is queued for the embedding model first and BM25 scores while the model runs.

The query is written once, as steps that yield two futures (the query's vector from the batching
embedder, its ANN hits from :class:`~retrieval.ann_batching.BatchingSearch`): :meth:`Searcher.search`
blocks on them in the calling thread (CLI, evaluation), :meth:`Searcher.search_async` awaits them
on the REST API's event loop (the step driver: :mod:`retrieval.steps`). What a search returns:
:mod:`retrieval.results`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedding.base import Embeddings, QueryEncoder
from indexing.bm25_registry import BM25Registry
from indexing.collections import CollectionConfig, FusionConfig, model_mismatch
from indexing.docstore import DocStore, cache_only
from indexing.text import tokenize
from monitoring.drift import oov_share
from quarry.breaker import OutageBreaker, failed
from quarry.errors import (
    EmbeddingError,
    EmbeddingUnavailable,
    ModelDimensionMismatch,
    ModelMismatch,
    QuarryError,
    StoreTimeout,
    StoreUnavailable,
)
from quarry.settings import SearchSettings
from rerank.base import Reranker
from retrieval.ann_batching import BatchingSearch
from retrieval.fusion import Fusion
from retrieval.page import SearchRequest, check_min_score, check_query, fuse_channels, hydrate
from retrieval.results import (
    Candidate,
    Channel,
    DenseTarget,
    Mode,
    RerankOptions,
    SearchResult,
    ranked,
)
from retrieval.steps import Late, StateRead, advance, outcome, read_outcome, resolve, resolve_all
from stores.base import ScoredId, VectorStore
from stores.filters import Filter, predicate

DEPTH_FACTOR = 2  # chunks fetched per channel = DEPTH_FACTOR × rank_window_size
# On the REST path a query longer than this (characters), or one with a filter (a Python test of
# every row's payload), tokenises and scores BM25 in a worker thread, off the event loop: four
# clients looping 8,192-character queries on the loop raised a light client's p50 from 25 to 355 ms.
LOOP_QUERY_CHARS = 256
# Told of each dense channel's ANN answer: (collection, metric, query vector, filter, top_k, hits,
# the store collection searched);
# must return at once (the recall monitor's RecallMonitor.offer queues a sample or does nothing).
DenseSampler = Callable[[str, Any, Any, Filter | None, int, Sequence[ScoredId], str], object]
# Told of each search's query once its channels ran: (collection, the store collection of the dense
# channel or None, the query vector (dim,) or None, the share of its BM25 terms the collection does
# not hold or None); must return at once (monitoring.drift.QueryDrift.observe: O(dim), never waits).
QueryObserver = Callable[[str, str | None, Any, float | None], object]


@dataclass(frozen=True)
class SearchCall:
    """One search of :meth:`Searcher.search_together`: :meth:`Searcher.search`'s arguments of the same names."""

    cfg: CollectionConfig
    query: str
    top_k: int = 10
    mode: Mode = "hybrid"
    flt: Filter | None = None
    fusion: FusionConfig | None = None
    target: DenseTarget | None = None
    within: str | None = None
    embedded: Future[Embeddings] | None = None


class Searcher:
    """Runs queries over collections; safe to share across threads.

    Args:
        store: The vector store.
        docstore: Chunks and collection configs.
        embedder: Encodes the queries.
        bm25: The collections' BM25 snapshots.
        settings: ``QUARRY_SEARCH__*``.
        reranker: The cross-encoder, if one is configured.
        clock: Seconds of a monotonic clock (:func:`time.monotonic` by default), read by the
            outage breakers' skip windows and the rerank budget; not by the dense deadline,
            which is real time.
        observe: Called with ``(collection, mode, result)`` as each search ends (metrics and
            spans, :class:`quarry.metrics.SearchTelemetry`).
        sample_dense: Told of every dense channel's ANN answer (the recall monitor's sampler).
        observe_query: Told of each search's query vector and out-of-vocabulary share (the
            query drift, :data:`QueryObserver`).
    """

    def __init__(
        self,
        store: VectorStore,
        docstore: DocStore,
        embedder: QueryEncoder,
        bm25: BM25Registry,
        settings: SearchSettings,
        reranker: Reranker | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        observe: Callable[[str, str, SearchResult], None] | None = None,
        sample_dense: DenseSampler | None = None,
        observe_query: QueryObserver | None = None,
    ) -> None:
        self._observe = observe or _unobserved
        self._sample_dense: DenseSampler = sample_dense or _no_sample
        self._observe_query: QueryObserver = observe_query or _no_sample
        self._ann = BatchingSearch(
            store, max_batch=settings.ann_max_batch, retry_after_s=settings.retry_after_s, clock=clock
        )
        self._embed_breaker = OutageBreaker(EmbeddingUnavailable, settings.retry_after_s, clock=clock)
        self._clock = clock
        self._docstore = docstore
        self._embedder = embedder
        self._bm25 = bm25
        self._settings = settings
        self._reranker = reranker

    @property
    def embed_outage(self) -> EmbeddingUnavailable | None:
        """The query model's last outage while searches skip it, else ``None``."""
        return self._embed_breaker.outage

    @property
    def store_outage(self) -> StoreUnavailable | None:
        """The store's last ``StoreUnavailable`` while searches skip the store, else ``None``."""
        return self._ann.breaker.outage

    @property
    def window(self) -> int:
        """``rank_window_size``: hits per channel to fuse; ``offset + top_k`` may not exceed it."""
        return self._settings.candidates

    @property
    def depth(self) -> int:
        """Chunks fetched per channel: ``DEPTH_FACTOR × window``.

        After grouping chunks by document a channel then still fills its window with distinct
        documents; the depth is fixed, so pages stay slices of one list.
        """
        return self._settings.candidates * DEPTH_FACTOR

    def search(  # noqa: PLR0913 - these are the request's fields
        self,
        cfg: CollectionConfig,
        query: str,
        *,
        top_k: int = 10,
        mode: Mode = "hybrid",
        flt: Filter | None = None,
        offset: int = 0,
        group: bool = True,
        rerank: RerankOptions | None = None,
        dense_timeout_s: float | None = None,
        fusion: FusionConfig | None = None,
        min_score: float | None = None,
        target: DenseTarget | None = None,
        within: str | None = None,
        embedded: Future[Embeddings] | None = None,
    ) -> SearchResult:
        """Search one collection.

        Args:
            cfg: The collection.
            query: Query text (non-blank).
            top_k: Hits to return, ``1 <= top_k`` and ``offset + top_k <= rank_window_size``.
            mode: ``bm25``, ``dense`` or ``hybrid``.
            flt: Metadata filter applied inside both channels.
            offset: Hits to skip (pagination).
            group: One hit per document (its best chunk) instead of one per chunk.
            rerank: Rerank the fused top-N with the cross-encoder within a time budget.
            dense_timeout_s: Longest wait for the dense channel, in seconds, as in
                :meth:`search_async`; ``None`` waits as long as the embedder and the store do.
            fusion: Hybrid fusion over the collection's default (:meth:`fusion`).
            min_score: Keep only candidates scoring at least this, before paging: in hybrid
                mode the fused score (``rrf``: ``Σ w / (k + rank)``, at most ``Σ w / (k + 1)``;
                ``weighted``: ``Σ w · φ(s)``, in ``[0, Σ w]`` for ``minmax``/``dbsf``); in ``bm25``
                mode the BM25 score; in ``dense`` mode the store's similarity (cosine in
                ``[-1, 1]``). A hybrid query answered by one channel (``degraded``) compares it
                with that channel's own score. ``None``: keep all.
            target: The live version's store collection and query model (default: ``cfg.name``
                and the searcher's encoder).
            within: A shared collection's tenant, as its document ids' prefix (``T/``): the BM25
                channel's statistics (N, avgdl, df) are its rows' (:meth:`indexing.bm25_live.LiveView.scores`),
                never the other tenants'. ``None``: the collection's.
            embedded: The query's vector already asked of this searcher's encoder
                (:meth:`submit_query`), used instead of embedding the query again; ignored when
                ``target`` names another encoder (that one is asked).

        Returns:
            The page of hits, ``total`` fused candidates, degradations and timings.

        Raises:
            InvalidQuery: Blank query, one over ``max_query_chars``, bad ``top_k``/``offset``/``mode``,
                or a page past the reranked window (``offset + top_k > rerank.top_n``).
            EmbeddingUnavailable: Dense mode and the embedder is down.
            StoreUnavailable: Dense mode and the vector store is down (in hybrid mode the dense
                channel is skipped and ``degraded`` says why).
            ModelMismatch: Dense mode and the collection's vectors come from another model, or one
                of another dimension (``ModelDimensionMismatch``); in hybrid mode the dense channel
                is skipped, as when the embedder is down.
        """
        deadline = None if dense_timeout_s is None else time.monotonic() + dense_timeout_s
        request = self._request(cfg, fusion, min_score)
        steps = self._steps(cfg, query, top_k, mode, flt, offset, group, rerank, request, target, within, embedded)
        return resolve(steps, deadline)

    def search_together(
        self, calls: Sequence[SearchCall], dense_timeout_s: float | None = None
    ) -> list[SearchResult | Exception]:
        """Run several searches at once in this thread (:func:`retrieval.steps.resolve_all`).

        Their query vectors and ANN searches are asked together, so the micro-batchers serve them
        in shared calls (a lone ANN query costs a store call of its own: ~3x the CPU per query).
        Each is :meth:`search` with its :class:`SearchCall`'s arguments (first page, grouped by
        document, no rerank); ``dense_timeout_s`` as there, for all of them.

        Returns:
            Per call, in order: its result, or the exception :meth:`search` would have raised.
        """
        deadline = None if dense_timeout_s is None else time.monotonic() + dense_timeout_s
        all_steps = [self._call_steps(call) for call in calls]
        return resolve_all(all_steps, deadline)

    def _call_steps(self, call: SearchCall) -> Generator[Future[Any] | StateRead, Any, SearchResult]:
        """A :class:`SearchCall`'s steps (a bad argument raises at the first step, as the query's own failure)."""
        request = self._request(call.cfg, call.fusion, None)
        return (yield from self._steps(call.cfg, call.query, call.top_k, call.mode, call.flt, 0, True, None, request,
                                       call.target, call.within, call.embedded))

    async def search_async(  # noqa: PLR0913 - these are the request's fields
        self,
        cfg: CollectionConfig,
        query: str,
        *,
        top_k: int = 10,
        mode: Mode = "hybrid",
        flt: Filter | None = None,
        offset: int = 0,
        group: bool = True,
        rerank: RerankOptions | None = None,
        fusion: FusionConfig | None = None,
        min_score: float | None = None,
        target: DenseTarget | None = None,
        within: str | None = None,
        embedded: Future[Embeddings] | None = None,
    ) -> SearchResult:
        """:meth:`search` for an event loop; same results and errors.

        It waits on the model and the store without holding a thread; for a short unfiltered
        query BM25, fusion and hydration (well under a millisecond each) run on the loop. One
        request thread less per query in flight: fewer threads contend for the GIL with the
        model's and the store's. A query over ``LOOP_QUERY_CHARS`` characters or with a filter
        runs its first step (validation, BM25) in a worker thread instead, so that no request's
        CPU work stalls the loop's other requests.

        Unlike :meth:`search`, it waits at most ``dense_timeout_s`` for the dense channel: past
        it a hybrid query answers from BM25 alone (``degraded`` says so) and a dense query raises
        ``EmbeddingUnavailable`` or ``StoreUnavailable`` (whichever was late; both retryable).

        With ``rerank`` every step runs in a worker thread (the cross-encoder is CPU-bound and
        reads the chunks it rescores). ``embedded``: the query's vector already asked of this
        searcher's encoder (:meth:`submit_query`, e.g. by the answer cache's lookup), used instead of
        embedding the query again (when the collection's live version uses another encoder, that
        one is asked).
        """
        deadline = time.monotonic() + self._settings.dense_timeout_s
        request = self._request(cfg, fusion, min_score)
        steps = self._steps(cfg, query, top_k, mode, flt, offset, group, rerank, request, target, within, embedded)
        threaded = rerank is not None
        if threaded or (
            mode != "dense" and (len(query) > LOOP_QUERY_CHARS or flt is not None or not self._bm25_current(cfg.name))
        ):
            step = await asyncio.to_thread(advance, steps, None)
        else:
            step = advance(steps, None)
        while isinstance(step, StateRead | Future):
            if isinstance(step, StateRead):  # on the state's threads, failed there at its deadline
                read: Future[Any] = self._docstore.submit(step.fn, *step.args)
                await asyncio.wait({asyncio.wrap_future(read)})
                step = await asyncio.to_thread(advance, steps, read) if threaded else advance(steps, read)
                continue
            waiting = asyncio.wrap_future(step)
            waiting.add_done_callback(read_outcome)  # read even when the query stopped waiting
            done, _ = await asyncio.wait({waiting}, timeout=max(0.0, deadline - time.monotonic()))
            outcome: tuple[Future[Any] | None, Late | None] = (step, None) if done else (None, Late())
            if threaded:
                step = await asyncio.to_thread(advance, steps, *outcome)
            else:
                step = advance(steps, *outcome)
        return step

    def _bm25_current(self, name: str) -> bool:
        """Whether the collection's BM25 view is at hand without a state read (else the first step goes to a thread)."""
        try:
            with cache_only():
                self._bm25.get(name)
        except Exception:  # noqa: BLE001 - a read needed (CacheMiss), or an error the thread will raise again
            return False
        return True

    def _steps(  # noqa: PLR0913 - the request's fields
        self,
        cfg: CollectionConfig,
        query: str,
        top_k: int,
        mode: Mode,
        flt: Filter | None,
        offset: int,
        group: bool,
        rerank: RerankOptions | None,
        request: SearchRequest,
        target: DenseTarget | None = None,
        within: str | None = None,
        embedded: Future[Embeddings] | None = None,
    ) -> Generator[Future[Any] | StateRead, Any, SearchResult]:
        """The query as steps, each waiting on a future (or a state read: :class:`StateRead`).

        Each ``yield`` hands out a future (the query's vector, then its ANN hits) and takes its
        result back, or its exception thrown in; the caller decides how to wait (:func:`retrieval.steps.resolve`
        blocks, :meth:`search_async` awaits).
        """
        check_query(
            query, top_k, offset, mode, rerank, max_chars=self._settings.max_query_chars, window=self.window
        )
        result = SearchResult([], 0, mode)
        channels: dict[str, Channel] = {}
        started = time.perf_counter()
        # The model runs while BM25 scores; submit never blocks (errors come through the future).
        physical, encoder = (cfg.name, self._embedder) if target is None else (target.physical, target.encoder)
        pending = self._query_vector(query, encoder, embedded) if mode != "bm25" else None
        result.embedded = pending if encoder is self._embedder else None  # for a shadow run of it to reuse
        oov: list[float | None] = [None]  # the BM25 channel's out-of-vocabulary share (query drift)
        if mode in ("bm25", "hybrid"):
            channels["bm25"] = self._timed(
                result, "bm25", lambda: self._bm25_channel(cfg, query, flt, group, within, oov)
            )
        vector = None
        if pending is not None:
            dense_started = time.perf_counter()
            embeddings: Embeddings | None = None
            try:
                embeddings = yield pending
            except EmbeddingError as exc:
                _skip_dense(result, exc)
            except Late:
                no_vector = EmbeddingUnavailable(f"no query vector within {self._late()}")
                self._embed_breaker.record(no_vector)  # a hung model server is skipped like a down one
                _skip_dense(result, no_vector)
            if embeddings is not None and embeddings.vectors.shape[1] != cfg.dim:  # the clearer reason first
                dims = {"expected": cfg.dim, "got": int(embeddings.vectors.shape[1])}
                _skip_dense(result, ModelDimensionMismatch(cfg.name, encoder.model_id, **dims))
                embeddings = None
            mismatch = None if embeddings is None else model_mismatch(cfg, encoder.model_id, encoder.fingerprint)
            if mismatch is not None:
                _skip_dense(result, mismatch)
                embeddings = None
            if embeddings is not None:
                ann_started = time.perf_counter()
                result.timings_ms["embed"] = (ann_started - started) * 1000  # queued -> vector, beside BM25
                result.stage_times["embed"] = (started, ann_started)
                # Ids and scores only: the document id is part of the chunk id, texts come from the docstore.
                asked = self._ann.submit(physical, embeddings.vectors, self.depth, flt, with_payload=False)
                try:
                    found: list[ScoredId] = yield asked
                except StoreUnavailable as exc:
                    _skip_dense(result, exc)
                except Late:
                    no_hits = StoreTimeout(f"the vector store did not answer within {self._late()}")
                    self._ann.late(asked, no_hits)  # this query's failure; several in a row: an outage
                    _skip_dense(result, no_hits)
                else:
                    ended = time.perf_counter()
                    result.timings_ms["ann"] = (ended - ann_started) * 1000
                    result.stage_times["ann"] = (ann_started, ended)
                    channels["dense"] = ranked([h.id for h in found], [h.score for h in found], group, self.window)
                    self._sample_dense(cfg.name, cfg.metric, embeddings.vectors[0], flt, top_k, found, physical)
                    result.timings_ms["dense"] = (time.perf_counter() - dense_started) * 1000
                    vector = embeddings.vectors[0]
        self._note_query(cfg.name, physical, vector, oov[0])
        needed = offset + top_k if rerank is None else max(offset + top_k, rerank.top_n)
        fused, result.total = self._timed_fuse(channels, needed, request, result)
        if rerank is not None:
            fused = self._rerank(cfg, query, fused, rerank, result)
        page = fused[offset : offset + top_k]
        started_hydrate = time.perf_counter()
        # the state read is a step: in this thread for search(), on the state's threads for search_async()
        stored = yield StateRead(self._docstore.get_chunks, cfg.name, [item.best.chunk_id for item in page])
        result.hits = hydrate(page, request.fusion, stored)
        ended = time.perf_counter()
        result.timings_ms["hydrate"] = (ended - started_hydrate) * 1000
        result.stage_times["hydrate"] = (started_hydrate, ended)
        self._observe(cfg.name, mode, result)
        return result

    def _note_query(self, collection: str, physical: str, vector: Any, oov: float | None) -> None:
        """Tell the query drift of the query's vector (``None``: none) and its OOV share, if either is known."""
        if vector is not None or oov is not None:
            self._observe_query(collection, physical if vector is not None else None, vector, oov)

    def _query_vector(
        self, query: str, encoder: QueryEncoder, embedded: Future[Embeddings] | None
    ) -> Future[Embeddings]:
        """``embedded`` when it comes from ``encoder`` (this searcher's), else the query queued for ``encoder``."""
        if embedded is not None and encoder is self._embedder:
            return embedded
        return self._submit_query(query, encoder)

    def submit_query(self, query: str) -> Future[Embeddings]:
        """The query's vector, queued for the model (or an outage, while the model is skipped).

        The answer cache keys on it; errors come through the future (``EmbeddingError``).
        """
        return self._submit_query(query)

    def _submit_query(self, query: str, encoder: QueryEncoder | None = None) -> Future[Embeddings]:
        """Queue the query for the model, unless the model's server is being skipped after an outage."""
        skipped = self._embed_breaker.check()
        if skipped is not None:
            return failed(skipped)
        pending = (encoder or self._embedder).submit([query])
        pending.add_done_callback(lambda done: self._embed_breaker.record(outcome(done)))
        return pending

    def _late(self) -> str:
        return f"{self._settings.dense_timeout_s:g} s (QUARRY_SEARCH__DENSE_TIMEOUT_S)"

    def _bm25_channel(  # noqa: PLR0913 - the request's fields
        self, cfg: CollectionConfig, query: str, flt: Filter | None, group: bool, within: str | None = None,
        oov: list[float | None] | None = None,
    ) -> Channel:
        """The BM25 channel; ``oov[0]`` is set to the share of the query's terms the collection does not hold."""
        index = self._bm25.get(cfg.name)
        keep = None if flt is None else predicate(flt)
        tokens = tokenize(query, cfg.language)
        if oov is not None:
            oov[0] = oov_share(tokens, index.holds)
        rows, scores = index.top(tokens, self.depth, keep, self._settings.max_query_terms, within)
        if group:  # each document's best row, in rank order
            _, first = np.unique(index.document_codes[rows], return_index=True)
            first.sort()
            rows, scores = rows[first], scores[first]
        row_list = rows[: self.window].tolist()
        chunk_ids = [index.chunk_ids[r] for r in row_list]
        document_ids = [index.document_ids[r] for r in row_list]
        return Channel(document_ids if group else chunk_ids, chunk_ids, document_ids, scores[: self.window].tolist())

    def _timed_fuse(
        self, channels: dict[str, Channel], needed: int, request: SearchRequest, result: SearchResult
    ) -> tuple[list[Candidate], int]:
        """:func:`~retrieval.page.fuse_channels`, timed as the ``fusion`` stage when two channels are fused."""
        started = time.perf_counter()
        fused = fuse_channels(channels, needed, request)
        if len(channels) > 1:
            result.stage_times["fusion"] = (started, time.perf_counter())
        return fused

    def fusion(self, cfg: CollectionConfig, request: FusionConfig | None = None) -> Fusion:
        """The fusion a hybrid search of ``cfg`` uses: the request's over the collection's over the settings'."""
        setting = Fusion(
            "rrf",
            self._settings.rrf_k,
            {"bm25": self._settings.bm25_weight, "dense": self._settings.dense_weight},
            "minmax",
        )
        for layer in (cfg.fusion, request):
            if layer is not None:
                setting = layer.over(setting)
        return setting

    def _request(self, cfg: CollectionConfig, fusion: FusionConfig | None, min_score: float | None) -> SearchRequest:
        check_min_score(min_score)
        return SearchRequest(self.fusion(cfg, fusion), min_score)

    def _rerank(
        self, cfg: CollectionConfig, query: str, fused: list[Candidate], opts: RerankOptions, result: SearchResult
    ) -> list[Candidate]:
        from rerank.budget import rerank_within_budget

        if self._reranker is None:
            result.reranked, result.rerank_reason = False, "no reranker configured (QUARRY_RERANK__MODEL)"
            return fused
        head, tail = fused[: opts.top_n], fused[opts.top_n :]
        chunks = self._docstore.get_chunks(cfg.name, [item.best.chunk_id for item in head])
        passages = [chunks[i.best.chunk_id].text if i.best.chunk_id in chunks else "" for i in head]
        started = time.perf_counter()
        outcome = rerank_within_budget(
            self._reranker, query, passages, opts.budget_ms, opts.batch_size, clock=self._clock
        )
        result.timings_ms["rerank"] = (time.perf_counter() - started) * 1000
        result.stage_times["rerank"] = (started, time.perf_counter())
        result.reranked, result.rerank_reason = outcome.reranked, outcome.reason
        if not outcome.reranked or outcome.scores is None:
            return fused
        scores = [float(x) for x in outcome.scores]
        order = sorted(range(len(head)), key=lambda i: (-scores[i], i))  # ties keep the fused order
        rescored = [head[i]._replace(rerank={"score": scores[i], "rank_before": i + 1}) for i in order]
        return rescored + tail

    def _model_mismatch(self, cfg: CollectionConfig) -> ModelMismatch | None:
        return model_mismatch(cfg, self._embedder.model_id, self._embedder.fingerprint)

    @staticmethod
    def _timed(result: SearchResult, name: str, fn: Any) -> Any:
        started = time.perf_counter()
        out = fn()
        ended = time.perf_counter()
        result.timings_ms[name] = (ended - started) * 1000
        result.stage_times[name] = (started, ended)
        return out


def _unobserved(collection: str, mode: str, result: SearchResult) -> None:
    """The default search observer: nothing."""


def _no_sample(*_: Any) -> None:
    """The default :data:`DenseSampler` and :data:`QueryObserver`: no recall monitor, no query drift."""


def _skip_dense(result: SearchResult, error: QuarryError) -> None:
    """A hybrid query goes on BM25-only and says why; a dense query has nothing left and raises."""
    if result.mode == "dense":
        raise error
    result.degraded.append(f"dense channel skipped, BM25 only: {error.message}")
