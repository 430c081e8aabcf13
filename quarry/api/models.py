"""Request and response bodies of the REST API (they are also its OpenAPI schema).

Over 500 lines by design: every request and response schema of the REST API in one module, the
source of the OpenAPI document (quarry_client mirrors it; the answer routes' own are in
:mod:`quarry.api.answer`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator
from pydantic.config import JsonDict

from indexing.collections import CollectionConfig, FusionConfig
from indexing.document_rules import RESERVED_FIELDS
from indexing.text import Language
from quarry.api.edge import Checked, Identifier
from quarry.settings import SearchSettings
from stores.filters import FIELD_NAME

_MAX_QUERY_CHARS = SearchSettings.model_fields["max_query_chars"].default


class _Body(Checked):
    # strict: a JSON false is not 0 and 1 is not true; what the schema says is what is taken;
    # every string passes quarry.api.edge first (no NUL, no lone surrogate), but the fields in
    # parsed_later, which their own parsers check
    model_config = ConfigDict(extra="forbid", strict=True)


class CreateCollection(_Body):
    """``POST /v1/collections``."""

    name: str = Field(
        description="Letters, digits and '_'; starts with a letter; at most 63 characters.",
        json_schema_extra={"pattern": "^[A-Za-z][A-Za-z0-9_]{0,62}$"},  # checked by the service (400)
    )
    language: Language = Field("auto", description="BM25 analysis: en (Snowball), zh (jieba) or auto (both).")
    chunk_size: int | None = Field(None, ge=8, le=4096, description="Chunk cap in text tokens.")
    chunk_overlap: int | None = Field(None, ge=0, description="Tokens shared by consecutive chunks (< chunk_size).")
    fusion: FusionConfig | None = Field(
        None, description="Default hybrid fusion of its searches (unset fields: the server's QUARRY_SEARCH__*)."
    )
    tenancy: Literal["tenant", "shared"] = Field(
        "tenant",
        description="tenant: the key's tenant's own; shared: every tenant's, each seeing only the documents it wrote "
        "(tenant_id set from the key). Shared: the operator's tenant (default) only.",
    )
    cache_threshold: float | None = Field(
        None, gt=0, le=1, allow_inf_nan=False,
        description="Least cosine between a question and a cached one for the cached answer to be served (the "
        "lexical guard must pass too); unset: the server's QUARRY_CACHE__THRESHOLD.",
    )


# What the service checks itself (400 InvalidDocument, naming the document), told to the OpenAPI.
_TEXTS = ("text", "title")
_METADATA_SCHEMA = cast("JsonDict", {
    "propertyNames": {"pattern": FIELD_NAME.pattern, "not": {"enum": sorted(RESERVED_FIELDS)}},
    "additionalProperties": {
        "anyOf": [{"type": t} for t in ("string", "integer", "number", "boolean")]
        + [{"type": "array", "items": {"type": "string"}}]
    },
})


class DocumentIn(BaseModel):
    """A document to upsert; same fields as a JSONL line.

    The model declares the fields and their JSON types (the OpenAPI schema, with the rules the
    service checks told to it); the rules on their values are
    :func:`indexing.documents.parse_document`'s, the same for a JSONL line, applied to each
    document of the body (a broken rule is a 400 naming ``documents[i]``).
    """

    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, strict=True,
        json_schema_extra={"anyOf": [{"required": [f], "properties": {f: {"minLength": 1}}} for f in _TEXTS]},
    )

    id: str | StrictInt = Field(
        description="Non-empty, at most 256 characters, printable; not '.' or '..', and no '.' or '..' part "
        "between slashes (a URL path segment that HTTP clients resolve away); an integer is taken as its "
        "decimal text.",
    )
    text: str = ""
    title: str = Field("", description="Indexed with every chunk; text or title must be non-blank.")
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="Flat: identifier keys; string, finite number, boolean or list-of-strings values.",
        json_schema_extra=_METADATA_SCHEMA,
    )


class UpsertDocuments(_Body):
    """``POST /v1/collections/{name}/documents``: one atomic batch."""

    parsed_later = frozenset({"documents"})  # parse_document names the document at fault

    documents: list[DocumentIn] = Field(min_length=1, max_length=1000)


class DeleteDocuments(_Body):
    """``POST /v1/collections/{name}/documents/delete``."""

    parsed_later = frozenset({"filters"})  # parse_filter names the field at fault

    ids: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        None, min_length=1, max_length=10000, description="The documents to delete (or give filters)."
    )
    filters: dict[str, Any] | None = Field(
        None, description="Delete every document whose metadata matches (the search filter form; or give ids)."
    )

    @model_validator(mode="after")
    def _one_of(self) -> DeleteDocuments:
        if (self.ids is None) == (not self.filters):
            raise ValueError("give either ids or non-empty filters")
        return self


class RerankIn(_Body):
    """Rerank the fused top ``top_n`` with the cross-encoder, within ``budget_ms``."""

    top_n: int | None = Field(
        None, ge=1, le=1000,
        description="Fused candidates rescored; offset + top_k <= top_n. Default: QUARRY_RERANK__TOP_N.",
    )
    budget_ms: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="Default and most: QUARRY_RERANK__BUDGET_MS (a larger budget is clamped to it).",
    )
    model: Identifier | None = Field(None, description="Must match the configured reranker (one model per server).")


class SearchIn(_Body):
    """``POST /v1/collections/{name}/search``."""

    parsed_later = frozenset({"query", "filters"})  # the search's own checks (InvalidQuery, InvalidFilter)

    query: str = Field(
        description=f"Query text; must not be blank; at most QUARRY_SEARCH__MAX_QUERY_CHARS "
        f"({_MAX_QUERY_CHARS:,} by default) characters.",
        json_schema_extra={"minLength": 1},  # checked by the service (400 InvalidQuery)
    )
    top_k: int = Field(10, ge=1, description="Hits per page; offset + top_k <= rank_window_size.")
    mode: Literal["bm25", "dense", "hybrid"] = "hybrid"
    filters: dict[str, Any] | None = Field(
        None, description='Metadata filter, e.g. {"year": {"$gte": 2000}, "tag": {"$in": ["a", "b"]}}.'
    )
    offset: int = Field(0, ge=0)
    group_by_document: bool = Field(True, description="One hit per document (its best chunk).")
    rerank: RerankIn | None = None
    fusion: FusionConfig | None = Field(
        None, description="Hybrid fusion for this request, over the collection's default (unset fields inherit)."
    )
    min_score: float | None = Field(
        None, allow_inf_nan=False,
        description="Keep only candidates scoring at least this, before paging (and before a rerank). Hybrid: the "
        "fused score (rrf: sum of weight / (k + rank), at most sum(weights) / (k + 1); weighted: sum of weight × "
        "normalised score, in [0, sum(weights)] for minmax and dbsf, unbounded for zscore). bm25: the BM25 score. "
        "dense: the store's similarity (cosine, in [-1, 1]). A degraded hybrid query (one channel) compares it with "
        "that channel's own score.",
    )


class ChannelExplain(BaseModel):
    """Where one channel (``bm25`` or ``dense``) ranked the hit."""

    rank: int = Field(ge=1, description="1-based position in that channel's list.")
    score: float = Field(description="The channel's own score (BM25, or cosine similarity).")
    chunk_id: str = Field(description="The chunk the channel matched.")
    normalized: float | None = Field(
        None,
        description="Hybrid only: the channel's part of the fused score before its weight: 1 / (k + rank) for "
        "rrf, the normalised score for weighted.",
    )


class FusionExplain(BaseModel):
    """How the channels were fused (hybrid search): the method, its parameters and the fused score."""

    method: Literal["rrf", "weighted"]
    weights: dict[str, float] = Field(description="Channel weights.")
    k: int | None = Field(None, description="rrf: a hit scores sum(weight / (k + rank)) over the channels.")
    normalization: Literal["minmax", "zscore", "dbsf"] | None = Field(
        None, description="weighted: a hit scores sum(weight × normalised score) over the channels."
    )
    score: float


class RerankExplain(BaseModel):
    """The cross-encoder's score and the hit's rank before the rerank."""

    score: float
    rank_before: int = Field(ge=1)


class ExplainOut(BaseModel):
    """Why a hit is where it is: each channel that found it, the fusion, the rerank."""

    bm25: ChannelExplain | None = None
    dense: ChannelExplain | None = None
    fusion: FusionExplain | None = None
    rerank: RerankExplain | None = None


class TimingsOut(BaseModel):
    """Milliseconds spent per stage; a stage that did not run is absent."""

    bm25: float | None = Field(None, description="BM25 scoring.")
    embed: float | None = Field(None, description="Query queued until its vector came back (beside BM25).")
    ann: float | None = Field(None, description="Vector store search.")
    dense: float | None = Field(None, description="The whole dense channel (embed + ann).")
    rerank: float | None = Field(None, description="Cross-encoder rerank.")
    hydrate: float | None = Field(None, description="Reading the hits' texts and metadata.")


class HitOut(BaseModel):
    """One hit; ``explain`` gives each channel's rank and score, the fusion and the rerank."""

    document_id: str
    chunk_id: str
    score: float
    text: str
    metadata: dict[str, Any]
    explain: ExplainOut


class SearchOut(BaseModel):
    """A page of hits."""

    hits: list[HitOut]
    total: int = Field(
        description="Candidates the pages are cut from: the distinct hits (documents when grouping) in the "
        "channels' candidate windows (rank_window_size each; in hybrid mode their union) whose score passes "
        "min_score. Pages reach min(total, rank_window_size) of them."
    )
    mode: str
    offset: int
    top_k: int
    degraded: list[str] = Field(default_factory=list, description="Channels skipped and why.")
    reranked: bool | None = None
    rerank_reason: str | None = None
    took_ms: float
    timings_ms: TimingsOut
    version: int | None = Field(None, description="The collection version that served it (as the header "
                                "X-Quarry-Collection-Version).")
    rollout: Literal["candidate", "live"] | None = Field(
        None, description="While a gray release routes the collection: the serving version's role "
        "(as X-Quarry-Rollout).")


class DocumentChunkOut(BaseModel):
    """One chunk of a stored document."""

    id: str
    position: int
    text: str
    metadata: dict[str, Any] = Field(description="The chunk's metadata: the document's, plus page or section.")


class DocumentOut(BaseModel):
    """``GET /v1/collections/{name}/documents/{id}``: a stored document, rebuilt from its chunks."""

    id: str
    title: str | None = Field(None, description="The title as written (none for documents stored before titles were).")
    text: str = Field(description="The text as written; for documents stored before full texts were, the chunks' "
                      "texts in order with the overlap between chunks written once.")
    metadata: dict[str, Any] = Field(description="What every chunk holds alike (a PDF's page is per chunk).")
    chunks: list[DocumentChunkOut]


class DocumentSummaryOut(BaseModel):
    """A document in a listing."""

    id: str
    metadata: dict[str, Any]
    chunks: int


class DocumentsOut(BaseModel):
    """``GET /v1/collections/{name}/documents``: a page of documents in id order."""

    documents: list[DocumentSummaryOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last.")


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


class ErrorBody(BaseModel):
    """What went wrong (the ``error`` member of every error response)."""

    type: str = Field(description="The error's type, e.g. InvalidFilter, CollectionNotFound, StoreUnavailable.")
    message: str = Field(description="What was wrong, for a person.")
    retryable: bool = Field(description="Whether the same request may succeed later.")


class ErrorOut(BaseModel):
    """The envelope of every error response (4xx and 5xx)."""

    error: ErrorBody


class CollectionOut(CollectionConfig):
    """A collection's configuration and counts."""

    documents: int = Field(description="Documents stored.")
    chunks: int = Field(description="Chunks stored.")
    vectors: int = Field(description="Vectors in the vector store (of the live version).")
    live_version: int | None = Field(None, description="The physical version serving the collection.")
    versions: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Its versions (live, building, verifying, retired): store collection, model, dim, index, state.",
    )
    reindex: dict[str, Any] | None = Field(
        None, description="next_run (Unix s, this process's scheduler) and last_trigger (the newest reindex job: "
        "trigger, reason, by, state, at).",
    )
    rollout: dict[str, Any] | None = Field(
        None, description="The newest gray release of a candidate version: state (shadow, canary, live, "
        "rolled_back), percent, schedule, decisions with their gate figures, this process's window figures.",
    )


class ReindexIn(_Body):
    """``POST /v1/collections/{name}/reindex``."""

    model: Identifier | None = Field(
        None, description="Another embedding model's URL (re-embeds); default: the live one's."
    )
    index: Identifier = Field("auto", description="auto (the planner's choice for the current size) or an index kind.")
    chunk_size: int | None = Field(
        None, ge=8, le=4096, description="Re-chunk to this cap in text tokens (default: the live version's)."
    )
    chunk_overlap: int | None = Field(
        None, ge=0, description="The new overlap (< chunk_size; default: the live version's)."
    )


class IngestJobIn(_Body):
    """``POST /v1/collections/{name}/jobs``: ingest a source on the server's disk."""

    path: Identifier = Field(
        description="A BEIR folder, a .jsonl file or a folder of files, under one of the server's "
        "QUARRY_INGEST__ROOTS (a relative path is taken relative to the first)."
    )
    on_error: Literal["skip", "fail"] | None = Field(
        None, description="A file that cannot be parsed: skip it (named in errors) or fail the job; "
        "default QUARRY_INGEST__ON_ERROR."
    )
    prune: bool = Field(False, description="At the end, delete the collection's documents not in the source.")


class JobError(BaseModel):
    """A file an ingest job skipped, and why."""

    path: str
    reason: str


class JobOut(BaseModel):
    """A background job (``GET /v1/jobs/{id}``)."""

    id: str
    kind: str = Field(description="reindex or ingest.")
    collection: str | None
    state: str = Field(
        description="queued, running, done or failed; an ingest job also partial (files skipped), "
        "cancelling and cancelled."
    )
    params: dict[str, Any]
    counters: dict[str, int] = Field(
        description="Progress. reindex: done and total chunks; at the end copied, embedded, ... "
        "ingest: done and total documents (files skipped included), read, added, updated, unchanged, "
        "embedded (texts sent to the model, over all runs), chunks_written, skipped, resumed (runs after "
        "the first); inside the batch in flight (written every QUARRY_INGEST__PROGRESS_INTERVAL_S): parsed "
        "(documents read from the source, that batch included), batch_documents, batch_chunks (its chunks "
        "to embed), batch_embedded (of those, embedded so far)."
    )
    error: str | None = Field(description="Why it failed.")
    rate_docs_s: float | None = Field(None, description="ingest: documents per second of the current run.")
    eta_s: float | None = Field(None, description="ingest: seconds left at that rate.")
    errors: list[JobError] = Field(
        default_factory=list, description="ingest: files skipped, by path (the first 100; counters.skipped counts all)."
    )
    not_read: list[str] = Field(
        default_factory=list, description="ingest: files of formats not read, by path (the first 100)."
    )
    empty: list[str] = Field(default_factory=list, description="ingest: files without text, by path (the first 100).")
    created_at: float
    updated_at: float


class JobsOut(BaseModel):
    """``GET /v1/jobs``: the tenant's jobs the key may read, newest first."""

    jobs: list[JobOut]


class AuditEntryOut(BaseModel):
    """One audit-log entry: who did what, when (no document text, no key)."""

    id: int = Field(description="Its place in the log (increasing).")
    at: float = Field(description="When, Unix seconds.")
    action: str = Field(description="e.g. collection.create, collection.drop, key.create, key.revoke, ingest.submit.")
    key_id: str | None = Field(description="The key's id (null: the CLI, or an open server).")
    tenant: str | None
    target: str | None = Field(description="What it acted on: a collection, a key id.")
    detail: dict[str, Any]


class AuditOut(BaseModel):
    """``GET /v1/audit``: a page of the tenant's audit log."""

    entries: list[AuditEntryOut]
    next_cursor: str | None = Field(description="Pass as cursor for the next page; null on the last.")


class RollbackOut(BaseModel):
    """A rollback's outcome."""

    version: int = Field(description="The version live again.")
    previous: int = Field(description="The version it replaced.")


class CollectionsOut(BaseModel):
    """All collections, each with its configuration."""

    collections: list[CollectionConfig]


class DroppedOut(BaseModel):
    """A dropped collection."""

    deleted: str


class HealthOut(BaseModel):
    """Liveness."""

    status: Literal["ok"]


class DependencyOut(BaseModel):
    """One dependency's state in ``/readyz``."""

    status: Literal["ok", "unavailable", "error", "off"]
    message: str | None = Field(None, description="Why it is not ok (or, for the reranker, its model).")


class ReadyOut(BaseModel):
    """Readiness (200 ``ready``/``degraded``; 503 ``starting``, ``state store unavailable``, ``store error``...).

    503 ``collection error`` too; ``dependencies`` gives each dependency's state.
    """

    status: Literal["starting", "ready", "degraded", "state store unavailable", "store error", "collection error"]
    embedding_model: str | None = None
    degraded: list[str] | None = Field(None, description="What is skipped and why.")
    message: str | None = Field(
        None, description="The store's error (``store error``), or why the state store is unavailable."
    )
    dependencies: dict[Literal["vector_store", "state_store", "embedder", "llm", "reranker"], DependencyOut] | None = (
        Field(None, description="Each dependency's state (after ``starting``).")
    )
    collections: dict[str, str] | None = Field(
        None,
        description="Collections whose BM25 index can be neither loaded nor rebuilt, and why (``collection error``).",
    )


class RecallBucketOut(BaseModel):
    """One filter-selectivity bucket's recall@k over the window (``null`` without samples)."""

    samples: int
    mean_recall: float | None
    p10_recall: float | None


class RecallTriggerOut(BaseModel):
    """The reindex trigger: mean recall below ``floor`` over ``window_s`` in the ``below`` buckets."""

    fired: bool
    floor: float
    window_s: float
    below: dict[str, float]
    reason: str


class RecallOut(BaseModel):
    """Recent recall of the live version's sampled searches (``GET /v1/collections/{name}/recall``).

    Buckets: ``none`` (no filter), ``>=10%``, ``1-10%``, ``<1%`` of the rows matching the filter;
    figures of the live version only (a reindex's swap starts them afresh).
    """

    collection: str
    version: int | None = Field(None, description="The live version whose samples the buckets hold.")
    window_s: float
    sample_rate: float
    offered: int = Field(0, description="Searches of this collection drawn for a sample since the server started.")
    measured: int = Field(0, description="Samples measured since the server started (every version).")
    dropped: int = Field(description="Samples dropped on a full queue since the server started.")
    errors: int = Field(0, description="Samples whose exact search failed since the server started.")
    queued: int = Field(description="Samples waiting to be measured (every collection).")
    buckets: dict[str, RecallBucketOut]
    trigger: RecallTriggerOut
