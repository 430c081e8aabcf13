"""The composition root: engines opened once, one space per tenant, and the view a request acts in.

* :class:`Engines` — what every tenant shares: the settings, the vector store's connections, the
  models (:class:`~quarry.services.models.ModelRegistry`), the reranker, the state of record.
* :class:`TenantSpace` — one tenant's parts, built once per tenant (:func:`space_for`): its
  state view (collections keyed ``(tenant, name)``), its store view (``t_<tenant>__<name>``, see
  :mod:`quarry.tenancy`), BM25 registry, ingestor, searcher, recall monitor, query drift, reindexer and
  write locks. The shared collections have a space of their own (tenant
  :data:`~quarry.tenancy.SHARED`).
* :class:`View` — a space seen through a :class:`~quarry.services.namespace.Namespace`: a
  tenant's own collections (:data:`~quarry.services.namespace.OWN`), or the shared space scoped
  to one tenant (:func:`for_collection`). Every service function takes one.

Nothing else constructs backends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, cast

from embedding.base import Embedder, QueryEncoder
from embedding.batching import BatchingEmbedder
from embedding.factory import open_embedder
from embedding.process import ProcessEmbedder
from indexing.bm25_registry import BM25Registry
from indexing.docstore import DEFAULT_TENANT, CollectionVersion, StateStore, open_docstore
from indexing.index_sizing import GIB
from indexing.pipeline import Ingestor
from indexing.planner import IndexPlan, plan_for_store, plan_kind
from indexing.reindex import Reindexer
from monitoring.drift import QueryDrift
from monitoring.monitor import RecallMonitor
from monitoring.recent import RecentQueries
from quarry.errors import Forbidden, clip
from quarry.metrics import SearchTelemetry
from quarry.services.models import ModelRegistry
from quarry.services.namespace import OWN, Namespace, SharedNamespace
from quarry.settings import Settings
from quarry.tenancy import SHARED, TenantStore
from rerank.base import Reranker
from retrieval.search import Searcher
from stores.base import IndexSpec, Metric, VectorStore
from stores.factory import open_store
from stores.routing import FilterRouter


class Schedule(Protocol):
    """What a collection's description reads of the reindex scheduler (:class:`quarry.scheduler.ReindexScheduler`)."""

    def next_run(self, name: str) -> float | None:
        """Unix time of ``name``'s next scheduled reindex, or ``None``."""


@dataclass(eq=False)
class TenantSpace:
    """One tenant's parts (see the module doc); built by :func:`space_for`, shared by its requests."""

    tenant_id: str
    settings: Settings
    docstore: StateStore
    store: VectorStore
    bm25: BM25Registry
    ingestor: Ingestor
    monitor: RecallMonitor
    telemetry: SearchTelemetry
    searcher: Searcher
    drift: QueryDrift
    reindexer: Reindexer = field(init=False)
    scheduler: Schedule | None = None  # `quarry serve` starts one for the default tenant
    versions: dict[tuple[str, int], CollectionVersion] = field(default_factory=dict)  # rows are immutable
    _locks: dict[str, threading.RLock] = field(default_factory=dict)
    _locks_guard: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:  # noqa: D105
        self.reindexer = Reindexer(
            self.store, self.docstore, self.settings.reindex, self.writing, self.plan, depth=self.searcher.depth,
            index_timeout_s=self.settings.store.index_build_timeout_s,
        )

    @contextmanager
    def writing(self, name: str) -> Iterator[None]:
        """Serialise the writes to one collection, in this process and across processes.

        Upserts, deletes, index builds and drop each read the collection's state (stale chunks,
        metadata schema) and write it back, so two at once would keep both versions of a
        document or lose a field. Keyed by the lower-cased name, as some engines fold the case
        of collection names. The docstore's write lock (:meth:`StateStore.write_lock`) holds the
        other processes off (replicas, workers, the CLI on the same data dir).

        Raises:
            StoreUnavailable: Another process held the collection's write lock for 30 s.
        """
        with self._locks_guard:
            lock = self._locks.setdefault(name.lower(), threading.RLock())
        with lock, self.docstore.write_lock(name):
            yield

    def plan(self, n_vectors: int, dim: int) -> IndexPlan:
        """The planner's index for ``n_vectors`` vectors of ``dim`` on this store, within the memory budget."""
        budget = int(self.settings.store.memory_budget_gib * GIB)
        return plan_for_store(self.store, n_vectors, dim, budget, top_k=self.searcher.depth)

    def index_spec(self, kind: str | None, n_vectors: int, dim: int, metric: Metric) -> IndexSpec | None:
        """The index a reindex asks for: ``None``/``auto`` is the planner's, a kind the planner's parameters for it.

        Raises:
            UnsupportedIndex: An unknown kind, or one this engine cannot build.
        """
        if kind is None or kind.strip().lower() == "auto":
            return None
        budget = int(self.settings.store.memory_budget_gib * GIB)
        return plan_kind(kind, n_vectors, dim, self.store.capabilities(), budget, metric, top_k=self.searcher.depth)


@dataclass(eq=False)
class Engines:
    """What every tenant shares (see the module doc); :func:`open_engines` builds it."""

    settings: Settings
    store: VectorStore
    embedder: Embedder
    query_embedder: QueryEncoder
    reranker: Reranker | None
    docstore: StateStore
    telemetry: SearchTelemetry
    models: ModelRegistry
    clock: Callable[[], float]
    root: TenantSpace = field(init=False)
    _spaces: dict[str, TenantSpace] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        """Release the store, the state of record and the query encoder process (if any)."""
        self.root.monitor.close()
        try:
            if isinstance(self.query_embedder, ProcessEmbedder):
                self.query_embedder.close()
        finally:
            self.store.close()
            self.docstore.close()


@dataclass(frozen=True, eq=False)
class View:
    """A tenant's space through a namespace: what a service function acts in.

    ``tenant_id`` is the caller's tenant: the space's own, or the tenant a shared namespace scopes to.
    """

    engines: Engines
    space: TenantSpace
    ns: Namespace = OWN

    @property
    def tenant_id(self) -> str:  # noqa: D102
        return self.ns.tenant_id or self.space.tenant_id

    @property
    def settings(self) -> Settings:  # noqa: D102
        return self.engines.settings

    @property
    def docstore(self) -> StateStore:  # noqa: D102
        return self.space.docstore

    @property
    def store(self) -> VectorStore:  # noqa: D102
        return self.space.store


def open_engines(
    settings: Settings,
    *,
    store: VectorStore | None = None,
    embedder: Embedder | None = None,
    reranker: Reranker | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Engines:
    """Open the backends ``settings`` name (or use the ones passed in) and the default tenant's space.

    Args:
        settings: The configuration.
        store: A vector store to use instead of opening ``settings.store_url``.
        embedder: An embedder to use instead of opening ``settings.embedding.url``.
        reranker: A reranker to use instead of loading ``settings.rerank.model``.
        clock: Seconds of a monotonic clock for the outage breakers and the rerank budget
            (see :class:`~retrieval.search.Searcher`); tests step one by hand.
    """
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    router = FilterRouter(
        settings.store.exact_filter_rows or None, settings.store.filter_count_ttl_s, settings.store.max_scan_ids
    )
    opened_store = store or open_store(settings.store_url, router)
    model = embedder or open_embedder(settings.embedding.url, settings)
    ranker = reranker if reranker is not None else _open_reranker(settings)
    docstore = open_docstore(
        settings.docstore.url, settings.data_dir,
        pool_size=settings.docstore.pool_size, connect_timeout_s=settings.docstore.connect_timeout_s,
        timeout_s=settings.docstore.timeout_s,
    )
    # queries from concurrent requests share model calls (dynamic batching), in a child
    # process if asked (and the model is ours to run: not one injected by the caller)
    query_embedder: QueryEncoder = (
        ProcessEmbedder(settings.embedding.url, settings)
        if settings.embedding.query_process and embedder is None
        else BatchingEmbedder(model)
    )
    engines = Engines(
        settings, opened_store, model, query_embedder, ranker, docstore,
        SearchTelemetry(metrics=settings.metrics.enabled), ModelRegistry(settings, model, query_embedder), clock,
    )
    engines.root = _build_space(engines, DEFAULT_TENANT)
    return engines


def space_for(engines: Engines, tenant_id: str) -> TenantSpace:
    """Tenant ``tenant_id``'s space (see :mod:`quarry.tenancy`); built once per tenant.

    Raises:
        Forbidden: ``tenant_id`` is empty or not a tenant of the state of record (fails closed:
            never an unscoped view).
    """
    if tenant_id == DEFAULT_TENANT:
        return engines.root
    space = engines._spaces.get(tenant_id)
    if space is not None:
        return space
    with engines._guard:
        space = engines._spaces.get(tenant_id)
        if space is None:
            if tenant_id != SHARED and (
                not tenant_id or tenant_id not in {t for t, _ in engines.docstore.list_tenants()}
            ):
                raise Forbidden(f"tenant {clip(tenant_id)} is not known to this server: refusing an unscoped "
                                "request", reason="tenant")
            space = engines._spaces[tenant_id] = _build_space(engines, tenant_id)
    return space


def shared_space(engines: Engines) -> TenantSpace:
    """The space of the shared collections as a whole (:data:`~quarry.tenancy.SHARED`); built once.

    Unscoped: only :func:`for_collection` (which scopes it to one tenant) and the operator's
    admin actions use it.
    """
    return space_for(engines, SHARED)


def for_collection(view: View, name: str) -> View:
    """``view``, or, when ``name`` is a shared collection, the shared space scoped to ``view``'s tenant.

    A tenant's own collection of the name wins (it is never routed into a shared one).

    Raises:
        Forbidden: The tenant is empty or malformed (never an unscoped view).
    """
    if view.space.tenant_id == SHARED or view.ns.shared:
        return view
    shared = shared_space(view.engines)
    if shared.docstore.collection_config(name) is None or view.docstore.collection_config(name) is not None:
        return view
    return scoped(view.engines, view.tenant_id)


def scoped(engines: Engines, tenant_id: str) -> View:
    """The shared collections as tenant ``tenant_id`` sees them (:class:`SharedNamespace`).

    Raises:
        Forbidden: ``tenant_id`` is empty or not a tenant id (fails closed).
    """
    ns = SharedNamespace(tenant_id, lambda name: _tenant_schemas(engines, name))  # checks the id first
    return View(engines, shared_space(engines), ns)


def _tenant_schemas(engines: Engines, name: str) -> bool:
    from indexing.collections import CollectionConfig
    from quarry.errors import CollectionNotFound

    raw = shared_space(engines).docstore.collection_config(name)
    if raw is None:
        raise CollectionNotFound(name)
    return CollectionConfig.model_validate(raw).tenant_schemas


def _build_space(engines: Engines, tenant_id: str) -> TenantSpace:
    settings = engines.settings
    root = tenant_id == DEFAULT_TENANT
    docstore = engines.docstore if root else engines.docstore.for_tenant(tenant_id)
    store = engines.store if root else cast(VectorStore, TenantStore(engines.store, tenant_id))
    bm25 = BM25Registry(docstore, settings.data_dir / ("bm25" if root else f"bm25@{tenant_id}"), settings.bm25)
    if not root:
        bm25.on_swap = engines.root.bm25.on_swap
    ingestor = Ingestor(
        store, docstore, engines.embedder, bm25,
        batch_size=settings.ingest.batch_size, embed_batch_size=settings.embedding.batch_size,
        max_document_chars=settings.ingest.max_document_chars, max_token_chars=settings.ingest.max_token_chars,
        watched_call_s=settings.ingest.progress_interval_s,
    )
    # a share of live searches re-run exactly in a background thread (monitoring/)
    recent = RecentQueries(settings.data_dir / "monitor" / ("recent.sqlite" if root else f"recent@{tenant_id}.sqlite"),
                           settings.monitor.recent_queries)
    monitor = (RecallMonitor(store, settings.monitor, recent=recent) if root
               else RecallMonitor(store, settings.monitor, recent=recent, tenant=tenant_id))
    telemetry = engines.telemetry if root else engines.telemetry.for_tenant(tenant_id)  # its series carry the tenant
    # each search's query against a reference of them (the references kept in the state of record)
    drift = QueryDrift(settings.monitor, tenant=tenant_id, references=docstore)
    searcher = Searcher(
        store, docstore, engines.query_embedder, bm25, settings.search, engines.reranker, clock=engines.clock,
        observe=telemetry, sample_dense=monitor.offer, observe_query=drift.observe,
    )
    return TenantSpace(tenant_id, settings, docstore, store, bm25, ingestor, monitor, telemetry, searcher, drift)


def _open_reranker(settings: Settings) -> Reranker | None:
    if not settings.rerank.model:
        return None
    from rerank.factory import open_reranker

    return open_reranker(settings.rerank)
