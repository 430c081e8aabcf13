"""The state of record's seam: what the service asks the docstore, and which backend answers.

The docstore is the source of truth beside the vector store (docs/design-state.md): collections
and their configuration, every document's hash and full text, every chunk's text, tokens and
payload, the per-collection change log, physical versions, jobs, leases, API keys and the audit
log. Ingestion diffs against it, the BM25 channel is rebuilt from its token lists, search hits
take their text and metadata from it.

:class:`StateStore` is the narrow Protocol every backend implements; :func:`open_docstore` picks
one by URL scheme:

==============================  ===============================================================
URL                             backend
==============================  ===============================================================
``""`` or ``sqlite:///path``    SQLite in WAL mode, one file (``<data_dir>/docstore.sqlite``)
``postgresql://...``            PostgreSQL through psycopg 3 (``indexing.state_postgres``)
==============================  ===============================================================

Both run on SQLAlchemy Core with one Alembic migration history (:mod:`indexing.schema`). Every
call has a deadline (``timeout_s``; :mod:`indexing.state_calls`): a stalled or unreachable
database is ``StateStoreUnavailable`` (503) by then, never a hang. Code on an event loop reaches
the state through :func:`off_loop` (cached reads answer on the loop, the rest in a thread) or
:meth:`StateStore.submit` (a future).

Every committed write to a collection's documents takes the next ``seq`` of the collection in
the same transaction and appends one :class:`Change` per document it upserted or deleted;
:meth:`StateStore.version` is that ``seq`` (BM25 snapshots and cache keys compare it).
Records are plain data in and out: hashing keys, scopes and states are the callers' business.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from indexing.rollout import Rollout
from indexing.state_calls import CacheMiss, cache_only, off_loop
from quarry.errors import ConfigError, missing_extra

__all__ = ["CacheMiss", "cache_only", "off_loop"]  # re-exported: the API reaches the state through these

DEFAULT_TENANT = "default"
SCHEMES = ("sqlite", "postgresql", "postgres")

VersionState = Literal["building", "verifying", "candidate", "live", "retired", "failed"]  # candidate: a rollout's
ChangeOp = Literal["upsert", "delete"]


@dataclass(frozen=True)
class StoredChunk:
    """A chunk as the docstore keeps it."""

    chunk_id: str
    document_id: str
    position: int
    text: str
    tokens: list[str]
    payload: dict[str, Any]


@dataclass(frozen=True)
class StoredDocument:
    """A document as the docstore keeps it.

    ``title``, ``text`` and ``metadata`` are ``None`` for documents written before schema step 2
    (only their hash was kept then): those cannot be re-chunked from the docstore.
    """

    document_id: str
    content_hash: str
    title: str | None = None
    text: str | None = None
    metadata: dict[str, Any] | None = None
    updated_seq: int = 0


@dataclass(frozen=True)
class CollectionState:
    """A collection's identity and positions (not its configuration).

    Attributes:
        id: Surrogate id (a collection dropped and created again gets a new one).
        live_version: The physical version serving it (``0``: the original store collection,
            named as the collection).
        seq: The last change-log position (bumped by every committed document write).
        chunking_id: The live version's chunking id: which chunks rows serve (``""``: the
            collection's original chunking; a reindex that re-chunks writes another).
    """

    id: int
    tenant_id: str
    name: str
    live_version: int
    seq: int
    shared: bool
    created_at: float
    chunking_id: str = ""


@dataclass(frozen=True)
class Change:
    """One change-log row: document ``document_id`` was upserted or deleted at ``seq``."""

    seq: int
    op: ChangeOp
    document_id: str
    content_hash: str | None
    at: float


@dataclass(frozen=True)
class CollectionVersion:
    """One physical version of a collection (a reindex builds ``v+1`` beside ``v``)."""

    version: int
    physical_name: str
    state: VersionState
    model_fingerprint: str | None = None
    model_name: str | None = None
    dim: int | None = None
    chunking: dict[str, Any] = field(default_factory=dict)
    analyzer: str | None = None
    index_plan: dict[str, Any] = field(default_factory=dict)
    built_from_seq: int | None = None
    created_at: float = 0.0
    swapped_at: float | None = None
    retire_after: float | None = None


def chunking_id_of(chunking: dict[str, Any] | None) -> str:
    """The id of a recorded chunking (its chunks rows' ``chunking_id``); ``""``: the collection's original one."""
    return str((chunking or {}).get("id") or "")


@dataclass(frozen=True)
class Lease:
    """A named lease and its holder; ``expires_at`` in Unix seconds of the database's clock."""

    name: str
    owner: str
    expires_at: float


@dataclass(frozen=True)
class Job:
    """An ingestion or reindex job (``cursor`` is the caller's resume point, opaque here)."""

    id: str
    kind: str
    collection: str | None
    tenant_id: str
    state: str
    params: dict[str, Any]
    cursor: str | None
    counters: dict[str, int]
    error: str | None
    lease_owner: str | None
    lease_expires_at: float | None
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class ApiKeyRecord:
    """A stored API key: its hash only (the key itself is shown once, never stored)."""

    id: str
    tenant_id: str
    prefix: str
    hash: str
    name: str = ""
    scopes: list[str] = field(default_factory=list)
    collections: list[str] | None = None
    rate: float | None = None
    priority: int = 0
    created_at: float = 0.0
    expires_at: float | None = None
    revoked_at: float | None = None
    token_rate: float | None = None  # LLM tokens per second (schema step 3); None: unlimited


@dataclass(frozen=True)
class AuditEntry:
    """One audit-log row (no document text, no key)."""

    action: str
    key_id: str | None = None
    tenant_id: str | None = None
    target: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    at: float = 0.0
    id: int = 0


class StateStore(Protocol):
    """The state of record (see the module docstring); thread-safe, one instance per process.

    Unknown collections read as empty; writes to one raise ``CollectionNotFound``. Backend
    failures raise ``StoreError`` (``StoreUnavailable`` when a retry may succeed).
    """

    location: str  # where it is, for messages (a path, or a URL without password)
    timeout_s: float  # every call's deadline

    def close(self) -> None:
        """Release the connections."""

    def change_token(self) -> int | None:
        """A number that changes whenever the state commits a change (``None``: unknown, read every time)."""

    def healthy(self) -> None:
        """One round trip within the deadline (``StateStoreUnavailable`` otherwise): the readiness probe."""

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args)`` (a method of this store) on the state's threads: a future, failed at the deadline."""

    def for_tenant(self, tenant_id: str) -> StateStore:
        """A view whose collections, jobs and write locks are ``tenant_id``'s (shares the connections)."""

    # --- collections (tenant ``default`` unless scoped) ---------------------
    def collection_config(self, name: str) -> dict[str, Any] | None:
        """The stored configuration of a collection, or ``None``."""

    def collection_state(self, name: str) -> CollectionState | None:
        """The collection's id, live version and seq, or ``None``."""

    def list_collections(self) -> list[str]:
        """Names of all collections, sorted."""

    def put_collection(self, name: str, config: dict[str, Any]) -> None:
        """Create a collection or replace its configuration (takes no seq)."""

    def drop_collection(self, name: str) -> None:
        """Delete a collection with its documents, chunks, change log and versions."""

    def version(self, name: str) -> int:
        """The collection's ``seq`` (0 for an unknown one)."""

    def write_lock(self, name: str, *, timeout_s: float = 30.0) -> AbstractContextManager[None]:
        """Hold the collection's cross-process write lock (re-entrant; lapses with its process)."""

    # --- documents, chunks, change log -------------------------------------------------
    def document_hashes(self, name: str, document_ids: Iterable[str]) -> dict[str, str]:
        """``document_id -> content_hash`` for those of ``document_ids`` that are stored."""

    def get_documents(self, name: str, document_ids: Sequence[str]) -> dict[str, StoredDocument]:
        """Stored documents by id, with title, full text and metadata."""

    def list_documents(self, name: str, *, after: str = "", limit: int = 1000) -> list[StoredDocument]:
        """Up to ``limit`` documents with ids > ``after``, in id order (a reindex pages with it)."""

    # Chunks belong to a chunking (``chunking``: its id; ``None``: the live version's, read in
    # the same snapshot). A reindex that re-chunks writes a new one beside the live one.
    def chunk_ids_of(
        self, name: str, document_ids: Iterable[str], *, chunking: str | None = None
    ) -> dict[str, list[str]]:
        """``document_id -> [chunk_id, ...]`` (by position) for the stored ones of ``document_ids``."""

    def get_chunks(
        self, name: str, chunk_ids: Sequence[str], *, with_tokens: bool = False, chunking: str | None = None
    ) -> dict[str, StoredChunk]:
        """Chunks by id (missing ids absent); ``tokens`` is ``[]`` unless ``with_tokens``."""

    def bm25_rows(
        self, name: str, *, chunking: str | None = None
    ) -> tuple[int, list[tuple[str, str, list[str], dict[str, Any]]]]:
        """``(seq, [(chunk_id, document_id, tokens, payload), ...])`` in insertion order, one snapshot."""

    def bm25_chunk_ids(self, name: str, *, chunking: str | None = None) -> tuple[int, list[str]]:
        """``(seq, ids)`` of the chunks with tokens, in insertion order, one snapshot."""

    def replace_chunks(
        self, name: str, chunking: str, document_ids: Sequence[str], chunks: Sequence[StoredChunk]
    ) -> None:
        """In one transaction: drop the ``chunking`` chunks of ``document_ids``, insert ``chunks`` (no seq)."""

    def drop_chunking(self, name: str, chunking: str) -> int:
        """Delete every chunk of ``chunking``; returns the rows deleted."""

    def pending_deletes(self, name: str) -> list[str]:
        """Chunk ids whose vectors a committed write meant to delete but has not yet."""

    def clear_pending(self, name: str, chunk_ids: Sequence[str]) -> None:
        """Forget pending deletes once the vector store has done them."""

    def counts(self, name: str, *, chunking: str | None = None) -> tuple[int, int]:
        """``(documents, chunks)`` stored for a collection (the chunks of ``chunking``)."""

    def document_ids(self, name: str, *, after: str | None = None, limit: int | None = None) -> list[str]:
        """Stored document ids of a collection in id order, from the first after ``after`` (keyset paging).

        Args:
            name: Collection.
            after: Start after this id (a page's last id); ``None``: from the first.
            limit: At most this many; ``None``: all.
        """

    def write_batch(
        self,
        name: str,
        documents: Sequence[StoredDocument | tuple[str, str]],
        chunks: Sequence[StoredChunk],
        deleted_chunk_ids: Sequence[str],
        deleted_document_ids: Sequence[str] = (),
        config: dict[str, Any] | None = None,
        pending: Sequence[str] = (),
    ) -> int:
        """Apply one ingestion batch atomically with the next seq and its change-log rows; returns the seq.

        Its chunks go to the live version's chunking (read in the same transaction).
        """

    def change_log_since(self, name: str, seq: int, *, limit: int = 10_000) -> list[Change]:
        """Change-log rows after ``seq`` in (seq, document_id) order, whole seqs only, about ``limit`` rows."""

    # --- physical versions ----------------------------------------------------
    def create_version(self, name: str, version: CollectionVersion) -> None:
        """Record a new physical version (``Conflict`` if that number exists)."""

    def list_versions(self, name: str) -> list[CollectionVersion]:
        """The collection's versions, oldest first."""

    def get_version(self, name: str, version: int) -> CollectionVersion | None:
        """One version, or ``None``."""

    def set_version_state(
        self, name: str, version: int, state: VersionState, *, retire_after: float | None = None
    ) -> None:
        """Set a version's state (and its ``retire_after``, when given)."""

    def set_live_version(self, name: str, version: int, *, retire_after: float | None = None) -> None:
        """In one transaction: ``live_version = version``, it ``live``, the previous live one ``retired``."""

    # --- leases (one reindex per collection, one runner per job) ---------------------------
    def acquire_lease(self, name: str, owner: str, ttl_s: float) -> bool:
        """Take the lease if free, lapsed or already ``owner``'s (compare-and-set); ``True`` if held."""

    def renew_lease(self, name: str, owner: str, ttl_s: float) -> bool:
        """Extend ``owner``'s lease to now + ``ttl_s``; ``False`` if another holds it or none exists."""

    def release_lease(self, name: str, owner: str) -> bool:
        """Drop ``owner``'s lease; ``False`` if it was not theirs."""

    def get_lease(self, name: str) -> Lease | None:
        """The lease row (lapsed or not), or ``None``."""

    # --- jobs (issues 22, 23) --------------------------------------------------------------
    def create_job(
        self, kind: str, *, collection: str | None = None, params: dict[str, Any] | None = None,
        state: str = "queued", job_id: str | None = None,
    ) -> Job:
        """Insert a job (a random hex id unless ``job_id``)."""

    def get_job(self, job_id: str) -> Job | None:
        """One job, or ``None``."""

    def update_job(
        self, job_id: str, *, state: str | None = None, cursor: str | None = None,
        counters: dict[str, int] | None = None, error: str | None = None,
    ) -> Job:
        """Set the given fields (counters replace the stored ones); ``NotFound`` if unknown."""

    def list_jobs(self, *, collection: str | None = None, state: str | None = None, limit: int = 100) -> list[Job]:
        """Jobs, newest first, optionally of one collection or state."""

    def claim_job(self, job_id: str, owner: str, ttl_s: float) -> bool:
        """The job's lease, as :meth:`acquire_lease` (renews when ``owner`` holds it)."""

    def release_job(self, job_id: str, owner: str) -> bool:
        """Drop ``owner``'s lease on the job."""

    # --- tenants, API keys, audit -------------------------------------------------
    def create_tenant(self, tenant_id: str, name: str) -> None:
        """Insert a tenant (``Conflict`` if it exists)."""

    def list_tenants(self) -> list[tuple[str, str]]:
        """``[(id, name), ...]`` sorted by id."""

    def insert_api_key(self, key: ApiKeyRecord) -> None:
        """Store a key record (``created_at`` 0 means now)."""

    def get_api_key(self, key_id: str) -> ApiKeyRecord | None:
        """A key by id, revoked or not."""

    def find_api_keys(self, prefix: str) -> list[ApiKeyRecord]:
        """The keys with this display prefix (revoked too: the caller checks)."""

    def list_api_keys(self, tenant_id: str | None = None) -> list[ApiKeyRecord]:
        """Keys, oldest first, optionally of one tenant."""

    def any_api_key(self) -> bool:
        """Whether any key exists (revoked ones too)."""

    def revoke_api_key(self, key_id: str) -> bool:
        """Set ``revoked_at`` to now; ``False`` if unknown or already revoked."""

    def get_rollout(self, name: str) -> Rollout | None:
        """The collection's newest rollout (:mod:`indexing.rollout`), or ``None``; cached until a commit."""

    def put_rollout(self, rollout: Rollout, *, expect: Rollout | None = None) -> bool:
        """Write the collection's rollout unless its row no longer holds ``expect``; whether it was written."""

    def get_query_references(self, name: str, physical: str) -> dict[str, dict[str, Any]]:
        """``signal -> {"sum", "n"}``: a version's query-drift references (:mod:`monitoring.drift`)."""

    def put_query_reference(self, name: str, physical: str, signal: str, body: dict[str, Any]) -> dict[str, Any]:
        """Keep ``body`` as a version's ``signal`` reference unless one is kept already; the one kept."""

    def append_audit(self, entry: AuditEntry) -> int:
        """Append an audit row (``at`` 0 means now); returns its id."""

    def list_audit(
        self, *, tenant_id: str | None = None, since: float = 0.0, limit: int = 100, after_id: int = 0,
    ) -> list[AuditEntry]:
        """Audit rows at or after ``since`` with an id over ``after_id``, in the order appended (ids)."""


DocStore = StateStore  # the name the service's modules have always used


def open_docstore(
    url: str, data_dir: Path, *, pool_size: int = 8, connect_timeout_s: float = 10.0, timeout_s: float = 5.0
) -> StateStore:
    """Open the state of record a URL names (see the module table).

    Args:
        url: ``""`` (SQLite under ``data_dir``), ``sqlite:///abs/path.sqlite`` (the absolute path
            after ``sqlite://``) or
            ``postgresql://user@host:port/db``.
        data_dir: Where the default SQLite file lives.
        pool_size: Most connections (and threads that run calls).
        connect_timeout_s: Longest wait for the first PostgreSQL connection.
        timeout_s: Every call's deadline (``QUARRY_DOCSTORE__TIMEOUT_S``).

    Raises:
        ConfigError: Unknown scheme (the message lists the supported ones), or psycopg is
            missing for a PostgreSQL URL (names the extra).
        StoreError: The database cannot be opened or migrated (``StateStoreUnavailable``: unreachable).
    """
    scheme = urlsplit(url).scheme.lower() if url else "sqlite"
    if scheme == "sqlite":
        from indexing.state_sqlite import SqliteState

        path = Path(urlsplit(url).path) if url else data_dir / "docstore.sqlite"
        return SqliteState(path, timeout_s=timeout_s, pool_size=pool_size)
    if scheme in ("postgresql", "postgres"):
        try:
            from indexing.state_postgres import PostgresState
        except ImportError as exc:
            raise missing_extra(exc.name or "psycopg", "pgvector") from exc
        return PostgresState(url, pool_size=pool_size, connect_timeout_s=connect_timeout_s, timeout_s=timeout_s)
    raise ConfigError(f"unsupported docstore URL scheme {scheme!r}; supported: {', '.join(SCHEMES)}")
