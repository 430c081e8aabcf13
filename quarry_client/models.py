"""The client's view of the API's bodies (pydantic; fields the server adds later are kept, not refused).

The names and fields follow the server's OpenAPI (``/openapi.json``): a newer server's extra
fields are kept on the model (``model_extra``), so an older client keeps working.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from quarry_client.errors import QuarryError, error_of

__all__ = [
    "Collection", "Hit", "SearchResult", "DocumentSummary", "DocumentPage", "Document", "WriteReport", "Job",
    "AnswerEvent", "Answer", "FINAL_STATES",
]

FINAL_STATES = frozenset({"done", "partial", "failed", "cancelled"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Collection(_Model):
    """A collection's configuration (``GET /v1/collections``); ``describe`` adds the counts."""

    name: str
    language: str = "auto"
    embedding_model: str | None = None
    dim: int | None = None
    chunk_size: int | None = None
    chunk_overlap: int | None = None
    documents: int | None = Field(None, description="describe only: documents stored.")
    chunks: int | None = Field(None, description="describe only: chunks stored.")
    vectors: int | None = Field(None, description="describe only: vectors of the live version.")
    live_version: int | None = None


class Hit(_Model):
    """One search hit: its document and chunk, fused score, text, metadata and per-channel ``explain``."""

    document_id: str
    chunk_id: str
    score: float
    text: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    explain: dict[str, Any] = Field(default_factory=dict)


class SearchResult(_Model):
    """``POST /v1/collections/{name}/search``'s body."""

    hits: list[Hit]
    total: int | None = None
    mode: str
    offset: int = 0
    top_k: int
    degraded: list[str] = Field(default_factory=list)
    reranked: bool | None = None
    rerank_reason: str | None = None
    took_ms: float = 0.0
    timings_ms: dict[str, float | None] = Field(default_factory=dict)
    version: int | None = None  # the collection version that served it
    rollout: str | None = None  # under a gray release: "candidate" or "live"
    request_id: str | None = Field(None, description="The X-Request-ID it was sent with (for feedback).")


class DocumentSummary(_Model):
    """A document in a listing: id, metadata and chunk count."""

    id: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    chunks: int


class DocumentPage(_Model):
    """A page of documents in id order; ``next_cursor`` is ``None`` on the last page."""

    documents: list[DocumentSummary]
    next_cursor: str | None = None


class Document(_Model):
    """A stored document: its text, title, metadata and chunks."""

    id: str
    title: str | None = None
    text: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    chunks: list[dict[str, Any]] = Field(default_factory=list)


class WriteReport(_Model):
    """What an upsert or a delete did (``IngestOut``)."""

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


class Job(_Model):
    """An ingest or reindex job (``GET /v1/jobs/{id}``): state, counters, rate, ETA, files skipped."""

    id: str
    kind: str
    collection: str | None = None
    state: str
    params: dict[str, Any] = Field(default_factory=dict)
    counters: dict[str, int] = Field(default_factory=dict)
    error: str | None = None
    rate_docs_s: float | None = None
    eta_s: float | None = None
    errors: list[dict[str, str]] = Field(default_factory=list)
    not_read: list[str] = Field(default_factory=list, description="ingest: files of formats not read.")
    empty: list[str] = Field(default_factory=list, description="ingest: files without text.")
    created_at: float = 0.0
    updated_at: float = 0.0

    @property
    def finished(self) -> bool:
        """Whether the job is in a final state (done, partial, failed, cancelled)."""
        return self.state in FINAL_STATES


class AnswerEvent(_Model):
    """One Server-Sent Event of a streamed answer: ``sources``, ``delta``, ``done`` or ``error``.

    ``data`` is the event's JSON object (``delta``: ``{"text"}``; ``sources``: the hits cited from;
    ``done``: the answer, citations, usage and timings; ``error``: the envelope's ``error``).
    """

    event: str
    data: dict[str, Any] = Field(default_factory=dict)

    def error(self) -> QuarryError | None:
        """An ``error`` event's typed error (the class the envelope's ``type`` names); ``None`` for others."""
        if self.event != "error":
            return None
        body = self.data.get("error") if isinstance(self.data.get("error"), dict) else self.data
        return error_of(body)


class Answer(_Model):
    """``POST /v1/collections/{name}/answer``'s JSON body (``answer`` is ``None`` when degraded)."""

    answer: str | None = None
    citations: list[Any] = Field(default_factory=list)
    sources: list[dict[str, Any]] = Field(default_factory=list)
    degraded: list[str] = Field(default_factory=list)
    version: int | None = None  # the collection version that served it
    rollout: str | None = None  # under a gray release: "candidate" or "live"
    request_id: str | None = Field(None, description="The X-Request-ID it was sent with (for feedback).")
