"""Request and response bodies of the REST API (they are also its OpenAPI schema)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from quarry.settings import SearchSettings
from retrieval.text import Language

_MAX_QUERY_CHARS = SearchSettings.model_fields["max_query_chars"].default


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateCollection(_Body):
    """``POST /v1/collections``."""

    name: str = Field(description="Letters, digits and '_'; starts with a letter; at most 63 characters.")
    language: Language = Field("auto", description="BM25 analysis: en (Snowball), zh (jieba) or auto (both).")
    chunk_size: int | None = Field(None, ge=8, le=4096, description="Chunk cap in text tokens.")
    chunk_overlap: int | None = Field(None, ge=0, description="Tokens shared by consecutive chunks (< chunk_size).")


class DocumentIn(BaseModel):
    """A document to upsert; same fields as a JSONL line.

    The model declares the fields and their JSON types (the OpenAPI schema); the rules on their
    values are :func:`indexing.sources.parse_document`'s, the same for a JSONL line, applied to
    each document of the body (a broken rule is a 400 naming ``documents[i]``).
    """

    model_config = ConfigDict(extra="forbid")

    id: str | StrictInt = Field(
        description="Non-empty, at most 256 characters; an integer is taken as its decimal text."
    )
    text: str = ""
    title: str = Field("", description="Indexed with every chunk; text or title must be non-blank.")
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="Flat: identifier keys; string, finite number, boolean or list-of-strings values.",
    )


class UpsertDocuments(_Body):
    """``POST /v1/collections/{name}/documents``: one atomic batch."""

    documents: list[DocumentIn] = Field(min_length=1, max_length=1000)


class DeleteDocuments(_Body):
    """``POST /v1/collections/{name}/documents/delete``."""

    ids: list[str] = Field(min_length=1, max_length=10000)


class RerankIn(_Body):
    """Rerank the fused top ``top_n`` with the cross-encoder, within ``budget_ms``."""

    top_n: int | None = Field(
        None, ge=1, le=1000,
        description="Fused candidates rescored; offset + top_k <= top_n. Default: QUARRY_RERANK__TOP_N.",
    )
    budget_ms: float | None = Field(None, gt=0, description="Default: QUARRY_RERANK__BUDGET_MS.")
    model: str | None = Field(None, description="Must match the configured reranker (one model per server).")


class SearchIn(_Body):
    """``POST /v1/collections/{name}/search``."""

    query: str = Field(
        description=f"Query text; must not be blank; at most QUARRY_SEARCH__MAX_QUERY_CHARS "
        f"({_MAX_QUERY_CHARS:,} by default) characters."
    )
    top_k: int = Field(10, ge=1, description="Hits per page; offset + top_k <= rank_window_size.")
    mode: Literal["bm25", "dense", "hybrid"] = "hybrid"
    filters: dict[str, Any] | None = Field(
        None, description='Metadata filter, e.g. {"year": {"$gte": 2000}, "tag": {"$in": ["a", "b"]}}.'
    )
    offset: int = Field(0, ge=0)
    group_by_document: bool = Field(True, description="One hit per document (its best chunk).")
    rerank: RerankIn | None = None


class HitOut(BaseModel):
    """One hit; ``explain`` gives each channel's rank and score, the fusion and the rerank."""

    document_id: str
    chunk_id: str
    score: float
    text: str
    metadata: dict[str, Any]
    explain: dict[str, Any]


class SearchOut(BaseModel):
    """A page of hits."""

    hits: list[HitOut]
    total: int = Field(description="Fused candidates available (the list pages are cut from).")
    mode: str
    offset: int
    top_k: int
    degraded: list[str] = Field(default_factory=list, description="Channels skipped and why.")
    reranked: bool | None = None
    rerank_reason: str | None = None
    took_ms: float
    timings_ms: dict[str, float]


class IngestOut(BaseModel):
    """What an upsert or delete did."""

    documents: int
    added: int
    updated: int
    unchanged: int
    deleted: int
    chunks_written: int
    chunks_deleted: int
    embedded: int
    truncated: int
    elapsed_s: float
