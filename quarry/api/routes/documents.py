"""Document routes: upsert a batch atomically, delete by id or filter, list with a cursor, get one."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from fastapi import APIRouter, Query

from indexing.document_rules import SourceDocument, parse_document
from quarry import errors as e
from quarry.api.deps import NAMED_ERRORS, WRITE_ERRORS, Service
from quarry.api.errors import error_responses
from quarry.api.models import DeleteDocuments, DocumentOut, DocumentsOut, IngestOut, UpsertDocuments
from quarry.errors import InvalidDocument

router = APIRouter()


@router.post(
    "/v1/collections/{name}/documents", tags=["documents"], response_model=IngestOut,
    responses=error_responses(*WRITE_ERRORS, e.IndexBuildFailed, body=True),
)
def upsert_documents(name: str, body: UpsertDocuments, q: Service) -> IngestOut:
    """Insert or replace a batch of documents, atomically (nothing is written on error)."""
    return IngestOut(**report_of(q.upsert(name, documents_of(body), atomic=True)))


@router.post(
    "/v1/collections/{name}/documents/delete", tags=["documents"], response_model=IngestOut,
    responses=error_responses(*NAMED_ERRORS, body=True),
)
def delete_documents(name: str, body: DeleteDocuments, q: Service) -> IngestOut:
    """Delete documents (all their chunks, in both channels) by id, or those whose metadata matches ``filters``.

    The documents leave search at once. A 503 from the vector store after that leaves their
    vectors' deletes pending: the next write to the collection retries them, and a retried
    delete reports ``deleted: 0``.
    """
    # The docstore commits first (BM25, and dense hits are read back through the docstore), then
    # the vector store is asked; the pending deletes are recorded in that commit.
    if body.ids is None:
        return IngestOut(**report_of(q.delete_where(name, body.filters or {})))
    return IngestOut(**report_of(q.delete_documents(name, body.ids)))


@router.get(
    "/v1/collections/{name}/documents", tags=["documents"], response_model=DocumentsOut,
    responses=error_responses(*NAMED_ERRORS),
)
def list_documents(
    name: str, q: Service, cursor: str | None = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> DocumentsOut:
    """List a collection's documents in id order, ``limit`` at a time (keyset paging by ``cursor``)."""
    docs, next_cursor = q.list_documents(name, cursor=cursor, limit=limit)
    return DocumentsOut.model_validate({"documents": docs, "next_cursor": next_cursor})


@router.get(
    "/v1/collections/{name}/documents/{document_id:whole}", tags=["documents"], response_model=DocumentOut,
    responses=error_responses(*NAMED_ERRORS, e.NotFound),
)
def get_document(name: str, document_id: str, q: Service) -> DocumentOut:
    """A stored document by id: its text (its chunks' texts joined), metadata and chunks."""
    return DocumentOut.model_validate(q.get_document(name, document_id))


@router.delete(
    "/v1/collections/{name}/documents/{document_id:whole}", tags=["documents"], response_model=IngestOut,
    responses=error_responses(*NAMED_ERRORS),
)
def delete_document(name: str, document_id: str, q: Service) -> IngestOut:
    """Delete one document by id."""
    return IngestOut(**report_of(q.delete_documents(name, [document_id])))


def documents_of(body: UpsertDocuments) -> list[SourceDocument]:
    r"""The batch parsed into :class:`SourceDocument`\ s.

    Raises:
        InvalidDocument: A document is invalid, or an id repeats in the batch (its index named).
    """
    docs, seen = [], set()
    for i, doc in enumerate(body.documents):
        try:
            parsed = parse_document(doc.model_dump())
        except InvalidDocument as exc:
            raise InvalidDocument(f"documents[{i}]: {exc.message}") from exc
        if parsed.id in seen:
            raise InvalidDocument(f"documents[{i}]: duplicate document id {parsed.id!r} in this batch")
        seen.add(parsed.id)
        docs.append(parsed)
    return docs


def report_of(report: Any) -> dict[str, Any]:
    """An ingest report as the API shows it (without its internal ``extra``)."""
    out = dataclasses.asdict(report)
    out.pop("extra", None)
    return out
