"""The composition root's facade: one object that wires store, models, docstore and BM25.

The REST API and the CLI both talk to :class:`Quarry`; nothing else constructs backends.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, cast

from embedding.base import Embedder, QueryEncoder
from embedding.batching import BatchingEmbedder
from embedding.factory import open_embedder
from embedding.process import ProcessEmbedder
from indexing.collections import NAME, CollectionConfig, FusionConfig
from indexing.docstore import DEFAULT_TENANT, CollectionVersion, Job, chunking_id_of, off_loop, open_docstore
from indexing.pipeline import Ingestor, IngestReport, Precomputed, Progress, Target
from indexing.planner import GIB, IndexPlan, plan_for_store
from indexing.reindex import Build, Reindexer, ReindexReport, new_owner
from quarry.scheduler import ReindexScheduler, last_trigger
from indexing.sources import SourceDocument
from indexing.versions import describe_versions, ensure_live, live_config
from monitoring.monitor import RecallMonitor
from monitoring.recent import RecentQueries
from quarry.errors import (
    CollectionExists,
    CollectionNotFound,
    Conflict,
    EmbeddingError,
    Forbidden,
    InvalidRequest,
    ModelMismatch,
    NotFound,
    clip,
)
from quarry.metrics import SearchTelemetry
from quarry.settings import Settings
from rerank.base import Reranker
from indexing.bm25_registry import BM25Registry
from retrieval.search import DenseTarget, Mode, RerankOptions, Searcher, SearchResult
from indexing.text import LANGUAGES, Language
from stores.base import IndexSpec, VectorStore, redact_url
from stores.factory import open_store
from stores.filters import FieldType, Filter, FilterLimits, matches, parse_filter
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
        self._clock = clock
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
            timeout_s=settings.docstore.timeout_s,
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
        # a share of live searches re-run exactly in a background thread (monitoring/)
        recent = RecentQueries(settings.data_dir / "monitor" / "recent.sqlite", settings.monitor.recent_queries)
        self.monitor = RecallMonitor(self.store, settings.monitor, recent=recent)
        self.searcher = Searcher(
            self.store, self.docstore, self.query_embedder, self.bm25, settings.search, self.reranker, clock=clock,
            observe=self.telemetry, sample_dense=self.monitor.offer,
        )
        self._write_locks: dict[str, threading.RLock] = {}
        self._write_locks_guard = threading.Lock()
        self._versions: dict[tuple[str, int], CollectionVersion] = {}  # (name, number): rows are immutable
        self._models: dict[str, tuple[Embedder, QueryEncoder]] = {}  # fingerprint -> other models
        self._models_guard = threading.Lock()
        self._model_urls: dict[str, str] = {}  # URL -> fingerprint of models registered by hand
        self.reindexer = Reindexer(
            self.store, self.docstore, settings.reindex, self._writing, self._plan,
            index_timeout_s=settings.store.index_build_timeout_s,
        )
        self.scheduler: ReindexScheduler | None = None  # `quarry serve` starts one (quarry/scheduler.py)
        self.tenant_id = DEFAULT_TENANT
        self._tenants: dict[str, Quarry] = {}
        self._tenants_guard = threading.Lock()
        self._root = self  # the service every tenant view was built from (it holds the shared view)
        self._shared_view: Quarry | None = None

    def shared_view(self) -> Quarry:
        """The view of the shared collections as a whole (:data:`quarry.tenancy.SHARED`); built once.

        Unscoped: only :meth:`for_collection` (which scopes it to one tenant) and the operator's
        admin actions use it.
        """
        root = self._root
        with root._tenants_guard:
            if root._shared_view is None:
                from quarry.tenancy import SHARED

                root._shared_view = root._build_view(SHARED)
            return root._shared_view

    def for_collection(self, name: str) -> Quarry:
        """This view, or, when ``name`` is a shared collection, the view of it scoped to this tenant.

        A tenant's own collection of the name wins (it is never routed into a shared one).
        See :mod:`quarry.shared`.

        Raises:
            Forbidden: This view's tenant is empty or malformed (never an unscoped view).
        """
        from quarry.tenancy import SHARED

        if self.tenant_id == SHARED:
            return self
        shared = self.shared_view()
        if shared.docstore.collection_config(name) is None or self.docstore.collection_config(name) is not None:
            return self
        from quarry.shared import scoped

        return scoped(shared, self.tenant_id)

    def for_tenant(self, tenant_id: str) -> Quarry:
        """This service as tenant ``tenant_id`` sees it (see :mod:`quarry.tenancy`); built once per tenant.

        The default tenant is this service itself. A view shares the models and the store's
        connections; close this service, not a view.

        Raises:
            Forbidden: ``tenant_id`` is empty or not a tenant of the state of record (fails closed:
                never an unscoped view).
        """
        if tenant_id == self.tenant_id:
            return self
        view = self._tenants.get(tenant_id)
        if view is not None:
            return view
        with self._tenants_guard:
            view = self._tenants.get(tenant_id)
            if view is None:
                view = self._tenants[tenant_id] = self._tenant_view(tenant_id)
        return view

    def _tenant_view(self, tenant_id: str) -> Quarry:
        if not tenant_id or tenant_id not in {t for t, _ in self.docstore.list_tenants()}:
            raise Forbidden(f"tenant {clip(tenant_id)} is not known to this server: refusing an unscoped request",
                            reason="tenant")
        return self._build_view(tenant_id)

    def _build_view(self, tenant_id: str) -> Quarry:
        from quarry.tenancy import TenantStore

        view = copy.copy(self)
        view.tenant_id = tenant_id
        view.docstore = self.docstore.for_tenant(tenant_id)
        view.store = cast(VectorStore, TenantStore(self.store, tenant_id))
        view.bm25 = BM25Registry(view.docstore, self.settings.data_dir / f"bm25@{tenant_id}", self.settings.bm25)
        view.bm25.on_swap = self.bm25.on_swap
        ingest = self.settings.ingest
        view.ingestor = Ingestor(
            view.store, view.docstore, self.embedder, view.bm25,
            batch_size=ingest.batch_size, embed_batch_size=self.settings.embedding.batch_size,
            max_document_chars=ingest.max_document_chars, max_token_chars=ingest.max_token_chars,
        )
        recent = RecentQueries(
            self.settings.data_dir / "monitor" / f"recent@{tenant_id}.sqlite", self.settings.monitor.recent_queries
        )
        view.monitor = RecallMonitor(view.store, self.settings.monitor, recent=recent, tenant=tenant_id)  # in scope
        view.telemetry = self.telemetry.for_tenant(tenant_id)  # its series carry the tenant
        view.searcher = Searcher(
            view.store, view.docstore, self.query_embedder, view.bm25, self.settings.search, self.reranker,
            clock=self._clock, observe=view.telemetry, sample_dense=view.monitor.offer,
        )
        view._versions, view._models, view._models_guard = {}, self._models, self._models_guard
        view.reindexer = Reindexer(
            view.store, view.docstore, self.settings.reindex, view._writing, view._plan,
            index_timeout_s=self.settings.store.index_build_timeout_s,
        )
        view.scheduler = None  # the scheduler reindexes the default tenant's collections only
        view._write_locks, view._write_locks_guard = {}, threading.Lock()
        view._tenants, view._tenants_guard = {}, threading.Lock()
        return view

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
        self.monitor.close()
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
        shared: bool = False,
    ) -> CollectionConfig:
        """Create a collection in the store and the docstore.

        ``fusion`` is the collection's default hybrid fusion (``None``: the server's settings);
        ``describe`` shows it and each search request may override it. ``shared``: a collection
        every tenant uses, each seeing its own documents only (:mod:`quarry.shared`).

        Raises:
            InvalidRequest: Bad name, language or chunking.
            CollectionExists: The name is taken (unless ``exist_ok``), by a shared collection too.
            Forbidden: ``shared`` asked by a tenant other than the operator's (``default``).
            Conflict: ``shared`` with a name some tenant's own collection has.
        """
        if not NAME.fullmatch(name):
            raise InvalidRequest(
                f"invalid collection name {clip(name)}: start with a letter; letters, digits and '_' only; at most 63"
            )
        if language not in LANGUAGES:
            raise InvalidRequest(f"unknown language {clip(language)}; use one of {', '.join(LANGUAGES)}")
        if shared:
            from quarry.shared import create_shared

            return create_shared(self, name, language=language, chunk_size=chunk_size,
                                 chunk_overlap=chunk_overlap, exist_ok=exist_ok, fusion=fusion)
        if self.for_collection(name) is not self:
            raise CollectionExists(name)  # a shared collection has the name
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
            plan = self._plan(self.store.count(self.live_version(name).physical_name), cfg.dim)
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
            physical = self.live_version(name).physical_name
            self.store.build_index(physical, plan.spec, timeout_s=self.settings.store.index_build_timeout_s)
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
        """All collections, by name: this tenant's own, then the shared ones (``tenancy: shared``)."""
        own = [self.get_collection(n) for n in self.docstore.list_collections()]
        from quarry.tenancy import SHARED

        if self.tenant_id == SHARED:
            return own
        shared = self.shared_view()
        from quarry.shared import tenant_view  # each tenant sees its own fields of a shared collection

        return own + [tenant_view(shared.get_collection(n), self.tenant_id) for n in shared.docstore.list_collections()]

    def describe(self, name: str) -> dict[str, Any]:
        """Configuration plus document/chunk/vector counts."""
        cfg = self.get_collection(name)
        live = self.live_version(name)
        documents, chunks = self.docstore.counts(name)
        versions = [v for v in describe_versions(self.docstore, name) if v["state"] != "failed"]
        counted: dict[str, int] = {}
        for v in versions:  # each version's chunks (versions of one chunking share its rows)
            chunking = chunking_id_of(v["chunking"])
            if chunking not in counted:
                counted[chunking] = self.docstore.counts(name, chunking=chunking)[1]
            v["chunks"] = counted[chunking]
        return {
            **live_config(cfg, live).to_json(), "documents": documents, "chunks": chunks,
            "vectors": self.store.count(live.physical_name), "live_version": live.version,
            "versions": versions,
            "reindex": {"next_run": self.scheduler.next_run(name) if self.scheduler is not None else None,
                        "last_trigger": last_trigger(self.docstore, name)},
        }

    def drop_collection(self, name: str) -> None:
        """Drop a collection everywhere.

        Raises:
            CollectionNotFound: No such collection.
        """
        with self._writing(name):
            self.get_collection(name)
            for version in self.docstore.list_versions(name):
                self.store.drop_collection(version.physical_name)
            self.store.drop_alias(name)
            self.store.drop_collection(name)
            self.bm25.drop(name)
            self.docstore.drop_collection(name)
            self.monitor.forget(name)

    # --- documents ---------------------------------------------------------------------
    def upsert(
        self, name: str, docs: Sequence[SourceDocument], progress: Progress | None = None, *, atomic: bool = False
    ) -> IngestReport:
        """Insert or replace documents (see :meth:`indexing.pipeline.Ingestor.upsert`), then re-plan the index."""
        with self._writing(name):
            cfg, target = self._write_target(name)
            report = self.ingestor.upsert(cfg, docs, progress, atomic=atomic, target=target)
            if report.chunks_written:
                self.replan_index(name)
        return report

    def upsert_batch(self, name: str, docs: Sequence[SourceDocument]) -> IngestReport:
        """One batch of an ingestion job: written as :meth:`upsert` does, the index re-planned by the caller.

        The write lock is held for this batch only, so REST writes to the collection interleave
        with a long job.
        """
        with self._writing(name):
            cfg, target = self._write_target(name)
            return self.ingestor.upsert(cfg, docs, target=target)

    def upsert_stream(
        self,
        name: str,
        docs: Iterable[SourceDocument],
        progress: Progress | None = None,
        *,
        stop: Callable[[], bool] | None = None,
        seen: set[str] | None = None,
        vectors: Precomputed | None = None,
    ) -> IngestReport:
        """Insert or replace a stream of documents batch by batch, then re-plan the index.

        See :meth:`indexing.pipeline.Ingestor.upsert_stream` (``vectors``: embedded elsewhere,
        the Ray engine's).
        """
        with self._writing(name):
            cfg, target = self._write_target(name)  # the live version's store collection, model and chunking
            report = self.ingestor.upsert_stream(cfg, docs, progress, stop=stop, seen=seen, vectors=vectors,
                                                 target=target)
            if report.chunks_written:
                self.replan_index(name)
        return report

    def get_document(self, name: str, document_id: str) -> dict[str, Any]:
        """A stored document rebuilt from its chunks (see :mod:`indexing.documents`).

        Raises:
            CollectionNotFound: No such collection.
            NotFound: No such document.
        """
        from indexing.documents import get_document

        overlap = live_config(self.get_collection(name), self.live_version(name)).chunk_overlap
        return get_document(self.docstore, name, document_id, overlap)

    def list_documents(
        self, name: str, *, cursor: str | None = None, limit: int = 100
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of stored documents in id order, and the cursor of the next page (``None``: last).

        Raises:
            CollectionNotFound: No such collection.
        """
        from indexing.documents import list_documents

        self.get_collection(name)
        return list_documents(self.docstore, name, cursor=cursor, limit=limit)

    def delete_documents(self, name: str, document_ids: Sequence[str]) -> IngestReport:
        """Delete documents by id from both channels."""
        with self._writing(name):
            cfg, target = self._write_target(name)
            return self.ingestor.delete(cfg, document_ids, target)

    def delete_where(self, name: str, filters: Mapping[str, Any]) -> IngestReport:
        """Delete the documents whose metadata matches ``filters`` (the search filter form), from both channels.

        The documents are found in the docstore (each one's ``document_id`` and metadata, read
        a page at a time) and deleted as :meth:`delete_documents` does, under the collection's
        write lock (a document written meanwhile is not missed half-way).

        Raises:
            CollectionNotFound: No such collection.
            InvalidRequest: ``filters`` is empty (delete a collection's documents by dropping it).
            InvalidFilter: See :func:`stores.filters.parse_filter`.
        """
        if not filters:
            raise InvalidRequest("a delete by filter needs a non-empty filter")
        with self._writing(name):
            cfg, flt = self._target(name, filters)
            assert flt is not None  # a non-empty filter parses to one
            return Quarry.delete_documents(self, name, self._matching_ids(name, flt))  # stored ids as they are

    def _matching_ids(self, name: str, flt: Filter, prefix: str = "") -> list[str]:
        """Stored ids (those starting with ``prefix``, one key range) whose document metadata ``flt`` matches."""
        found: list[str] = []
        after = prefix
        while True:
            page = self.docstore.list_documents(name, after=after, limit=1000)
            for doc in page:
                if not doc.document_id.startswith(prefix):
                    return found
                if matches(flt, {**(doc.metadata or {}), "document_id": doc.document_id}):
                    found.append(doc.document_id)
            if len(page) < 1000:
                return found
            after = page[-1].document_id

    # --- versions and reindex (indexing/versions.py, indexing/reindex.py) ---------------------
    def live_version(self, name: str) -> CollectionVersion:
        """The version serving ``name`` (a collection made before versions becomes version 1).

        Raises:
            CollectionNotFound: No such collection.
        """
        state = self.docstore.collection_state(name)
        if state is None:
            raise CollectionNotFound(name)
        cached = self._versions.get((name, state.live_version)) if state.live_version else None
        if cached is not None:
            return cached
        with self._writing(name):
            cfg = self.get_collection(name)
            version = ensure_live(self.docstore, cfg, self._url_of(cfg.embedding_fingerprint))
        self._versions[(name, version.version)] = version
        return version

    def _url_of(self, fingerprint: str | None) -> str | None:
        """The service's model URL when ``fingerprint`` is its embedder's (or unknown), else ``None``."""
        mine = _fingerprint(self.embedder)
        return self.settings.embedding.url if fingerprint is None or not mine or fingerprint == mine else None

    def _model_for(self, version: CollectionVersion) -> tuple[Embedder, QueryEncoder]:
        """The embedder and query encoder of ``version``'s model, chosen by fingerprint.

        The service's own model when the fingerprints agree, when either is unknown (a remote
        model not yet reached), or when the version's URL is the service's own (then the
        ingestor's and the searcher's model checks refuse a model that computes other vectors);
        else the model at the version's URL, opened once and checked.

        Raises:
            ModelMismatch: The version's model cannot be opened, or computes something else.
        """
        mine = _fingerprint(self.embedder)
        wanted = version.model_fingerprint
        if not wanted or not mine or wanted == mine or version.model_name in (None, self.settings.embedding.url):
            return self.embedder, self.query_embedder  # the service's model (the model checks refuse another)
        with self._models_guard:
            known = self._models.get(wanted)
            if known is not None:
                return known
            if not version.model_name:
                raise ModelMismatch(version.physical_name, "unknown", self.embedder.model_id,
                                    stored_fingerprint=wanted, current_fingerprint=mine)
            return self._open_model(version.model_name, wanted)

    def _open_model(self, url: str, fingerprint: str | None = None) -> tuple[Embedder, QueryEncoder]:
        """Open (and warm) the model at ``url``; keep it by fingerprint (caller holds ``_models_guard``)."""
        model = open_embedder(url, self.settings)
        model.warm_up()
        if fingerprint is not None and model.fingerprint != fingerprint:
            raise ModelMismatch(url, url, model.model_id, stored_fingerprint=fingerprint,
                                current_fingerprint=model.fingerprint)
        pair: tuple[Embedder, QueryEncoder] = (model, BatchingEmbedder(model))
        self._models[model.fingerprint] = pair
        return pair

    def register_model(self, url: str, model: Embedder) -> None:
        """Use ``model`` (warmed up here) for versions whose fingerprint is its own, as if opened from ``url``."""
        model.warm_up()
        with self._models_guard:
            self._models[model.fingerprint] = (model, BatchingEmbedder(model))
            self._model_urls[url] = model.fingerprint

    def _dense_target(self, cfg: CollectionConfig, mode: Mode) -> tuple[CollectionConfig, DenseTarget | None]:
        """The live version's config view and, unless BM25 only, its store collection and query model."""
        live = self.live_version(cfg.name)
        view = live_config(cfg, live)
        if mode == "bm25":
            return view, None
        return view, DenseTarget(live.physical_name, self._model_for(live)[1])

    def _write_target(self, name: str) -> tuple[CollectionConfig, Target]:
        live = self.live_version(name)
        return live_config(self.get_collection(name), live), Target(live.physical_name, self._model_for(live)[0])

    def reindex(
        self,
        name: str,
        *,
        model: str | None = None,
        index: str | IndexSpec | None = None,
        chunk_size: int | None = None,
        chunk_overlap: int | None = None,
        progress: Callable[[int, int], None] | None = None,
        job_id: str | None = None,
        owner: str | None = None,
    ) -> ReindexReport:
        """Build the next version of ``name`` from the docstore, verify it and swap it in.

        Args:
            name: The collection.
            model: Another embedding model's URL (re-embeds everything); ``None`` keeps the live one's.
            index: ``auto`` / ``None`` (the planner's choice for the current size), an index kind,
                or a whole :class:`~stores.base.IndexSpec`.
            chunk_size: Re-chunk to this cap in text tokens (``None``: the live version's); the new
                version gets chunks rows of its own (:mod:`indexing.reindex`).
            chunk_overlap: The new overlap (``None``: the live version's, which must then be
                below ``chunk_size``).
            progress: Called with ``(chunks done, total)`` (re-chunking: ``total`` estimated).
            job_id: The job to record progress and the outcome in.
            owner: The lease owner (a caller that took the lease already passes its id).

        Raises:
            CollectionNotFound: No such collection.
            InvalidRequest: A chunk size under 8 or an overlap not in ``[0, chunk_size)``.
            ReindexRunning: Another reindex of it holds the lease.
            ReindexFailed: Verification failed, or a document has no stored text to re-chunk;
                the live version serves.
        """
        cfg = self.get_collection(name)
        chunking = _chunking_asked(live_config(cfg, self.live_version(name)), chunk_size, chunk_overlap)
        owner = owner or new_owner()
        self.reindexer.acquire(name, owner)
        try:
            live = self.live_version(name)
            embedder, url = self._reindex_model(live, model)
            embedder.warm_up()  # its dim and fingerprint (a fresh process, `quarry reindex`, had neither: dim 0)
            same = bool(embedder.fingerprint) and embedder.fingerprint == live.model_fingerprint
            plan = self._plan(self.docstore.counts(name)[1], embedder.dim)
            spec = index if isinstance(index, IndexSpec) else _index_spec(index, plan)
            build = Build(live_config(cfg, live), live, embedder, url, same, spec, chunking)
            report = self.reindexer.run(build, owner, self._job_progress(job_id, progress))
            self._record_model(name, embedder, self.live_version(name))
            self.bm25.invalidate(name)  # a new chunking: the BM25 index is rebuilt from its rows now
            if job_id is not None:
                self.docstore.update_job(job_id, state="done", counters=_counters(report))
            return report
        except Exception as exc:
            if job_id is not None:
                self.docstore.update_job(job_id, state="failed", error=str(exc))
            raise
        finally:
            self.docstore.release_lease(f"reindex:{name}", owner)

    def _reindex_model(self, live: CollectionVersion, url: str | None) -> tuple[Embedder, str | None]:
        if url is None:
            return self._model_for(live)[0], live.model_name
        with self._models_guard:
            fingerprint = self._model_urls.get(url)
            if fingerprint is not None and fingerprint in self._models:
                return self._models[fingerprint][0], url
            if url == self.settings.embedding.url:
                self.embedder.warm_up()
                return self.embedder, url
            return self._open_model(url)[0], url

    def _record_model(self, name: str, embedder: Embedder, version: CollectionVersion) -> None:
        """Around a swap: the config names ``version``'s model, index and chunking (``list``, version 1)."""
        with self._writing(name):
            cfg = self.get_collection(name)
            dim = version.dim or embedder.dim  # the version's own record first: a cold model says 0
            if dim <= 0:
                raise EmbeddingError(f"collection {clip(name)}: the model of version {version.version} "
                                     "has no known dimension; nothing was changed")
            cfg.embedding_model, cfg.embedding_fingerprint, cfg.dim = (
                embedder.model_id, embedder.fingerprint or version.model_fingerprint, dim)
            cfg.index = {**cfg.index, **version.index_plan}
            size, overlap = version.chunking.get("chunk_size"), version.chunking.get("chunk_overlap")
            if isinstance(size, int) and isinstance(overlap, int):
                cfg.chunk_size, cfg.chunk_overlap = size, overlap
            self.docstore.put_collection(name, cfg.to_json())

    def _job_progress(
        self, job_id: str | None, progress: Callable[[int, int], None] | None
    ) -> Callable[[int, int], None] | None:
        if job_id is None:
            return progress

        def both(done: int, total: int) -> None:
            self.docstore.update_job(job_id, state="running", counters={"done": done, "total": total})
            if progress is not None:
                progress(done, total)

        return both

    def start_reindex(  # noqa: PLR0913 - the request's fields and who asks
        self, name: str, *, model: str | None = None, index: str | None = None, trigger: str = "api",
        reason: str = "", owner: str | None = None, chunk_size: int | None = None, chunk_overlap: int | None = None,
    ) -> Job:
        """Take the lease now and run :meth:`reindex` in a background thread; returns its job.

        Args:
            name: The collection.
            model: See :meth:`reindex`.
            index: See :meth:`reindex`.
            chunk_size: See :meth:`reindex` (checked here, before the job starts).
            chunk_overlap: See :meth:`reindex`.
            trigger: Who asked (``api``, or a trigger of :mod:`quarry.scheduler`), kept in the
                job's ``params`` with ``reason`` and ``by`` (the lease owner).
            reason: Why.
            owner: A lease owner that holds the collection's lease already (the scheduler).

        Raises:
            CollectionNotFound: No such collection.
            InvalidRequest: See :meth:`reindex`.
            ReindexRunning: Another reindex of it holds the lease.
        """
        _chunking_asked(live_config(self.get_collection(name), self.live_version(name)), chunk_size, chunk_overlap)
        if owner is None:
            owner = new_owner()
            self.reindexer.acquire(name, owner)
        params = {"model": model, "index": index, "trigger": trigger, "reason": reason, "by": owner,
                  "chunk_size": chunk_size, "chunk_overlap": chunk_overlap}
        try:
            job = self.docstore.create_job("reindex", collection=name, params=params)
        except BaseException:
            self.docstore.release_lease(f"reindex:{name}", owner)
            raise

        def work() -> None:
            try:
                self.reindex(name, model=model, index=index, job_id=job.id, owner=owner,
                             chunk_size=chunk_size, chunk_overlap=chunk_overlap)
            except Exception:  # recorded in the job
                log.exception("reindex job %s of %r failed", job.id, name)

        threading.Thread(target=work, name=f"reindex-{name}", daemon=True).start()
        return job

    def get_job(self, job_id: str) -> Job:
        """A job's state, progress counters and error.

        Raises:
            NotFound: No such job, or another tenant's (the same answer: ids never reveal a
                job of someone else).
        """
        from quarry.tenancy import SHARED

        job = self.docstore.get_job(job_id)
        mine = (self.tenant_id, SHARED) if self.tenant_id == DEFAULT_TENANT else (self.tenant_id,)
        if job is None or job.tenant_id not in mine:  # the operator's tenant runs the shared collections' jobs
            raise NotFound(f"job {clip(job_id)} does not exist")
        return job

    def rollback(self, name: str) -> ReindexReport:
        """Swap back to the most recent retired version still kept.

        Raises:
            CollectionNotFound: No such collection.
            Conflict: No retired version is kept (409: the collection is in no state to roll back).
            ReindexRunning: A reindex of it holds the lease.
        """
        self.get_collection(name)
        owner = new_owner()
        self.reindexer.acquire(name, owner)
        try:
            target = self.reindexer.rollback_target(name)
            if target is None:
                raise Conflict(f"collection {clip(name)} keeps no earlier version to roll back to")
            live = self.live_version(name)
            embedder = self._model_for(target)[0]
            embedder.warm_up()  # its dim and fingerprint: a fresh process (`quarry rollback`) had neither
            same = bool(embedder.fingerprint) and embedder.fingerprint == live.model_fingerprint
            build = Build(live_config(self.get_collection(name), live), live, embedder, target.model_name, same, None)
            report = self.reindexer.rollback(build, target, lambda: self._record_model(name, embedder, target))
            self.bm25.invalidate(name)  # back to the target's chunking: its BM25 index
            return report
        finally:
            self.docstore.release_lease(f"reindex:{name}", owner)

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
        cfg, target = self._dense_target(cfg, mode)
        return self.searcher.search(
            cfg, query, top_k=top_k, mode=mode, flt=flt, offset=offset, group=group, rerank=rerank,
            dense_timeout_s=dense_timeout_s, fusion=fusion, min_score=min_score, target=target,
            within=self._bm25_within(),
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
        """:meth:`search` without rerank, for an event loop (see ``Searcher.search_async``).

        The collection's configuration and live version come from the docstore's caches on the
        loop; after a commit they are read again in a worker thread (``off_loop``).
        """
        cfg, flt, target = await off_loop(self._search_target, name, filters, mode)
        return await self.searcher.search_async(
            cfg, query, top_k=top_k, mode=mode, flt=flt, offset=offset, group=group, fusion=fusion,
            min_score=min_score, target=target, within=self._bm25_within(),
        )

    def _search_target(
        self, name: str, filters: Mapping[str, Any] | None, mode: Mode
    ) -> tuple[CollectionConfig, Filter | None, DenseTarget | None]:
        cfg, flt = self._target(name, filters)
        cfg, target = self._dense_target(cfg, mode)
        return cfg, flt, target

    # --- recall monitoring -------------------------------------------------------------
    def recall(self, name: str) -> dict[str, Any]:
        """Recent recall figures of a collection's sampled searches (see ``RecallMonitor.figures``).

        Raises:
            CollectionNotFound: No such collection.
        """
        self.get_collection(name)
        return self.monitor.figures(name)

    def check_recall(self, name: str, queries: int) -> Any:
        """Measure recall@k now on ``queries`` queries (see :func:`monitoring.check.check_recall`).

        Raises:
            CollectionNotFound: No such collection.
            InvalidRequest: ``queries < 1``.
        """
        from monitoring.check import check_recall

        return check_recall(self, name, queries)

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
        flt = parse_filter(filters, self._filter_schema(cfg), limits)
        if flt is not None:
            flt = self._stored_filter(cfg, flt)
        check = getattr(self.store, "check_filter", None)  # an engine's own limits (Milvus Lite's strings)
        if flt is not None and check is not None:
            check(flt)  # here, so that every mode, BM25 included, answers the same
        return cfg, flt

    def _filter_schema(self, cfg: CollectionConfig) -> Mapping[str, FieldType]:
        """The fields a filter may name: the collection's (a shared one's: the caller's own, :mod:`quarry.shared`)."""
        return cfg.schema_

    def _stored_filter(self, cfg: CollectionConfig, flt: Filter) -> Filter:
        """``flt`` in the names the stores hold (a shared collection's: the caller's stored ids and keys)."""
        return flt

    def _bm25_within(self) -> str | None:
        """The rows whose statistics BM25 scores with (a shared collection's: the caller's, :mod:`quarry.shared`)."""
        return None


def _fingerprint(model: Embedder) -> str:
    """A model's fingerprint, or ``""`` while it is unknown (a remote model not yet reached)."""
    try:
        return model.fingerprint
    except Exception:  # noqa: BLE001 - unknown until warm: the searcher's model check decides
        return ""


def _chunking_asked(cfg: CollectionConfig, size: int | None, overlap: int | None) -> dict[str, int] | None:
    """The chunking a reindex asks for (``None``: the live one, ``cfg``'s); checked.

    Raises:
        InvalidRequest: ``size`` under 8, or the overlap (``overlap``, else the live one's) not
            in ``[0, size)``.
    """
    if size is None and overlap is None:
        return None
    size = cfg.chunk_size if size is None else size
    if size < MIN_CHUNK_SIZE:
        raise InvalidRequest(f"chunk_size must be >= {MIN_CHUNK_SIZE} text tokens, got {size}")
    if overlap is None:
        overlap = cfg.chunk_overlap
        if overlap >= size:
            raise InvalidRequest(f"chunk_size {size} is not above the collection's overlap {overlap}: "
                                 "give a chunk_overlap below it too")
    if not 0 <= overlap < size:
        raise InvalidRequest(f"chunk_overlap must be >= 0 and < chunk_size ({size}), got {overlap}")
    return {"chunk_size": size, "chunk_overlap": overlap}


MIN_CHUNK_SIZE = 8  # as QUARRY_INGEST__CHUNK_SIZE and the API's chunk_size


def _counters(report: ReindexReport) -> dict[str, int]:
    return {"version": report.version, "previous": report.previous, "done": report.chunks, "total": report.chunks,
            "copied": report.copied, "embedded": report.embedded, "replayed": report.replayed}


def _index_spec(kind: str | None, plan: IndexPlan) -> IndexSpec | None:
    """The index a reindex asks for: ``None``/``auto`` is the planner's, a kind its own defaults or the plan's."""
    if kind is None or kind.lower() == "auto":
        return None
    wanted = kind.upper()
    if wanted == plan.spec.kind:
        return plan.spec
    return IndexSpec(wanted, plan.spec.metric)  # type: ignore[arg-type]  # the store checks the kind


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
