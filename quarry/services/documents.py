"""Documents: write (one call, one job batch, a stream), read, list and delete, through the namespace.

Every path goes through the view's :class:`~quarry.services.namespace.Namespace` (stored ids,
stored metadata keys, messages in the caller's names), so a shared collection behaves on a
job's batch as on a REST write. Writes to one collection are serialised
(:meth:`~quarry.services.view.TenantSpace.writing`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from indexing.document_rules import SourceDocument
from indexing.documents import get_document, list_documents
from indexing.pipeline import IngestReport, Precomputed, Progress, Watch
from indexing.versions import live_config
from quarry.errors import CollectionNotFound, Forbidden, InvalidRequest, NotFound, clip
from quarry.services import collections, query, versions
from quarry.services.view import View
from stores.filters import Filter, matches


def upsert(
    v: View, name: str, docs: Sequence[SourceDocument], progress: Progress | None = None, *, atomic: bool = False
) -> IngestReport:
    """Insert or replace documents (see :meth:`indexing.pipeline.Ingestor.upsert`), then re-plan the index.

    Raises:
        InvalidDocument: A document is refused (nothing of the batch is written; the message in
            the caller's names), e.g. it sets ``tenant_id`` in a shared collection.
    """
    stored = [v.ns.document(d, name) for d in docs]
    with v.ns.messages(), v.space.writing(name):
        cfg, target = versions.write_target(v, name)
        report = v.space.ingestor.upsert(cfg, stored, progress, atomic=atomic, target=target)
        if report.chunks_written:
            collections.replan_index(v, name)
    return report


def upsert_batch(v: View, name: str, docs: Sequence[SourceDocument], watch: Watch | None = None) -> IngestReport:
    """One batch of an ingestion job: written as :func:`upsert` does, the index re-planned by the caller.

    The write lock is held for this batch only, so REST writes to the collection interleave
    with a long job. ``watch``: progress inside the batch (:data:`indexing.pipeline.Watch`;
    it may drop the batch by raising :class:`~indexing.pipeline.Abandoned`).
    """
    stored = [v.ns.document(d, name) for d in docs]
    with v.ns.messages(), v.space.writing(name):
        cfg, target = versions.write_target(v, name)
        return v.space.ingestor.upsert(cfg, stored, target=target, watch=watch)


def upsert_stream(  # noqa: PLR0913 - the stream's controls
    v: View,
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

    Raises:
        Forbidden: ``vectors`` given for a shared collection (they are keyed by the source's
            ids, not the tenant's stored ones).
    """
    if vectors is not None and v.ns.shared:
        raise Forbidden("a shared collection takes documents, not vectors embedded elsewhere (--engine ray)")
    stored = (v.ns.document(d, name) for d in docs)
    with v.ns.messages(), v.space.writing(name):
        cfg, target = versions.write_target(v, name)  # the live version's store collection, model and chunking
        report = v.space.ingestor.upsert_stream(cfg, stored, progress, stop=stop, seen=seen, vectors=vectors,
                                                target=target)
        if report.chunks_written:
            collections.replan_index(v, name)
    return report


def get(v: View, name: str, document_id: str) -> dict[str, Any]:
    """A stored document rebuilt from its chunks (see :mod:`indexing.documents`).

    Raises:
        CollectionNotFound: No such collection.
        NotFound: No such document (in a shared collection: of this tenant).
    """
    overlap = live_config(collections.get(v, name), versions.live_version(v, name)).chunk_overlap
    try:
        doc = get_document(v.docstore, name, v.ns.qualify(document_id), overlap)
    except CollectionNotFound:
        raise
    except NotFound:
        if not v.ns.shared:
            raise
        raise NotFound(f"collection {clip(name)} has no document {clip(document_id)}") from None  # not T/<id>
    if v.ns.shared:
        doc["id"] = document_id
        doc["metadata"] = v.ns.shown(doc["metadata"], name)
        for chunk in doc["chunks"]:
            chunk["id"] = v.ns.unqualify(chunk["id"])
            chunk["metadata"] = v.ns.shown(chunk["metadata"], name)
    return doc


def list_page(
    v: View, name: str, *, cursor: str | None = None, limit: int = 100
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of stored documents in id order, and the cursor of the next page (``None``: last).

    Raises:
        CollectionNotFound: No such collection.
    """
    collections.get(v, name)
    if not v.ns.shared:
        return list_documents(v.docstore, name, cursor=cursor, limit=limit)
    page, nxt = list_documents(v.docstore, name, cursor=v.ns.qualify(cursor or ""), limit=limit, prefix=v.ns.prefix)
    for doc in page:
        doc["id"] = v.ns.unqualify(doc["id"])
        doc["metadata"] = v.ns.shown(doc["metadata"], name)
    return page, None if nxt is None else v.ns.unqualify(nxt)


def ids(v: View, name: str) -> list[str]:
    """Every document id of collection ``name`` the caller sees (its own, in a shared collection), in order."""
    return [v.ns.unqualify(i) for i in collections.own_ids(v, name)]


def delete(v: View, name: str, document_ids: Sequence[str]) -> IngestReport:
    """Delete documents by id from both channels (in a shared collection another tenant's id deletes nothing)."""
    return _delete_stored(v, name, [v.ns.qualify(i) for i in document_ids])


def _delete_stored(v: View, name: str, stored_ids: Sequence[str]) -> IngestReport:
    with v.space.writing(name):
        cfg, target = versions.write_target(v, name)
        return v.space.ingestor.delete(cfg, stored_ids, target)


def delete_where(v: View, name: str, filters: Mapping[str, Any]) -> IngestReport:
    """Delete the documents whose metadata matches ``filters`` (the search filter form), from both channels.

    The documents are found in the state of record (each one's ``document_id`` and metadata,
    read a page at a time, within the namespace's key range) and deleted as :func:`delete`
    does, under the collection's write lock (a document written meanwhile is not missed half-way).

    Raises:
        CollectionNotFound: No such collection.
        InvalidRequest: ``filters`` is empty (delete a collection's documents by dropping it).
        InvalidFilter: See :func:`stores.filters.parse_filter`.
    """
    if not filters:
        raise InvalidRequest("a delete by filter needs a non-empty filter")
    with v.space.writing(name):
        _, flt = query.target(v, name, filters)
        assert flt is not None  # a non-empty filter parses to one
        return _delete_stored(v, name, _matching_ids(v, name, flt))  # stored ids as they are


def _matching_ids(v: View, name: str, flt: Filter) -> list[str]:
    """Stored ids (in the namespace's key range) whose document metadata ``flt`` matches."""
    prefix = v.ns.prefix
    found: list[str] = []
    after = prefix
    while True:
        page = v.docstore.list_documents(name, after=after, limit=1000)
        for doc in page:
            if not doc.document_id.startswith(prefix):
                return found
            if matches(flt, {**(doc.metadata or {}), "document_id": doc.document_id}):
                found.append(doc.document_id)
        if len(page) < 1000:
            return found
        after = page[-1].document_id
