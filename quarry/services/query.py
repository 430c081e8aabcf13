"""Search: the request's collection, filter and live version, then the searcher; and recall figures.

:meth:`~retrieval.search.Searcher.search_async` is the one implementation of a search; the
synchronous :func:`search` adds the rerank stage, which runs in the caller's thread.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from embedding.base import Embeddings
from indexing.collections import CollectionConfig, FusionConfig
from indexing.docstore import CollectionVersion, off_loop
from quarry.errors import CollectionNotFound, EmbeddingError, QuarryError, StoreError
from quarry.services import feedback, rollout, versions
from quarry.services.recall_check import RecallCheck
from quarry.services.recall_check import check_recall as monitoring_check
from quarry.services.rollout import Route
from quarry.services.versions import live_version
from quarry.services.view import View
from retrieval.results import DenseTarget, Mode, RerankOptions, SearchResult
from stores.filters import Filter, FilterLimits, parse_filter


def target(v: View, name: str, filters: Mapping[str, Any] | None) -> tuple[CollectionConfig, Filter | None]:
    """A search's collection and its filter, checked once for every mode.

    Checked against the collection's schema (a shared one's: the caller's own fields), the
    filter limits and the store's own limits; then narrowed to the namespace's rows.

    Raises:
        CollectionNotFound: No such collection.
        Forbidden: A shared collection's filter names ``tenant_id``.
        InvalidFilter: See :func:`stores.filters.parse_filter`; or the store cannot take it.
    """
    v.ns.check_filter(filters)
    with v.ns.messages():  # an engine's limits (Milvus Lite's strings) name the stored keys
        raw = v.docstore.collection_config(name)
        if raw is None:
            raise CollectionNotFound(name)
        cfg = CollectionConfig.model_validate(raw)
        search = v.settings.search
        limits = FilterLimits(search.max_filter_in_values, search.max_filter_values, search.max_filter_depth)
        flt = parse_filter(filters, v.ns.filter_schema(cfg), limits)
        if flt is not None:
            flt = v.ns.stored_filter(cfg, flt)
        check = getattr(v.store, "check_filter", None)  # an engine's own limits (Milvus Lite's strings)
        if flt is not None and check is not None:
            check(flt)  # here, so that every mode, BM25 included, answers the same
    return cfg, v.ns.scoped(flt)


def _search_target(
    v: View, name: str, filters: Mapping[str, Any] | None, mode: Mode, query: str
) -> tuple[CollectionConfig, Filter | None, DenseTarget | None, CollectionVersion, Route | None]:
    cfg, flt = target(v, name, filters)
    if v.docstore.get_rollout(name) is None:  # cached: the common case reads no more
        cfg, dense, version = versions.dense_target(v, cfg, mode)
        return cfg, flt, dense, version, None
    cfg, dense, version, chosen = rollout.dense_target(v, cfg, mode, query)  # a gray release routes it
    return cfg, flt, dense, version, chosen


def _served(v: View, name: str, result: SearchResult, version: CollectionVersion, chosen: Route | None) -> SearchResult:
    """``result`` in the caller's names, stamped with the collection version that served it, kept for feedback.

    ``rollout``: that version's role while a gray release routes the search (``candidate`` or
    ``live``; a search the candidate failed and the live version served again is ``live``),
    ``None`` without one. The request's id is noted with it (:func:`quarry.services.feedback.note`).
    """
    result.version = version.version
    if chosen is not None:
        result.rollout = "candidate" if version.version == chosen.rollout.candidate else "live"
    result = v.ns.result(name, result)
    feedback.note(v, name, result, chosen)
    return result


def _failed_over(  # noqa: PLR0913 - the failed search's parts
    v: View, name: str, filters: Mapping[str, Any] | None, mode: Mode, chosen: Route | None, started: float,
    exc: QuarryError,
) -> tuple[CollectionConfig, DenseTarget | None, CollectionVersion]:
    """A failed search, counted for a gray release; where to serve it again: the live version.

    Only a search the candidate failed by a backend error is served again by the live version.

    Raises:
        QuarryError: ``exc``, for any other failure.
    """
    rollout.observe(v, name, chosen, time.perf_counter() - started, None, None)
    if not (chosen is not None and chosen.candidate and isinstance(exc, (StoreError, EmbeddingError))):
        raise exc
    return versions.dense_target(v, target(v, name, filters)[0], mode)


def search(  # noqa: PLR0913 - mirrors the request body
    v: View,
    name: str,
    query: str,
    *,
    top_k: int = 10,
    mode: Mode = "hybrid",
    filters: Mapping[str, Any] | None = None,
    offset: int = 0,
    group: bool = True,
    rerank: RerankOptions | None = None,
    dense_timeout_s: float | None = None,
    fusion: FusionConfig | None = None,
    min_score: float | None = None,
) -> SearchResult:
    """Search a collection (see :meth:`retrieval.search.Searcher.search`).

    Raises:
        CollectionNotFound: No such collection.
        Forbidden: See :func:`target`.
        InvalidFilter: Unknown field or wrong type in ``filters``.
        InvalidQuery: Blank or over-long query, or bad paging.
    """
    cfg, flt, dense, version, chosen = _search_target(v, name, filters, mode, query)
    started = time.perf_counter()
    with v.ns.messages():  # a store's filter errors name the stored keys
        try:
            result = v.space.searcher.search(
                cfg, query, top_k=top_k, mode=mode, flt=flt, offset=offset, group=group, rerank=rerank,
                dense_timeout_s=dense_timeout_s, fusion=fusion, min_score=min_score, target=dense,
                within=v.ns.bm25_within(),
            )
        except QuarryError as exc:
            cfg, dense, version = _failed_over(v, name, filters, mode, chosen, started, exc)
            result = v.space.searcher.search(
                cfg, query, top_k=top_k, mode=mode, flt=flt, offset=offset, group=group, rerank=rerank,
                dense_timeout_s=dense_timeout_s, fusion=fusion, min_score=min_score, target=dense,
                within=v.ns.bm25_within(),
            )
            return _served(v, name, result, version, chosen)
    if chosen is not None:  # a gray release counts it
        asked = rollout.Asked(cfg, query, top_k, mode, flt, fusion, v.ns.bm25_within(), result.embedded)
        rollout.observe(v, name, chosen, time.perf_counter() - started, result, asked)
    return _served(v, name, result, version, chosen)


async def search_async(  # noqa: PLR0913 - mirrors the request body
    v: View,
    name: str,
    query: str,
    *,
    top_k: int = 10,
    mode: Mode = "hybrid",
    filters: Mapping[str, Any] | None = None,
    offset: int = 0,
    group: bool = True,
    fusion: FusionConfig | None = None,
    min_score: float | None = None,
    rerank: RerankOptions | None = None,
    embedded: Future[Embeddings] | None = None,
) -> SearchResult:
    """:func:`search` for an event loop (see ``Searcher.search_async``, also for ``embedded``).

    The collection's configuration and live version come from the state store's caches on the
    loop; after a commit they are read again in a worker thread (``off_loop``).
    """
    cfg, flt, dense, version, chosen = await off_loop(_search_target, v, name, filters, mode, query)
    started = time.perf_counter()
    with v.ns.messages():
        try:
            result = await v.space.searcher.search_async(
                cfg, query, top_k=top_k, mode=mode, flt=flt, offset=offset, group=group, rerank=rerank,
                fusion=fusion, min_score=min_score, target=dense, within=v.ns.bm25_within(), embedded=embedded,
            )
        except QuarryError as exc:
            cfg, dense, version = _failed_over(v, name, filters, mode, chosen, started, exc)
            result = await v.space.searcher.search_async(
                cfg, query, top_k=top_k, mode=mode, flt=flt, offset=offset, group=group, rerank=rerank,
                fusion=fusion, min_score=min_score, target=dense, within=v.ns.bm25_within(), embedded=embedded,
            )
            return _served(v, name, result, version, chosen)
    if chosen is not None:  # a gray release counts it
        asked = rollout.Asked(cfg, query, top_k, mode, flt, fusion, v.ns.bm25_within(), result.embedded)
        rollout.observe(v, name, chosen, time.perf_counter() - started, result, asked)
    return _served(v, name, result, version, chosen)


def recall(v: View, name: str) -> dict[str, Any]:
    """Recent recall figures of a collection's sampled searches (see ``RecallMonitor.figures``).

    Raises:
        CollectionNotFound: No such collection.
        Forbidden: A shared collection (figures of every tenant's searches), asked by another
            tenant than the operator's.
    """
    if v.docstore.collection_config(name) is None:
        raise CollectionNotFound(name)
    v.ns.require_operator(name, "read the recall figures of")
    live = live_version(v, name)
    return {**v.space.monitor.figures(name, live.physical_name, live.swapped_at), "version": live.version}


def check_recall(v: View, name: str, n_queries: int, seed: int = 0) -> RecallCheck:
    """Measure recall@k now on the live version of ``name`` (see :func:`quarry.services.recall_check.check_recall`).

    Raises:
        CollectionNotFound: No such collection.
        Forbidden: A shared collection, asked by another tenant than the operator's.
        InvalidRequest: ``n_queries < 1``.
        StoreError, EmbeddingError: The store or the model failed.
    """
    raw = v.docstore.collection_config(name)
    if raw is None:
        raise CollectionNotFound(name)
    v.ns.require_operator(name, "measure the recall of")
    live = live_version(v, name)
    model = v.engines.models.model_for(live)[0]
    return monitoring_check(v.space.monitor, v.space.store, v.docstore, CollectionConfig.model_validate(raw), live,
                            model, n_queries, depth=v.space.searcher.depth, seed=seed)
