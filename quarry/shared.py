"""Shared collections: one collection for every tenant, each tenant seeing its own documents only.

A shared collection (``POST /v1/collections {"tenancy": "shared"}``, by an admin key of the
operator's tenant ``default``) lives in the state of record under the tenant
:data:`~quarry.tenancy.SHARED` and in the vector store as ``t__shared__<name>``: one BM25 index,
one vector collection, one change log for all tenants. A request naming it gets
:meth:`Quarry.for_collection <quarry.service.Quarry.for_collection>`'s :class:`ScopedQuarry`, which
enforces the key's tenant ``T`` below the handlers, on every path:

* **Writes**: each document is stored as ``T/<id>`` with ``tenant_id: T`` in its metadata, so
  two tenants' ``d1`` never collide (the documents table is keyed by collection and id: no
  migration). A document that sets ``tenant_id`` itself is refused (400 ``InvalidDocument``),
  not silently overwritten: the caller learns the field is the server's, and a client that tries
  to write into another tenant is told so rather than believed.
* **Reads**: every search (BM25, dense, hybrid, rerank, the answer path) runs with
  ``tenant_id == T`` AND-ed to the caller's filter, inside both channels (the BM25 channel tests
  payloads, the store compiles it like any filter), and so do the recall monitor's exact re-runs
  (they repeat the search's filter). BM25 scores with the tenant's own N, avgdl and df
  (:meth:`_bm25_within`): another tenant's documents never move its scores. A caller's filter
  that names ``tenant_id`` anywhere is refused (403 ``Forbidden``): it can neither remove nor
  widen the scope. Hits, documents and
  listings show ids without ``T/`` and metadata without ``tenant_id``; describe counts the
  tenant's documents, chunks and vectors, and shows no index plan (:func:`tenant_view`). The
  semantic cache keys entries by ``T``.
* **Metadata schemas**: each tenant has its own (``tenant_schemas: true``, every shared
  collection made since 2026-12-03). Tenant ``T``'s field ``price`` is stored under the payload
  key ``T__m_price`` (:func:`stored_field`) in the docstore, the BM25 payloads and the vector
  store, so the collection's one physical schema (``schema`` in its configuration) holds every
  tenant's keys apart: two tenants' ``price`` may hold different types, and the first to write
  a field fixes its type for itself only. ``T``'s filters are checked against ``T``'s own schema
  (:func:`tenant_schema`: a field only another tenant wrote is unknown, the same 400 as in an
  own collection, and the error lists ``T``'s fields only) and rewritten to the stored keys
  before either channel compiles them; hits, documents, listings, describe and the errors of
  a write show ``T``'s names. A shared collection made before (``tenant_schemas: false``)
  keeps one schema for every tenant.
* **By id**: get and delete address ``T/<id>`` only; another tenant's id is the same answer as a
  missing one (get: 404; delete: ``deleted: 0``), never a read or a delete of it.
* **Admin**: drop, reindex, rollback and recall figures (aggregates of every tenant's searches)
  are the operator's (tenant ``default``); any other tenant's key gets 403.

Fails closed: a scope whose tenant is empty or malformed is a 403, never an unfiltered view.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from indexing.collections import BUILTIN_FIELDS, CollectionConfig, FusionConfig
from indexing.docstore import DEFAULT_TENANT
from indexing.pipeline import IngestReport, Progress
from indexing.sources import SourceDocument
from indexing.versions import live_config
from quarry.errors import CollectionNotFound, Conflict, Forbidden, InvalidDocument, InvalidFilter, NotFound, clip
from quarry.service import Quarry
from quarry.tenancy import TENANT_FIELD, TENANT_ID
from retrieval.search import Hit, SearchResult
from indexing.text import Language
from stores.filters import And, Eq, FieldType, Filter, In, Ne, Nin, Or, Prefix

log = logging.getLogger(__name__)

MAX_STORED_METADATA_BYTES = 48 * 1024
"""Most bytes of a chunk's metadata as stored, as JSON (clients may send 32 KiB: ``indexing.sources``)."""
FIELD_MARK = "__m_"
"""Between the tenant and the field name in a stored metadata key (:func:`stored_field`)."""


def stored_field(tenant_id: str, field: str) -> str:
    """The payload key of tenant ``tenant_id``'s metadata field ``field`` in a shared collection.

    ``<tenant>__m_<field>`` (at most 32 + 4 + 64 characters: :data:`stores.filters.PAYLOAD_KEY`).
    Two tenants' keys are never equal: a tenant id holds no ``__`` (``quarry.api.keys.TENANT``), so
    the first ``__`` of a key ends its tenant; nor equal to a server field (``document_id``,
    ``tenant_id``: no ``__``).
    """
    return f"{tenant_id}{FIELD_MARK}{field}"


def tenant_schema(cfg: CollectionConfig, tenant_id: str) -> dict[str, FieldType]:
    """The metadata schema tenant ``tenant_id`` sees of shared collection ``cfg``: its own fields only.

    ``document_id`` plus every field this tenant wrote, by the name it wrote; a collection
    without per-tenant schemas (``tenant_schemas: false``, made before them) has one schema for all.
    """
    if not cfg.tenant_schemas:
        return dict(cfg.schema_)
    mine = stored_field(tenant_id, "")
    own = {key.removeprefix(mine): kind for key, kind in cfg.schema_.items() if key.startswith(mine)}
    return {**BUILTIN_FIELDS, **own}


def tenant_view(cfg: CollectionConfig, tenant_id: str) -> CollectionConfig:
    """``cfg`` as tenant ``tenant_id`` sees it; any other collection unchanged.

    Its own schema (:func:`tenant_schema`), and, for any tenant but the operator's, no ``index``
    record: the planner's plan is sized by every tenant's vectors (``reason: "3 vectors < 20,000"``,
    ``planned_for_vectors``, ``estimated_bytes``, even the kind it chose), so it told a tenant how
    much the others store.
    """
    if cfg.tenancy != "shared":
        return cfg
    update: dict[str, Any] = {}
    if cfg.tenant_schemas:
        update["schema_"] = tenant_schema(cfg, tenant_id)
    if tenant_id != DEFAULT_TENANT:
        update["index"] = {}
    return cfg.model_copy(update=update) if update else cfg


def create_shared(  # noqa: PLR0913 - create_collection's fields
    q: Quarry, name: str, *, language: Language, chunk_size: int | None, chunk_overlap: int | None,
    exist_ok: bool, fusion: FusionConfig | None,
) -> CollectionConfig:
    """Create shared collection ``name`` (``q`` is the asking tenant's view).

    Raises:
        Forbidden: ``q``'s tenant is not the operator's (``default``).
        Conflict: Some tenant has a collection of its own named ``name``.
        CollectionExists: A shared collection is named so (unless ``exist_ok``).
    """
    if q.tenant_id != DEFAULT_TENANT:
        raise Forbidden(
            f"only the operator's tenant ({DEFAULT_TENANT!r}) creates shared collections; tenant "
            f"{clip(q.tenant_id)} may create its own", reason="tenant",
        )
    for tenant, _ in q.docstore.list_tenants():
        if q.docstore.for_tenant(tenant).collection_config(name) is not None:
            raise Conflict(f"tenant {tenant!r} has a collection named {clip(name)}: pick another shared name")
    shared = q.shared_view()
    with shared._writing(name):
        cfg = shared.create_collection(
            name, language=language, chunk_size=chunk_size, chunk_overlap=chunk_overlap, exist_ok=exist_ok,
            fusion=fusion,
        )
        if cfg.tenancy != "shared":  # made now (an existing one keeps its schemas as they are)
            cfg.tenancy = "shared"
            cfg.tenant_schemas = True
            shared.docstore.put_collection(name, cfg.to_json())
    return tenant_view(cfg, q.tenant_id)


def scoped(shared: Quarry, tenant_id: str) -> ScopedQuarry:
    """The shared collections as tenant ``tenant_id`` sees them (see the module doc).

    Raises:
        Forbidden: ``tenant_id`` is empty or not a tenant id (fails closed).
    """
    return ScopedQuarry(shared, tenant_id)


def refuse_tenant_field(raw: Any, path: str = "filters") -> None:
    """Refuse a JSON filter naming :data:`~quarry.tenancy.TENANT_FIELD` anywhere (in ``$and``/``$or`` too).

    Raises:
        Forbidden: It does.
    """
    if isinstance(raw, Mapping):
        for key, value in raw.items():
            if key == TENANT_FIELD:
                raise Forbidden(
                    f"{path} names {TENANT_FIELD!r}: in a shared collection the server scopes every request to "
                    "the API key's tenant; a filter can narrow that scope, never name or widen it",
                    reason="tenant",
                )
            refuse_tenant_field(value, path)
    elif isinstance(raw, list):
        for item in raw:
            refuse_tenant_field(item, path)


class ScopedQuarry(Quarry):
    """The shared collections' view (:meth:`Quarry.shared_view`) scoped to one tenant.

    Shares every part of the shared view (store, docstore, BM25, monitor, write locks); only
    the methods below differ, each adding the tenant to what it asks and taking it out of
    what it answers.
    """

    def __init__(self, shared: Quarry, tenant_id: str) -> None:  # noqa: D107 - see scoped()
        if not tenant_id or not TENANT_ID.fullmatch(tenant_id) or "__" in tenant_id:  # see stored_field
            raise Forbidden(f"tenant {clip(tenant_id)} cannot be scoped: refusing an unscoped request",
                            reason="tenant")
        self.__dict__.update(shared.__dict__)
        self.tenant_id = tenant_id
        self.scope = Eq(TENANT_FIELD, tenant_id)
        self.prefix = f"{tenant_id}/"
        self.fields = stored_field(tenant_id, "")
        self._tenant_schemas: dict[str, bool] = {}  # this request's collections: per-tenant schemas or not

    # --- ids -----------------------------------------------------------------------------
    def _qualify(self, document_id: str) -> str:
        return self.prefix + document_id

    def _mine(self, stored_id: str) -> bool:
        return stored_id.startswith(self.prefix)

    def _own_ids(self, name: str, limit: int | None = None, after: str = "", page: int = 1000) -> list[str]:
        """This tenant's stored ids (qualified) after ``after`` (unqualified), in order: one key range.

        Read ``page`` ids at a time, stopping at the first id past the range: reading to the end
        (``limit=None``) read every later tenant's ids too, so a describe by tenant ``aa`` of a
        shared collection holding 3,000 documents of ``tb`` read 3,000 ids to count none.
        """
        found: list[str] = []
        cursor = self.prefix + after
        while limit is None or len(found) < limit:
            size = page if limit is None else min(page, limit - len(found))
            ids = self.docstore.document_ids(name, after=cursor, limit=size)
            mine = [i for i in ids if self._mine(i)]  # the range is contiguous: the rest are later tenants'
            found.extend(mine)
            if len(mine) < len(ids) or len(ids) < size:
                break
            cursor = ids[-1]
        return found

    def _own_schema(self, name: str) -> bool:
        """Whether collection ``name`` keeps a schema per tenant (read once per request)."""
        if name not in self._tenant_schemas:
            self._tenant_schemas[name] = self.get_collection(name).tenant_schemas
        return self._tenant_schemas[name]

    def _document(self, doc: SourceDocument, own: bool) -> SourceDocument:
        """``doc`` as stored: id ``T/<id>``, ``tenant_id: T``, and (``own``: per-tenant schemas) keys ``T__m_<f>``."""
        if TENANT_FIELD in doc.metadata or any(TENANT_FIELD in s.metadata for s in doc.sections):
            # a section's metadata overrides the document's in its chunks' payloads
            # (indexing.pipeline.plan_chunks): in a collection of one schema its tenant_id was B's scope
            raise InvalidDocument(
                f"document {clip(doc.id)}: metadata field {TENANT_FIELD!r} is set by the server in a shared "
                "collection (from the API key's tenant); leave it out"
            )
        if not own:
            meta = {**doc.metadata, TENANT_FIELD: self.tenant_id}
            return dataclasses.replace(doc, id=self._qualify(doc.id), metadata=meta)
        meta = {**self._stored(doc.metadata), TENANT_FIELD: self.tenant_id}
        sections = tuple(dataclasses.replace(s, metadata=self._stored(s.metadata)) for s in doc.sections)
        largest = max((_json_bytes({**meta, **s.metadata}) for s in sections), default=_json_bytes(meta))
        if largest > MAX_STORED_METADATA_BYTES:  # each key grew by len(self.fields): Milvus holds 64 KiB of JSON
            raise InvalidDocument(
                f"document {clip(doc.id)}: its metadata is {largest:,} bytes as stored in a shared collection (each "
                f"field name carries the tenant); the limit is {MAX_STORED_METADATA_BYTES:,}: use fewer fields"
            )
        return dataclasses.replace(doc, id=self._qualify(doc.id), metadata=meta, sections=sections)

    def _stored(self, meta: Mapping[str, Any]) -> dict[str, Any]:
        return {self.fields + key: value for key, value in meta.items()}

    def _shown(self, meta: Mapping[str, Any], own: bool) -> dict[str, Any]:
        """Stored metadata as this tenant wrote it: its own keys by their names, no ``tenant_id``.

        With per-tenant schemas (``own``), a key of another tenant (never in this tenant's
        documents) is left out rather than shown.
        """
        if not own:
            return {k: v for k, v in meta.items() if k != TENANT_FIELD}
        shown = {}
        for key, value in meta.items():
            if key.startswith(self.fields):
                shown[key.removeprefix(self.fields)] = value
            elif FIELD_MARK not in key and key != TENANT_FIELD:  # the server's (document_id)
                shown[key] = value
        return shown

    def _own_text(self, text: str) -> str:
        """A message of the pipeline or the store in the caller's names (ids without ``T/``, keys without ``T__m_``)."""
        for quote in ("'", '"'):
            text = text.replace(quote + self.prefix, quote)
        return text.replace(self.fields, "")

    @contextmanager
    def _own_messages(self) -> Iterator[None]:
        """Errors about documents and filters raised inside, in the caller's names (:meth:`_own_text`)."""
        try:
            yield
        except (InvalidDocument, InvalidFilter) as exc:
            exc.message = self._own_text(exc.message)
            exc.args = (exc.message,)
            raise

    def _hit(self, hit: Hit, own: bool) -> Hit | None:
        if not self._mine(hit.document_id) or hit.metadata.get(TENANT_FIELD) != self.tenant_id:
            log.error("shared collection hit outside tenant %s's scope dropped", self.tenant_id)
            return None
        meta = self._shown(hit.metadata, own)
        explain = {  # each channel's chunk id too: the caller's ids everywhere, never the stored T/ ones
            k: {**v, "chunk_id": v["chunk_id"].removeprefix(self.prefix)}
            if isinstance(v, dict) and isinstance(v.get("chunk_id"), str) else v
            for k, v in hit.explain.items()
        }
        return dataclasses.replace(
            hit, document_id=hit.document_id.removeprefix(self.prefix),
            chunk_id=hit.chunk_id.removeprefix(self.prefix), metadata=meta, explain=explain,
        )

    def _result(self, name: str, result: SearchResult) -> SearchResult:
        own = self._own_schema(name)
        result.hits = [h for h in (self._hit(hit, own) for hit in result.hits) if h is not None]
        result.degraded = [self._own_text(reason) for reason in result.degraded]  # a channel's error, in its names
        return result

    def _owner(self, name: str, action: str) -> None:
        if self.tenant_id != DEFAULT_TENANT:
            self.get_collection(name)  # 404 first for a name that is not there
            raise Forbidden(
                f"collection {clip(name)} is shared by every tenant; only the operator's tenant "
                f"({DEFAULT_TENANT!r}) may {action} it", reason="tenant",
            )

    # --- reads ---------------------------------------------------------------------------
    def _target(self, name: str, filters: Mapping[str, Any] | None) -> tuple[CollectionConfig, Filter | None]:
        """The caller's filter AND this tenant: narrower than the scope, never wider.

        Raises:
            Forbidden: The caller's filter names ``tenant_id``.
        """
        refuse_tenant_field(filters)
        with self._own_messages():  # an engine's limits (Milvus Lite's strings) name the stored keys
            cfg, flt = super()._target(name, filters)
        self._tenant_schemas[name] = cfg.tenant_schemas
        return cfg, self.scope if flt is None else And((self.scope, flt))

    def _filter_schema(self, cfg: CollectionConfig) -> Mapping[str, FieldType]:
        """This tenant's own fields (:func:`tenant_schema`): another tenant's field is an unknown one."""
        return tenant_schema(cfg, self.tenant_id)

    def _stored_filter(self, cfg: CollectionConfig, flt: Filter) -> Filter:
        """``flt`` on the stored ids (``T/<id>``) and, with per-tenant schemas, the stored keys (``T__m_<f>``)."""
        return _qualified(flt, self.prefix, self.fields if cfg.tenant_schemas else "")

    def _bm25_within(self) -> str:
        """This tenant's rows (``T/<id>``): BM25's N, avgdl and df are its own, never moved by other tenants'."""
        return self.prefix

    def _matching_ids(self, name: str, flt: Filter, prefix: str = "") -> list[str]:
        return super()._matching_ids(name, flt, self.prefix)  # this tenant's key range, whatever is asked

    def search(self, name: str, query: str, **kwargs: Any) -> SearchResult:
        """:meth:`Quarry.search` within the tenant (see the module doc)."""
        with self._own_messages():  # a store's filter errors name the stored keys
            result = super().search(name, query, **kwargs)
        return self._result(name, result)

    async def search_async(self, name: str, query: str, **kwargs: Any) -> SearchResult:
        """:meth:`Quarry.search_async` within the tenant."""
        with self._own_messages():
            result = await super().search_async(name, query, **kwargs)
        return self._result(name, result)

    def describe(self, name: str) -> dict[str, Any]:
        """Configuration (with this tenant's own schema) plus this tenant's document, chunk and vector counts."""
        cfg = self.get_collection(name)
        live = self.live_version(name)
        ids = self._own_ids(name)
        chunks = sum(len(c) for c in self.docstore.chunk_ids_of(name, ids).values())
        return {
            **tenant_view(live_config(cfg, live), self.tenant_id).to_json(), "documents": len(ids), "chunks": chunks,
            "vectors": self.store.count(live.physical_name, self.scope), "live_version": live.version,
            "versions": [],  # the physical versions are the operator's business
        }

    def get_document(self, name: str, document_id: str) -> dict[str, Any]:
        """This tenant's document ``document_id`` (another tenant's is a 404 like a missing one).

        Raises:
            CollectionNotFound: No such collection.
            NotFound: This tenant has no such document.
        """
        try:
            doc = super().get_document(name, self._qualify(document_id))
        except CollectionNotFound:
            raise
        except NotFound:  # its message names the stored id; this one the caller's
            raise NotFound(f"collection {clip(name)} has no document {clip(document_id)}") from None
        own = self._own_schema(name)
        doc["id"] = document_id
        doc["metadata"] = self._shown(doc["metadata"], own)
        for chunk in doc["chunks"]:
            chunk["id"] = chunk["id"].removeprefix(self.prefix)
            chunk["metadata"] = self._shown(chunk["metadata"], own)
        return doc

    def list_documents(
        self, name: str, *, cursor: str | None = None, limit: int = 100
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of this tenant's documents in id order (cursors are its own ids)."""
        from indexing.documents import list_documents

        own = self._own_schema(name)  # CollectionNotFound first
        page, nxt = list_documents(self.docstore, name, cursor=self._qualify(cursor or ""), limit=limit,
                                   prefix=self.prefix)
        for doc in page:
            doc["id"] = doc["id"].removeprefix(self.prefix)
            doc["metadata"] = self._shown(doc["metadata"], own)
        return page, None if nxt is None else nxt.removeprefix(self.prefix)

    # --- writes --------------------------------------------------------------------------
    def upsert(
        self, name: str, docs: Sequence[SourceDocument], progress: Progress | None = None, *, atomic: bool = False
    ) -> IngestReport:
        """:meth:`Quarry.upsert` of this tenant's documents (``tenant_id`` set from the key).

        Raises:
            InvalidDocument: A document sets ``tenant_id``, or a field's type conflicts with this
                tenant's schema (nothing of the batch is written; the message in the caller's names).
        """
        own = self._own_schema(name)
        stored = [self._document(d, own) for d in docs]
        with self._own_messages():
            return super().upsert(name, stored, progress, atomic=atomic)

    def upsert_stream(
        self, name: str, docs: Iterable[SourceDocument], progress: Progress | None = None, *,
        stop: Callable[[], bool] | None = None, seen: set[str] | None = None, vectors: Any = None,
    ) -> IngestReport:
        """:meth:`Quarry.upsert_stream` of this tenant's documents.

        Raises:
            Forbidden: ``vectors`` given (chunks embedded elsewhere, ``--engine ray``): they are keyed
                by the source's ids, not the tenant's stored ones, so a shared collection refuses them.
        """
        if vectors is not None:
            raise Forbidden("a shared collection takes documents, not vectors embedded elsewhere (--engine ray)")
        own = self._own_schema(name)
        with self._own_messages():
            return super().upsert_stream(name, (self._document(d, own) for d in docs), progress, stop=stop, seen=seen)

    def delete_documents(self, name: str, document_ids: Sequence[str]) -> IngestReport:
        """Delete this tenant's documents by id (another tenant's id deletes nothing: ``deleted: 0``)."""
        return super().delete_documents(name, [self._qualify(i) for i in document_ids])

    # --- the operator's ------------------------------------------------------------------
    def drop_collection(self, name: str) -> None:
        """:meth:`Quarry.drop_collection`, the operator's only (403 for other tenants)."""
        self._owner(name, "drop")
        super().drop_collection(name)

    def reindex(self, name: str, **kwargs: Any) -> Any:
        """:meth:`Quarry.reindex`, the operator's only."""
        self._owner(name, "reindex")
        return super().reindex(name, **kwargs)

    def start_reindex(self, name: str, **kwargs: Any) -> Any:
        """:meth:`Quarry.start_reindex`, the operator's only."""
        self._owner(name, "reindex")
        return super().start_reindex(name, **kwargs)

    def rollback(self, name: str) -> Any:
        """:meth:`Quarry.rollback`, the operator's only."""
        self._owner(name, "roll back")
        return super().rollback(name)

    def recall(self, name: str) -> dict[str, Any]:
        """:meth:`Quarry.recall` (figures of every tenant's searches), the operator's only."""
        self._owner(name, "read the recall figures of")
        return super().recall(name)

    def check_recall(self, name: str, queries: int) -> Any:
        """:meth:`Quarry.check_recall`, the operator's only."""
        self._owner(name, "measure the recall of")
        return super().check_recall(name, queries)


def _json_bytes(meta: Mapping[str, Any]) -> int:
    return len(json.dumps(meta, ensure_ascii=False).encode())


def _qualified(flt: Filter, prefix: str, fields: str = "") -> Filter:
    """``flt`` as stored: ``document_id`` values ``T/<id>``, and other fields ``fields + name`` (``T__m_<f>``).

    A filter on ids or fields then works as in an own collection; ``fields=""`` keeps the names.
    """
    if isinstance(flt, And | Or):
        return type(flt)(tuple(_qualified(sub, prefix, fields) for sub in flt.items))
    if flt.field != "document_id":
        return dataclasses.replace(flt, field=fields + flt.field) if fields else flt
    if isinstance(flt, Eq | Ne):
        return type(flt)(flt.field, prefix + flt.value if isinstance(flt.value, str) else flt.value)
    if isinstance(flt, In | Nin):
        return type(flt)(flt.field, tuple(prefix + v if isinstance(v, str) else v for v in flt.values))
    if isinstance(flt, Prefix):
        return Prefix(flt.field, prefix + flt.prefix)
    return flt
