"""Stored documents listed and fetched by id.

The docstore keeps each document's title, full text and metadata (written since the state of
record's schema step 2); a document written before that has only its chunks, and its ``text``
here is rebuilt from them: the chunks'
texts joined in order, the tokens that consecutive chunks of one section share (the chunk
overlap) written once, chunks of different sections joined by a blank line. Its ``metadata``
is what all its chunks' payloads hold alike (a PDF's per-page ``page`` stays with the chunks).
Such an old document has no ``title``.
"""

from __future__ import annotations

from typing import Any

from indexing.chunking import _TOKEN
from indexing.docstore import DocStore, StoredChunk
from quarry.errors import NotFound, clip

MAX_PAGE = 1000


def _shared(prev: str, nxt: str, overlap: int) -> int:
    """Characters at the start of ``nxt`` that repeat the end of ``prev`` (``overlap`` tokens), 0 if none."""
    spans = [m.span() for m in _TOKEN.finditer(nxt)][:overlap]
    if overlap and len(spans) == overlap:
        cut = spans[-1][1]
        if prev.endswith(nxt[:cut]):
            return cut
    return 0


def assemble(document_id: str, chunks: list[StoredChunk], overlap: int) -> dict[str, Any]:
    """One document from its chunks (in position order).

    Returns:
        ``{"id", "text", "metadata", "chunks": [{"id", "position", "text", "metadata"}]}``.
    """
    chunks = sorted(chunks, key=lambda c: c.position)
    text = ""
    for i, chunk in enumerate(chunks):
        if i == 0:
            text = chunk.text
            continue
        prev = chunks[i - 1]
        same_section = {k: v for k, v in prev.payload.items() if k in ("page", "section")} == {
            k: v for k, v in chunk.payload.items() if k in ("page", "section")
        }
        cut = _shared(prev.text, chunk.text, overlap) if same_section else 0
        text += chunk.text[cut:] if cut else ("\n\n" if not same_section else " ") + chunk.text
    common = dict(chunks[0].payload) if chunks else {}
    for chunk in chunks[1:]:
        common = {k: v for k, v in common.items() if chunk.payload.get(k) == v}
    common.pop("document_id", None)
    return {
        "id": document_id,
        "text": text,
        "metadata": common,
        "chunks": [
            {
                "id": c.chunk_id, "position": c.position, "text": c.text,
                "metadata": {k: v for k, v in c.payload.items() if k != "document_id"},
            }
            for c in chunks
        ],
    }


def get_document(docstore: DocStore, collection: str, document_id: str, overlap: int) -> dict[str, Any]:
    """A stored document by id.

    Raises:
        NotFound: The collection has no such document (404).
    """
    owned = docstore.chunk_ids_of(collection, [document_id]).get(document_id)
    if not owned:
        raise NotFound(f"collection {clip(collection)} has no document {clip(document_id)}")
    doc = assemble(document_id, list(docstore.get_chunks(collection, owned).values()), overlap)
    stored = docstore.get_documents(collection, [document_id]).get(document_id)
    if stored is not None and stored.text is not None:  # the text as written, not rebuilt
        doc["text"] = stored.text
        if stored.metadata is not None:
            doc["metadata"] = {k: v for k, v in stored.metadata.items() if k != "document_id"}
        if stored.title:
            doc["title"] = stored.title
    return doc


def list_documents(
    docstore: DocStore, collection: str, *, cursor: str | None, limit: int, prefix: str = ""
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of stored documents in id order: ``([{"id", "metadata", "chunks": n}], next cursor)``.

    Args:
        docstore: The docstore.
        collection: Collection name (checked by the caller).
        cursor: The ``next_cursor`` of the previous page (a document id), ``None`` for the first.
        limit: Documents per page, 1 to :data:`MAX_PAGE`.
        prefix: Only ids starting with it (a shared collection's tenant, ``quarry.services.namespace``); the
            cursor must be one of them or the prefix itself.
    """
    ids = docstore.document_ids(collection, after=cursor, limit=limit + 1)
    if prefix:
        ids = [i for i in ids if i.startswith(prefix)]  # one key range: the rest are past its end
    more, ids = len(ids) > limit, ids[:limit]
    owned = docstore.chunk_ids_of(collection, ids)
    chunks = docstore.get_chunks(collection, [c for cs in owned.values() for c in cs])
    page = []
    for doc_id in ids:
        doc = assemble(doc_id, [chunks[c] for c in owned.get(doc_id, []) if c in chunks], 0)
        page.append({"id": doc_id, "metadata": doc["metadata"], "chunks": len(doc["chunks"])})
    return page, (ids[-1] if more and ids else None)
