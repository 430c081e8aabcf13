"""``Quarry``: the services of one view behind one handle, for the adapters, the jobs and the tests.

A ``Quarry`` is a :class:`~quarry.services.view.View` (engines, a tenant's space, a namespace)
with the service functions of :mod:`quarry.services` as methods; it holds no logic of its own.
``Quarry(settings)`` opens the engines (the composition root, :func:`~quarry.services.view.open_engines`)
and is the default tenant's view; :meth:`for_tenant` and :meth:`for_collection` give other views
of the same engines, by value.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any

from embedding.base import Embedder, Embeddings, QueryEncoder
from indexing.bm25_registry import BM25Registry
from indexing.collections import CollectionConfig, FusionConfig
from indexing.docstore import CollectionVersion, Job, StateStore
from indexing.document_rules import SourceDocument
from indexing.pipeline import Ingestor, IngestReport, Precomputed, Progress, Watch
from indexing.planner import IndexPlan
from indexing.reindex import Reindexer
from indexing.reindex_build import ReindexReport
from indexing.text import Language
from monitoring.drift import QueryDrift
from monitoring.monitor import RecallMonitor
from quarry.metrics import SearchTelemetry
from quarry.services import collections, documents, versions
from quarry.services import query as queries
from quarry.services.namespace import OWN, Namespace
from quarry.services.recall_check import RecallCheck
from quarry.services.view import (
    Engines,
    Schedule,
    TenantSpace,
    View,
    for_collection,
    open_engines,
    scoped,
    shared_space,
    space_for,
)
from quarry.settings import Settings
from rerank.base import Reranker
from retrieval.results import Mode, RerankOptions, SearchResult
from retrieval.search import Searcher
from stores.base import VectorStore


class Quarry:
    """Collections, documents, versions and search in one view of the engines (see the module doc).

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
        """Open the backends ``settings`` name, or use the ones passed in (see :func:`open_engines`)."""
        engines = open_engines(settings, store=store, embedder=embedder, reranker=reranker, clock=clock)
        self._set(View(engines, engines.root))

    @classmethod
    def of(cls, view: View) -> Quarry:
        """The handle of ``view`` (sharing its engines)."""
        handle = cls.__new__(cls)
        handle._set(view)
        return handle

    def _set(self, view: View) -> None:
        self.view = view
        engines, space = view.engines, view.space
        self.settings: Settings = engines.settings
        self.embedder: Embedder = engines.embedder
        self.query_embedder: QueryEncoder = engines.query_embedder
        self.reranker: Reranker | None = engines.reranker
        self.store: VectorStore = space.store
        self.docstore: StateStore = space.docstore
        self.bm25: BM25Registry = space.bm25
        self.ingestor: Ingestor = space.ingestor
        self.monitor: RecallMonitor = space.monitor
        self.drift: QueryDrift = space.drift
        self.telemetry: SearchTelemetry = space.telemetry
        self.searcher: Searcher = space.searcher
        self.reindexer: Reindexer = space.reindexer

    @property
    def engines(self) -> Engines:
        """The engines every view of this service shares."""
        return self.view.engines

    @property
    def space(self) -> TenantSpace:
        """This view's tenant space."""
        return self.view.space

    @property
    def ns(self) -> Namespace:
        """This view's namespace (:data:`~quarry.services.namespace.OWN`, or a shared collection's)."""
        return self.view.ns

    @property
    def tenant_id(self) -> str:
        """The caller's tenant."""
        return self.view.tenant_id

    @property
    def scheduler(self) -> Schedule | None:
        """The reindex scheduler of this space (``quarry serve`` starts one for the default tenant)."""
        return self.view.space.scheduler

    @scheduler.setter
    def scheduler(self, value: Schedule | None) -> None:
        self.view.space.scheduler = value

    # --- views ---------------------------------------------------------------------------
    def for_tenant(self, tenant_id: str) -> Quarry:
        """This service as tenant ``tenant_id`` sees it (see :mod:`quarry.tenancy`).

        The default tenant's is the root view; a view shares the models and the store's
        connections; close the root, not a view.

        Raises:
            Forbidden: ``tenant_id`` is empty or not a tenant of the state of record (fails closed).
        """
        if tenant_id == self.tenant_id and self.ns is OWN:
            return self
        return Quarry.of(View(self.engines, space_for(self.engines, tenant_id)))

    def for_collection(self, name: str) -> Quarry:
        """This view, or, when ``name`` is a shared collection, the view of it scoped to this tenant.

        Raises:
            Forbidden: This view's tenant is empty or malformed (never an unscoped view).
        """
        view = for_collection(self.view, name)
        return self if view is self.view else Quarry.of(view)

    def shared_view(self) -> Quarry:
        """The unscoped view of the shared collections (the operator's admin actions only)."""
        return Quarry.of(View(self.engines, shared_space(self.engines)))

    def scoped(self, tenant_id: str) -> Quarry:
        """The shared collections as tenant ``tenant_id`` sees them.

        Raises:
            Forbidden: ``tenant_id`` is empty or not a tenant id (fails closed).
        """
        return Quarry.of(scoped(self.engines, tenant_id))

    def home(self) -> Quarry:
        """The caller's own tenant view (a scoped shared view's tenant; else this view)."""
        return self.for_tenant(self.tenant_id) if self.ns.shared else self

    def _writing(self, name: str) -> AbstractContextManager[None]:
        return self.space.writing(name)

    def warm_up(self) -> None:
        """Load the BM25 indexes, then the models (reranker, embedder): the first request pays nothing.

        A BM25 snapshot that is damaged or disagrees with the state is rebuilt here (logged);
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
        """Release the store, the state of record and the query encoder process (if any)."""
        self.engines.close()

    # --- collections (quarry.services.collections) -----------------------------------------
    def create_collection(  # noqa: PLR0913 - the request's fields
        self, name: str, *, language: Language = "auto", chunk_size: int | None = None,
        chunk_overlap: int | None = None, exist_ok: bool = False, fusion: FusionConfig | None = None,
        shared: bool = False, cache_threshold: float | None = None,
    ) -> CollectionConfig:
        """See :func:`quarry.services.collections.create`."""
        return collections.create(self.view, name, language=language, chunk_size=chunk_size,
                                  chunk_overlap=chunk_overlap, exist_ok=exist_ok, fusion=fusion, shared=shared,
                                  cache_threshold=cache_threshold)

    def get_collection(self, name: str) -> CollectionConfig:
        """See :func:`quarry.services.collections.get`."""
        return collections.get(self.view, name)

    def list_collections(self) -> list[CollectionConfig]:
        """See :func:`quarry.services.collections.list_all`."""
        return collections.list_all(self.view)

    def describe(self, name: str) -> dict[str, Any]:
        """See :func:`quarry.services.collections.describe`."""
        return collections.describe(self.view, name)

    def drop_collection(self, name: str) -> None:
        """See :func:`quarry.services.collections.drop`."""
        collections.drop(self.view, name)

    def replan_index(self, name: str) -> IndexPlan | None:
        """See :func:`quarry.services.collections.replan_index`."""
        return collections.replan_index(self.view, name)

    def apply_index(self, name: str, plan: IndexPlan) -> None:
        """See :func:`quarry.services.collections.apply_index`."""
        collections.apply_index(self.view, name, plan)

    # --- documents (quarry.services.documents) -------------------------------------------
    def upsert(
        self, name: str, docs: Sequence[SourceDocument], progress: Progress | None = None, *, atomic: bool = False
    ) -> IngestReport:
        """See :func:`quarry.services.documents.upsert`."""
        return documents.upsert(self.view, name, docs, progress, atomic=atomic)

    def upsert_batch(self, name: str, docs: Sequence[SourceDocument], watch: Watch | None = None) -> IngestReport:
        """See :func:`quarry.services.documents.upsert_batch`."""
        return documents.upsert_batch(self.view, name, docs, watch)

    def upsert_stream(  # noqa: PLR0913 - the stream's controls
        self, name: str, docs: Iterable[SourceDocument], progress: Progress | None = None, *,
        stop: Callable[[], bool] | None = None, seen: set[str] | None = None, vectors: Precomputed | None = None,
    ) -> IngestReport:
        """See :func:`quarry.services.documents.upsert_stream`."""
        return documents.upsert_stream(self.view, name, docs, progress, stop=stop, seen=seen, vectors=vectors)

    def get_document(self, name: str, document_id: str) -> dict[str, Any]:
        """See :func:`quarry.services.documents.get`."""
        return documents.get(self.view, name, document_id)

    def list_documents(
        self, name: str, *, cursor: str | None = None, limit: int = 100
    ) -> tuple[list[dict[str, Any]], str | None]:
        """See :func:`quarry.services.documents.list_page`."""
        return documents.list_page(self.view, name, cursor=cursor, limit=limit)

    def document_ids(self, name: str) -> list[str]:
        """See :func:`quarry.services.documents.ids`."""
        return documents.ids(self.view, name)

    def delete_documents(self, name: str, document_ids: Sequence[str]) -> IngestReport:
        """See :func:`quarry.services.documents.delete`."""
        return documents.delete(self.view, name, document_ids)

    def delete_where(self, name: str, filters: Mapping[str, Any]) -> IngestReport:
        """See :func:`quarry.services.documents.delete_where`."""
        return documents.delete_where(self.view, name, filters)

    # --- versions (quarry.services.versions) ---------------------------------------------
    def live_version(self, name: str) -> CollectionVersion:
        """See :func:`quarry.services.versions.live_version`."""
        return versions.live_version(self.view, name)

    def register_model(self, url: str, model: Embedder) -> None:
        """Use ``model`` for versions whose fingerprint is its own, as if opened from ``url``."""
        self.engines.models.register(url, model)

    def reindex(self, name: str, **kwargs: Any) -> ReindexReport:
        """See :func:`quarry.services.versions.reindex`."""
        return versions.reindex(self.view, name, **kwargs)

    def start_reindex(self, name: str, **kwargs: Any) -> Job:
        """See :func:`quarry.services.versions.start_reindex`."""
        return versions.start_reindex(self.view, name, **kwargs)

    def get_job(self, job_id: str) -> Job:
        """See :func:`quarry.services.versions.get_job`."""
        return versions.get_job(self.view, job_id)

    def rollback(self, name: str) -> ReindexReport:
        """See :func:`quarry.services.versions.rollback`."""
        return versions.rollback(self.view, name)

    # --- search (quarry.services.query) --------------------------------------------------
    def search(  # noqa: PLR0913 - mirrors the request body
        self, name: str, query: str, *, top_k: int = 10, mode: Mode = "hybrid",
        filters: Mapping[str, Any] | None = None, offset: int = 0, group: bool = True,
        rerank: RerankOptions | None = None, dense_timeout_s: float | None = None,
        fusion: FusionConfig | None = None, min_score: float | None = None,
    ) -> SearchResult:
        """See :func:`quarry.services.query.search`."""
        return queries.search(self.view, name, query, top_k=top_k, mode=mode, filters=filters, offset=offset,
                            group=group, rerank=rerank, dense_timeout_s=dense_timeout_s, fusion=fusion,
                            min_score=min_score)

    async def search_async(  # noqa: PLR0913 - mirrors the request body
        self, name: str, query: str, *, top_k: int = 10, mode: Mode = "hybrid",
        filters: Mapping[str, Any] | None = None, offset: int = 0, group: bool = True,
        fusion: FusionConfig | None = None, min_score: float | None = None, rerank: RerankOptions | None = None,
        embedded: Future[Embeddings] | None = None,
    ) -> SearchResult:
        """See :func:`quarry.services.query.search_async`."""
        return await queries.search_async(self.view, name, query, top_k=top_k, mode=mode, filters=filters,
                                          offset=offset, group=group, fusion=fusion, min_score=min_score,
                                          rerank=rerank, embedded=embedded)

    def recall(self, name: str) -> dict[str, Any]:
        """See :func:`quarry.services.query.recall`."""
        return queries.recall(self.view, name)

    def check_recall(self, name: str, n_queries: int) -> RecallCheck:
        """See :func:`quarry.services.query.check_recall`."""
        return queries.check_recall(self.view, name, n_queries)


__all__ = ["Quarry"]
