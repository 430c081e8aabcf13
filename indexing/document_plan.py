"""What a document becomes in a collection: its content hash, its chunks with their indexed text, the schema.

Pure functions (no store, no model): the local pipeline (:mod:`indexing.pipeline`), the Ray
engine's stages and the reindex call them, so all make the same chunk ids and hashes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from indexing.chunking import chunk_sections, make_chunk_id
from indexing.collections import CollectionConfig
from indexing.docstore import StoredChunk
from indexing.document_rules import SourceDocument
from indexing.text import tokenize
from quarry.errors import InvalidDocument
from stores.filters import FieldType, field_type


def document_hash(doc: SourceDocument, cfg: CollectionConfig) -> str:
    """Content hash of a document under a collection's chunking and model."""
    key: list[object] = [
        doc.title, doc.text, doc.metadata, cfg.chunk_size, cfg.chunk_overlap, cfg.language, cfg.embedding_model
    ]
    if doc.sections:  # appended only when there are some: the hashes of documents without stay the same
        key.append([[s.start, s.metadata] for s in doc.sections])
    return hashlib.sha256(json.dumps(key, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def indexed_text(title: str, chunk: str) -> str:
    """The text a chunk is embedded and BM25-indexed as: its document title, then the chunk."""
    return f"{title}\n{chunk}" if title else chunk


def merge_schema(cfg: CollectionConfig, docs: Sequence[SourceDocument]) -> dict[str, FieldType] | None:
    """Widen the collection's metadata schema with the fields of ``docs``.

    Returns:
        The new schema, or ``None`` when nothing changed.

    Raises:
        InvalidDocument: A field's value type conflicts with the schema (int widens to float).
    """
    schema = dict(cfg.schema_)
    for doc in docs:
        fields = [*doc.metadata.items(), *(kv for s in doc.sections for kv in s.metadata.items())]
        for key, value in fields:
            kind = field_type(value)
            known = schema.get(key)
            if known is None:
                schema[key] = kind
            elif known != kind and not (known == "float" and kind == "int"):
                if known == "int" and kind == "float":
                    schema[key] = "float"
                    continue
                raise InvalidDocument(
                    f"document {doc.id!r}: field {key!r} holds {known} values in collection "
                    f"{cfg.name!r}, got {kind} {value!r}"
                )
    return None if schema == cfg.schema_ else schema


def plan_chunks(cfg: CollectionConfig, doc: SourceDocument) -> list[tuple[StoredChunk, str]]:
    """A document's chunks under a collection's chunking, each with the text it is embedded as.

    Pure (no store, no model): the local pipeline and the Ray engine's chunk stage
    (:mod:`indexing.ray_engine`) both call it, so both make the same chunk ids.

    Returns:
        ``(chunk, indexed text)`` per chunk, in position order.
    """
    out = []
    starts = [s.start for s in doc.sections] if doc.text else []
    for section, piece in chunk_sections(doc.text or doc.title, starts, cfg.chunk_size, cfg.chunk_overlap):
        text = indexed_text(doc.title if doc.text else "", piece.text)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        chunk_id = make_chunk_id(doc.id, piece.position, digest)
        extra = doc.sections[section].metadata if starts else {}
        payload = {"document_id": doc.id, **doc.metadata, **extra}
        tokens = tokenize(text, cfg.language)
        out.append((StoredChunk(chunk_id, doc.id, piece.position, piece.text, tokens, payload), text))
    return out
