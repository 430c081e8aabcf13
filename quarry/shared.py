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
  (they repeat the search's filter). A caller's filter that names ``tenant_id`` anywhere is
  refused (403 ``Forbidden``): it can neither remove nor widen the scope. Hits, documents and
  listings show ids without ``T/`` and metadata without ``tenant_id``; describe counts the
  tenant's documents, chunks and vectors. The semantic cache keys entries by ``T``.
* **By id**: get and delete address ``T/<id>`` only; another tenant's id is the same answer as a
  missing one (get: 404; delete: ``deleted: 0``), never a read or a delete of it.
* **Admin**: drop, reindex, rollback and recall figures (aggregates of every tenant's searches)
  are the operator's (tenant ``default``); any other tenant's key gets 403.

Fails closed: a scope whose tenant is empty or malformed is a 403, never an unfiltered view.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from indexing.collections import CollectionConfig, FusionConfig
from indexing.docstore import DEFAULT_TENANT
from indexing.pipeline import IngestReport, Progress
from indexing.sources import SourceDocument
from indexing.versions import live_config
from quarry.errors import CollectionNotFound, Conflict, Forbidden, InvalidDocument, NotFound, clip
from quarry.service import Quarry
from quarry.tenancy import TENANT_FIELD, TENANT_ID
from retrieval.search import Hit, SearchResult
from retrieval.text import Language
from stores.filters import And, Eq, Filter, In, Ne, Nin, Or, Prefix

log = logging.getLogger(__name__)


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
        if cfg.tenancy != "shared":
            cfg.tenancy = "shared"
            shared.docstore.put_collection(name, cfg.to_json())
    return cfg


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
        if not tenant_id or not TENANT_ID.fullmatch(tenant_id):
            raise Forbidden(f"tenant {clip(tenant_id)} cannot be scoped: refusing an unscoped request",
                            reason="tenant")
        self.__dict__.update(shared.__dict__)
        self.tenant_id = tenant_id
        self.scope = Eq(TENANT_FIELD, tenant_id)
        self.prefix = f"{tenant_id}/"

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

    def _document(self, doc: SourceDocument) -> SourceDocument:
        if TENANT_FIELD in doc.metadata:
            raise InvalidDocument(
                f"document {clip(doc.id)}: metadata field {TENANT_FIELD!r} is set by the server in a shared "
                "collection (from the API key's tenant); leave it out"
            )
        meta = {**doc.metadata, TENANT_FIELD: self.tenant_id}
        return dataclasses.replace(doc, id=self._qualify(doc.id), metadata=meta)

    def _hit(self, hit: Hit) -> Hit | None:
        if not self._mine(hit.document_id) or hit.metadata.get(TENANT_FIELD) != self.tenant_id:
            log.error("shared collection hit outside tenant %s's scope dropped", self.tenant_id)
            return None
        meta = {k: v for k, v in hit.metadata.items() if k != TENANT_FIELD}
        explain = {  # each channel's chunk id too: the caller's ids everywhere, never the stored T/ ones
            k: {**v, "chunk_id": v["chunk_id"].removeprefix(self.prefix)}
            if isinstance(v, dict) and isinstance(v.get("chunk_id"), str) else v
            for k, v in hit.explain.items()
        }
        return dataclasses.replace(
            hit, document_id=hit.document_id.removeprefix(self.prefix),
            chunk_id=hit.chunk_id.removeprefix(self.prefix), metadata=meta, explain=explain,
        )

    def _result(self, result: SearchResult) -> SearchResult:
        result.hits = [h for h in (self._hit(hit) for hit in result.hits) if h is not None]
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
        cfg, flt = super()._target(name, filters)
        return cfg, self.scope if flt is None else And((self.scope, _qualified(flt, self.prefix)))

    def _matching_ids(self, name: str, flt: Filter, prefix: str = "") -> list[str]:
        return super()._matching_ids(name, flt, self.prefix)  # this tenant's key range, whatever is asked

    def search(self, name: str, query: str, **kwargs: Any) -> SearchResult:
        """:meth:`Quarry.search` within the tenant (see the module doc)."""
        return self._result(super().search(name, query, **kwargs))

    async def search_async(self, name: str, query: str, **kwargs: Any) -> SearchResult:
        """:meth:`Quarry.search_async` within the tenant."""
        return self._result(await super().search_async(name, query, **kwargs))

    def describe(self, name: str) -> dict[str, Any]:
        """Configuration plus this tenant's document, chunk and vector counts."""
        cfg = self.get_collection(name)
        live = self.live_version(name)
        ids = self._own_ids(name)
        chunks = sum(len(c) for c in self.docstore.chunk_ids_of(name, ids).values())
        return {
            **live_config(cfg, live).to_json(), "documents": len(ids), "chunks": chunks,
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
        doc["id"] = document_id
        doc["metadata"] = {k: v for k, v in doc["metadata"].items() if k != TENANT_FIELD}
        for chunk in doc["chunks"]:
            chunk["id"] = chunk["id"].removeprefix(self.prefix)
            chunk["metadata"] = {k: v for k, v in chunk["metadata"].items() if k != TENANT_FIELD}
        return doc

    def list_documents(
        self, name: str, *, cursor: str | None = None, limit: int = 100
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of this tenant's documents in id order (cursors are its own ids)."""
        from indexing.documents import list_documents

        self.get_collection(name)
        page, nxt = list_documents(self.docstore, name, cursor=self._qualify(cursor or ""), limit=limit,
                                   prefix=self.prefix)
        for doc in page:
            doc["id"] = doc["id"].removeprefix(self.prefix)
            doc["metadata"] = {k: v for k, v in doc["metadata"].items() if k != TENANT_FIELD}
        return page, None if nxt is None else nxt.removeprefix(self.prefix)

    # --- writes --------------------------------------------------------------------------
    def upsert(
        self, name: str, docs: Sequence[SourceDocument], progress: Progress | None = None, *, atomic: bool = False
    ) -> IngestReport:
        """:meth:`Quarry.upsert` of this tenant's documents (``tenant_id`` set from the key).

        Raises:
            InvalidDocument: A document sets ``tenant_id`` (nothing of the batch is written).
        """
        return super().upsert(name, [self._document(d) for d in docs], progress, atomic=atomic)

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
        return super().upsert_stream(name, (self._document(d) for d in docs), progress, stop=stop, seen=seen)

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


def _qualified(flt: Filter, prefix: str) -> Filter:
    """``flt`` with its ``document_id`` values as stored (``T/<id>``): a filter on ids works as in an own collection."""
    if isinstance(flt, And | Or):
        return type(flt)(tuple(_qualified(sub, prefix) for sub in flt.items))
    if flt.field != "document_id":
        return flt
    if isinstance(flt, Eq | Ne):
        return type(flt)(flt.field, prefix + flt.value if isinstance(flt.value, str) else flt.value)
    if isinstance(flt, In | Nin):
        return type(flt)(flt.field, tuple(prefix + v if isinstance(v, str) else v for v in flt.values))
    if isinstance(flt, Prefix):
        return Prefix(flt.field, prefix + flt.prefix)
    return flt
