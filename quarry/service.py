"""The composition root's facade: one object that wires store, models, docstore and BM25.

The REST API and the CLI both talk to :class:`Quarry`; nothing else constructs backends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from embedding.base import Embedder, QueryEncoder
from embedding.batching import BatchingEmbedder
from embedding.factory import open_embedder
from embedding.process import ProcessEmbedder
from indexing.collections import NAME, CollectionConfig, FusionConfig
from indexing.docstore import open_docstore
from indexing.pipeline import Ingestor, IngestReport, Progress
from indexing.planner import GIB, IndexPlan, plan_for_store
from indexing.sources import SourceDocument
from quarry.errors import CollectionExists, CollectionNotFound, Conflict, InvalidRequest, clip
from quarry.metrics import SearchTelemetry
from quarry.settings import Settings
from rerank.base import Reranker
from retrieval.bm25_registry import BM25Registry
from retrieval.search import Mode, RerankOptions, Searcher, SearchResult
from retrieval.text import LANGUAGES, Language
from stores.base import VectorStore, redact_url
from stores.factory import open_store
from stores.filters import Filter, FilterLimits, parse_filter
from stores.routing import FilterRouter

log = logging.getLogger(__name__)


class Quarry:
    """Collections, ingestion and search over one store, one embedder and one docstore.

    Thread-safe: the REST server shares one instance across its worker threads.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        store: VectorStore | None = None,
        embedder: Embedder | None = None,
        reranker: Reranker | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Open the backends ``settings`` name, or use the ones passed in.

        Args:
            settings: The configuration.
            store: A vector store to use instead of opening ``settings.store_url``.
            embedder: An embedder to use instead of opening ``settings.embedding.url``.
            reranker: A reranker to use instead of loading ``settings.rerank.model``.
            clock: Seconds of a monotonic clock for the outage breakers and the rerank budget
                (see :class:`~retrieval.search.Searcher`); tests step one by hand.
        """
        self.settings = settings
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        router = FilterRouter(
            settings.store.exact_filter_rows or None, settings.store.filter_count_ttl_s, settings.store.max_scan_ids
        )
        self.store = store or open_store(settings.store_url, router)
        self.embedder = embedder or open_embedder(settings.embedding.url, settings)
        self.reranker = reranker if reranker is not None else _open_reranker(settings)
        self.docstore = open_docstore(
            settings.docstore.url, settings.data_dir,
            pool_size=settings.docstore.pool_size, connect_timeout_s=settings.docstore.connect_timeout_s,
        )
        self.bm25 = BM25Registry(self.docstore, settings.data_dir / "bm25", settings.bm25)
        self.ingestor = Ingestor(
            self.store, self.docstore, self.embedder, self.bm25,
            batch_size=settings.ingest.batch_size, embed_batch_size=settings.embedding.batch_size,
            max_document_chars=settings.ingest.max_document_chars, max_token_chars=settings.ingest.max_token_chars,
        )
        # queries from concurrent requests share model calls (dynamic batching), in a child
        # process if asked (and the model is ours to run: not one injected by the caller)
        self.query_embedder: QueryEncoder = (
            ProcessEmbedder(settings.embedding.url, settings)
            if settings.embedding.query_process and embedder is None
            else BatchingEmbedder(self.embedder)
        )
        self.telemetry = SearchTelemetry(metrics=settings.metrics.enabled)
        self.searcher = Searcher(
            self.store, self.docstore, self.query_embedder, self.bm25, settings.search, self.reranker, clock=clock,
            observe=self.telemetry,
        )
        self._write_locks: dict[str, threading.RLock] = {}
        self._write_locks_guard = threading.Lock()

    @contextmanager
    def _writing(self, name: str) -> Iterator[None]:
        """Serialise the writes to one collection, in this process and across processes.

        Upserts, deletes, index builds and drop each read the collection's state (stale chunks,
        metadata schema) and write it back, so two at once would keep both versions of a
        document or lose a field. Keyed by the lower-cased name, as some engines fold the case
        of collection names. The docstore's write lock (:meth:`StateStore.write_lock`) holds the
        other processes off (replicas, workers, the CLI on the same data dir).

        Raises:
            StoreUnavailable: Another process held the collection's write lock for 30 s.
        """
        with self._write_locks_guard:
            lock = self._write_locks.setdefault(name.lower(), threading.RLock())
        with lock, self.docstore.write_lock(name):
            yield

    def warm_up(self) -> None:
        """Load the BM25 indexes, then the models (reranker, embedder): the first request pays nothing.

        A BM25 snapshot that is damaged or disagrees with the docstore is rebuilt here (logged);
        a collection whose index cannot be rebuilt is left in ``bm25.failures`` (``/readyz``).
        The reranker loads first: a remote embedder that is down (``EmbeddingUnavailable``, which
        a server tolerates by degrading to BM25) must not hide a reranker that cannot load.

        Raises:
            ConfigError, RerankError: The reranker's model cannot be loaded.
            EmbeddingError: The embedder cannot load (``EmbeddingUnavailable``: its server is down).
        """
        self.bm25.load_all()
        if self.reranker is not None:
            self.reranker.warm_up()
        self.query_embedder.warm_up()

    def close(self) -> None:
        """Release the store, the docstore and the query encoder process (if any)."""
        try:
            if isinstance(self.query_embedder, ProcessEmbedder):
                self.query_embedder.close()
        finally:
            self.store.close()
            self.docstore.close()

    # --- collections -------------------------------------------------------------------
    def create_collection(
        self,
        name: str,
        *,
        language: Language = "auto",
        chunk_size: int | None = None,
        chunk_overlap: int | None = None,
        exist_ok: bool = False,
        fusion: FusionConfig | None = None,
    ) -> CollectionConfig:
        """Create a collection in the store and the docstore.

        ``fusion`` is the collection's default hybrid fusion (``None``: the server's settings);
        ``describe`` shows it and each search request may override it.

        Raises:
            InvalidRequest: Bad name, language or chunking.
            CollectionExists: The name is taken (unless ``exist_ok``).
        """
        if not NAME.fullmatch(name):
            raise InvalidRequest(
                f"invalid collection name {clip(name)}: start with a letter; letters, digits and '_' only; at most 63"
            )
        if language not in LANGUAGES:
            raise InvalidRequest(f"unknown language {clip(language)}; use one of {', '.join(LANGUAGES)}")
        with self._writing(name):
            return self._create_collection(name, language, chunk_size, chunk_overlap, exist_ok, fusion)

    def _create_collection(  # noqa: PLR0913 - the request's fields
        self,
        name: str,
        language: Language,
        chunk_size: int | None,
        chunk_overlap: int | None,
        exist_ok: bool,
        fusion: FusionConfig | None = None,
    ) -> CollectionConfig:
        existing = self.docstore.collection_config(name)
        if existing is not None:
            if not exist_ok:
                raise CollectionExists(name)
            if not self.store.has_collection(name):
                raise Conflict(
                    f"collection {name!r} is in the docstore of {self.settings.data_dir} but not in the vector "
                    f"store {redact_url(self.settings.store_url)}: this data dir was used with another store. "
                    "Keep one QUARRY_DATA_DIR per store (or drop the collection to start it again)"
                )
            return CollectionConfig.model_validate(existing)
        for other in self.docstore.list_collections():
            if other.lower() == name.lower():
                raise CollectionExists(name, existing=other)
        if self.store.has_collection(name):
            raise Conflict(
                f"collection {name!r} exists in the vector store {redact_url(self.settings.store_url)} but not in "
                f"the docstore of {self.settings.data_dir}: another data dir or deployment made it. "
                "Pick another name, or drop it with the store's own tools"
            )
        size = chunk_size or self.settings.ingest.chunk_size
        overlap = self.settings.ingest.chunk_overlap if chunk_overlap is None else chunk_overlap
        if size < 1 or not 0 <= overlap < size:
            raise InvalidRequest(f"chunk_overlap must be >= 0 and < chunk_size ({size}), got {overlap}")
        self.embedder.warm_up()
        cfg = CollectionConfig(
            name=name, language=language, embedding_model=self.embedder.model_id,
            embedding_fingerprint=self.embedder.fingerprint or None,
            dim=self.embedder.dim, chunk_size=size, chunk_overlap=overlap, fusion=fusion,
        )
        self.store.create_collection(name, cfg.dim, cfg.metric)
        try:
            plan = self._plan(0, cfg.dim)
            self.store.build_index(name, plan.spec, timeout_s=self.settings.store.index_build_timeout_s)
            cfg.index = _index_record(plan)
            # rows a write left under this name while another process dropped it are not inherited
            self.docstore.drop_collection(name)
            self.docstore.put_collection(name, cfg.to_json())
        except BaseException:
            self.store.drop_collection(name)
            raise
        return cfg

    def _plan(self, n_vectors: int, dim: int) -> IndexPlan:
        budget = int(self.settings.store.memory_budget_gib * GIB)
        return plan_for_store(self.store, n_vectors, dim, budget, top_k=self.searcher.depth)

    def replan_index(self, name: str) -> IndexPlan | None:
        """Re-plan the index for the collection's current size; rebuild it if the kind changed.

        Called after every ingestion that wrote vectors, so a collection moves from exact search
        to HNSW (or IVF) as it grows, as the planner decides for this engine.

        Returns:
            The new plan when the index was rebuilt, else ``None``. When the kind stays, the
            recorded plan (its reason, size and memory estimate, as ``describe`` shows them) is
            refreshed if its index spec is the one built; a spec that changed within the kind
            (e.g. IVF ``nlist``) keeps the record of what is built.
        """
        with self._writing(name):
            cfg = self.get_collection(name)
            plan = self._plan(self.store.count(name), cfg.dim)
            if plan.spec.kind != cfg.index.get("kind"):
                self.apply_index(name, plan)
                return plan
            record = _index_record(plan)
            same_spec = all(record[k] == cfg.index.get(k) for k in ("kind", "params", "search_params"))
            if same_spec and record != cfg.index:
                cfg.index = record
                self.docstore.put_collection(name, cfg.to_json())
            return None

    def apply_index(self, name: str, plan: IndexPlan) -> None:
        """Build a planned index on a collection and record it (and the planner's reasons).

        Raises:
            UnsupportedIndex: The engine cannot build the plan's index.
            IndexBuildFailed: The build failed or timed out (rolled back by the store).
        """
        with self._writing(name):
            cfg = self.get_collection(name)
            self.store.build_index(name, plan.spec, timeout_s=self.settings.store.index_build_timeout_s)
            cfg.index = _index_record(plan)
            self.docstore.put_collection(name, cfg.to_json())

    def get_collection(self, name: str) -> CollectionConfig:
        """A collection's configuration.

        Raises:
            CollectionNotFound: No such collection.
        """
        raw = self.docstore.collection_config(name)
        if raw is None:
            raise CollectionNotFound(name)
        return CollectionConfig.model_validate(raw)

    def list_collections(self) -> list[CollectionConfig]:
        """All collections, by name."""
        return [self.get_collection(n) for n in self.docstore.list_collections()]

    def describe(self, name: str) -> dict[str, Any]:
        """Configuration plus document/chunk/vector counts."""
        cfg = self.get_collection(name)
        documents, chunks = self.docstore.counts(name)
        return {**cfg.to_json(), "documents": documents, "chunks": chunks, "vectors": self.store.count(name)}

    def drop_collection(self, name: str) -> None:
        """Drop a collection everywhere.

        Raises:
            CollectionNotFound: No such collection.
        """
        with self._writing(name):
            self.get_collection(name)
            self.store.drop_collection(name)
            self.bm25.drop(name)
            self.docstore.drop_collection(name)

    # --- documents ---------------------------------------------------------------------
    def upsert(
        self, name: str, docs: Sequence[SourceDocument], progress: Progress | None = None, *, atomic: bool = False
    ) -> IngestReport:
        """Insert or replace documents (see :meth:`indexing.pipeline.Ingestor.upsert`), then re-plan the index."""
        with self._writing(name):
            report = self.ingestor.upsert(self.get_collection(name), docs, progress, atomic=atomic)
            if report.chunks_written:
                self.replan_index(name)
        return report

    def delete_documents(self, name: str, document_ids: Sequence[str]) -> IngestReport:
        """Delete documents by id from both channels."""
        with self._writing(name):
            return self.ingestor.delete(self.get_collection(name), document_ids)

    # --- search ------------------------------------------------------------------------
    def search(  # noqa: PLR0913 - mirrors the request body
        self,
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
            InvalidFilter: Unknown field or wrong type in ``filters``.
            InvalidQuery: Blank or over-long query, or bad paging.
        """
        cfg, flt = self._target(name, filters)
        return self.searcher.search(
            cfg, query, top_k=top_k, mode=mode, flt=flt, offset=offset, group=group, rerank=rerank,
            dense_timeout_s=dense_timeout_s, fusion=fusion, min_score=min_score,
        )

    async def search_async(  # noqa: PLR0913 - mirrors the request body
        self,
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
    ) -> SearchResult:
        """:meth:`search` without rerank, for an event loop (see ``Searcher.search_async``)."""
        cfg, flt = self._target(name, filters)
        return await self.searcher.search_async(
            cfg, query, top_k=top_k, mode=mode, flt=flt, offset=offset, group=group, fusion=fusion,
            min_score=min_score,
        )

    def _target(self, name: str, filters: Mapping[str, Any] | None) -> tuple[CollectionConfig, Filter | None]:
        """A search's collection and its filter, checked once for every mode.

        Checked against the collection's schema, the filter limits and the store's own limits.

        Raises:
            CollectionNotFound: No such collection.
            InvalidFilter: See :func:`stores.filters.parse_filter`; or the store cannot take it.
        """
        cfg = self.get_collection(name)
        search = self.settings.search
        limits = FilterLimits(search.max_filter_in_values, search.max_filter_values, search.max_filter_depth)
        flt = parse_filter(filters, cfg.schema_, limits)
        check = getattr(self.store, "check_filter", None)  # an engine's own limits (Milvus Lite's strings)
        if flt is not None and check is not None:
            check(flt)  # here, so that every mode, BM25 included, answers the same
        return cfg, flt


def _index_record(plan: IndexPlan) -> dict[str, Any]:
    """What a collection's description shows of its index: the spec, the plan and why."""
    return {
        "kind": plan.spec.kind, "params": plan.spec.params, "search_params": plan.spec.search_params,
        "ideal": plan.ideal, "reason": plan.reason, "fallback_reason": plan.fallback_reason,
        "planned_for_vectors": plan.n_vectors, "estimated_bytes": plan.estimated_bytes, "engine": plan.engine,
    }


def _open_reranker(settings: Settings) -> Reranker | None:
    if not settings.rerank.model:
        return None
    from rerank.factory import open_reranker

    return open_reranker(settings.rerank)
