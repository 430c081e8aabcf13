"""The SQL both state-of-record backends share: collections, documents, chunks, the change log.

A backend (:mod:`indexing.state_sqlite`, :mod:`indexing.state_postgres`) supplies a connection
as a :class:`Tx` (statements written with ``?`` marks, which it translates), the database's clock
as an SQL expression and the column that orders chunks by insertion. Every method here is one
transaction; JSON columns are text, times Unix seconds.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, Self

from indexing.docstore import DEFAULT_TENANT, Change, CollectionState, StoredChunk, StoredDocument, chunking_id_of
from quarry.errors import CollectionNotFound

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_BATCH = 500


def _int64(digits: str) -> int | str:
    """A JSON integer as an ``int`` when it fits 64 bits, else its digits as a string.

    Payloads written before metadata integers were checked may hold a wider one (``2**70``),
    which orjson, the filters and the stores cannot take: every search returning it was a 500.
    """
    value = int(digits)
    return value if _INT64_MIN <= value <= _INT64_MAX else digits


def _payload(text: str) -> dict[str, Any]:
    """A stored payload, integers past 64 bits read as strings (:func:`_int64`)."""
    return dict(json.loads(text, parse_int=_int64))


def _batches(items: list[str], size: int = _BATCH) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class Tx(Protocol):
    """One open transaction; SQL uses ``?`` marks."""

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """The first row, or ``None``."""

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Every row."""

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Execute; the number of rows changed."""

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Execute once per row of parameters."""


# the collection's surrogate id from (tenant, name), as a sub-query
CID = "(SELECT id FROM collections WHERE tenant_id = ? AND name = ?)"
# the chunking (JSON) of the collection's live version, from (tenant, name)
_LIVE_CHUNKING = (
    "SELECT v.chunking FROM collections AS c JOIN collection_versions AS v "
    "ON v.collection_id = c.id AND v.version = c.live_version WHERE c.tenant_id = ? AND c.name = ?"
)


class SqlBase:
    """What a backend provides to the shared SQL."""

    location: str
    now_sql: str  # the database's clock as Unix seconds
    chunk_order: str  # the column that orders chunks by insertion
    tenant: str = DEFAULT_TENANT

    def _read(self) -> AbstractContextManager[Tx]:
        """A read-only transaction that sees one snapshot."""
        raise NotImplementedError

    def _write(self) -> AbstractContextManager[Tx]:
        """A write transaction: commits on success, rolls back on any error.

        Raises:
            StoreUnavailable: Another writer holds the lock past the busy timeout, or the server
                is unreachable.
        """
        raise NotImplementedError

    def _key(self, name: str) -> tuple[str, str]:
        return (self.tenant, name)

    def _chunking(self, tx: Tx, name: str, chunking: str | None) -> str:
        """``chunking``, or (``None``) the chunking id of the collection's live version, in ``tx``'s snapshot."""
        if chunking is not None:
            return chunking
        row = tx.one(_LIVE_CHUNKING, self._key(name))
        return "" if row is None else chunking_id_of(json.loads(row[0] or "{}"))

    def for_tenant(self, tenant_id: str) -> Self:
        """A view of the same database whose collections, jobs and locks are ``tenant_id``'s.

        It shares this store's connections: close the store, not the view.
        """
        view = copy.copy(self)
        view.tenant = tenant_id
        return view


class SqlCollections(SqlBase):
    """Collections, documents, chunks and the change log over :class:`Tx`."""

    # --- collections -------------------------------------------------------------------
    def collection_config(self, name: str) -> dict[str, Any] | None:
        """The stored configuration of a collection, or ``None``."""
        with self._read() as tx:
            row = tx.one("SELECT config FROM collections WHERE tenant_id = ? AND name = ?", self._key(name))
        return None if row is None else dict(json.loads(row[0]))

    def collection_state(self, name: str) -> CollectionState | None:
        """The collection's id, live version, seq and live chunking id, or ``None``."""
        with self._read() as tx:
            row = tx.one(
                "SELECT id, tenant_id, name, live_version, seq, shared, created_at FROM collections "
                "WHERE tenant_id = ? AND name = ?",
                self._key(name),
            )
            chunking = "" if row is None else self._chunking(tx, name, None)
        if row is None:
            return None
        return CollectionState(
            int(row[0]), row[1], row[2], int(row[3]), int(row[4]), bool(row[5]), float(row[6]), chunking
        )

    def list_collections(self) -> list[str]:
        """Names of all collections, sorted."""
        with self._read() as tx:
            rows = tx.all("SELECT name FROM collections WHERE tenant_id = ? ORDER BY name", (self.tenant,))
        return [r[0] for r in rows]

    def put_collection(self, name: str, config: dict[str, Any]) -> None:
        """Create a collection or replace its configuration (takes no seq)."""
        with self._write() as tx:
            tx.run(
                "INSERT INTO collections (tenant_id, name, config, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (tenant_id, name) DO UPDATE SET config = excluded.config",
                (*self._key(name), json.dumps(config), time.time()),
            )

    def drop_collection(self, name: str) -> None:
        """Delete a collection with its documents, chunks, change log and versions (jobs stay)."""
        with self._write() as tx:
            row = tx.one("SELECT id FROM collections WHERE tenant_id = ? AND name = ?", self._key(name))
            if row is None:
                return
            for table in ("chunks", "documents", "pending_deletes", "change_log", "collection_versions"):
                tx.run(f"DELETE FROM {table} WHERE collection_id = ?", (row[0],))  # noqa: S608
            tx.run("DELETE FROM collections WHERE id = ?", (row[0],))

    def version(self, name: str) -> int:
        """The collection's ``seq`` (0 for an unknown one)."""
        with self._read() as tx:
            row = tx.one("SELECT seq FROM collections WHERE tenant_id = ? AND name = ?", self._key(name))
        return 0 if row is None else int(row[0])

    # --- documents ---------------------------------------------------------------------
    def document_hashes(self, name: str, document_ids: Iterable[str]) -> dict[str, str]:
        """``document_id -> content_hash`` for those of ``document_ids`` that are stored."""
        out: dict[str, str] = {}
        with self._read() as tx:
            for part in _batches(list(document_ids)):
                marks = ",".join("?" * len(part))
                rows = tx.all(
                    f"SELECT document_id, content_hash FROM documents "  # noqa: S608
                    f"WHERE collection_id = {CID} AND document_id IN ({marks})",
                    (*self._key(name), *part),
                )
                out.update((r[0], r[1]) for r in rows)
        return out

    def get_documents(self, name: str, document_ids: Sequence[str]) -> dict[str, StoredDocument]:
        """Stored documents by id, with title, full text and metadata (missing ids absent)."""
        rows: list[tuple[Any, ...]] = []
        with self._read() as tx:
            for part in _batches(list(document_ids)):
                marks = ",".join("?" * len(part))
                rows += tx.all(
                    f"SELECT {_DOC_COLUMNS} FROM documents "  # noqa: S608
                    f"WHERE collection_id = {CID} AND document_id IN ({marks})",
                    (*self._key(name), *part),
                )
        return {r[0]: _document(r) for r in rows}

    def list_documents(self, name: str, *, after: str = "", limit: int = 1000) -> list[StoredDocument]:
        """Up to ``limit`` documents with ids > ``after``, in id order (a reindex pages with it)."""
        with self._read() as tx:
            rows = tx.all(
                f"SELECT {_DOC_COLUMNS} FROM documents WHERE collection_id = {CID} "  # noqa: S608
                "AND document_id > ? ORDER BY document_id LIMIT ?",
                (*self._key(name), after, limit),
            )
        return [_document(r) for r in rows]

    def document_ids(self, name: str, *, after: str | None = None, limit: int | None = None) -> list[str]:
        """Stored document ids in id order after ``after`` (keyset paging); ``limit`` ``None``: all."""
        with self._read() as tx:
            rows = tx.all(
                f"SELECT document_id FROM documents WHERE collection_id = {CID} "  # noqa: S608
                "AND document_id > ? ORDER BY document_id" + ("" if limit is None else " LIMIT ?"),
                (*self._key(name), after or "", *(() if limit is None else (limit,))),
            )
        return [r[0] for r in rows]

    # --- chunks ------------------------------------------------------------------------
    def chunk_ids_of(
        self, name: str, document_ids: Iterable[str], *, chunking: str | None = None
    ) -> dict[str, list[str]]:
        """``document_id -> [chunk_id, ...]`` (by position) for the stored ones of ``document_ids``.

        ``chunking``: the chunking id whose chunks to read (``None``: the live version's).
        """
        out: dict[str, list[str]] = {}
        with self._read() as tx:
            cid = self._chunking(tx, name, chunking)
            for part in _batches(list(document_ids)):
                marks = ",".join("?" * len(part))
                rows = tx.all(
                    f"SELECT document_id, chunk_id FROM chunks WHERE collection_id = {CID} "  # noqa: S608
                    f"AND chunking_id = ? AND document_id IN ({marks}) ORDER BY position",
                    (*self._key(name), cid, *part),
                )
                for doc_id, chunk_id in rows:
                    out.setdefault(doc_id, []).append(chunk_id)
        return out

    def get_chunks(
        self, name: str, chunk_ids: Sequence[str], *, with_tokens: bool = False, chunking: str | None = None
    ) -> dict[str, StoredChunk]:
        """Chunks by id (missing ids are absent from the result).

        Args:
            name: Collection.
            chunk_ids: Ids to fetch.
            with_tokens: Decode the BM25 token lists too; without it ``tokens`` is ``[]`` (the
                query path shows texts and payloads only).
            chunking: The chunking id whose chunks to read (``None``: the live version's).
        """
        tokens = "tokens" if with_tokens else "'[]'"
        rows: list[tuple[Any, ...]] = []
        with self._read() as tx:  # JSON is decoded after the transaction
            cid = self._chunking(tx, name, chunking)
            for part in _batches(list(chunk_ids)):
                marks = ",".join("?" * len(part))
                rows += tx.all(
                    f"SELECT chunk_id, document_id, position, text, {tokens}, payload FROM chunks "  # noqa: S608
                    f"WHERE collection_id = {CID} AND chunking_id = ? AND chunk_id IN ({marks})",
                    (*self._key(name), cid, *part),
                )
        return {r[0]: StoredChunk(r[0], r[1], r[2], r[3], json.loads(r[4]), _payload(r[5])) for r in rows}

    def bm25_rows(
        self, name: str, *, chunking: str | None = None
    ) -> tuple[int, list[tuple[str, str, list[str], dict[str, Any]]]]:
        """``(seq, [(chunk_id, document_id, tokens, payload), ...])`` in insertion order, one snapshot.

        ``chunking``: the chunking id whose chunks to read (``None``: the live version's).
        """
        with self._read() as tx:
            seq = tx.one("SELECT seq FROM collections WHERE tenant_id = ? AND name = ?", self._key(name))
            rows = tx.all(
                f"SELECT chunk_id, document_id, tokens, payload FROM chunks WHERE collection_id = {CID} "  # noqa: S608
                f"AND chunking_id = ? ORDER BY {self.chunk_order}",
                (*self._key(name), self._chunking(tx, name, chunking)),
            )
        return (0 if seq is None else int(seq[0])), [(r[0], r[1], json.loads(r[2]), _payload(r[3])) for r in rows]

    def bm25_chunk_ids(self, name: str, *, chunking: str | None = None) -> tuple[int, list[str]]:
        """``(seq, chunk ids)`` of the chunks with BM25 tokens, in insertion order, one snapshot.

        The rows a BM25 snapshot of this seq holds (:meth:`bm25_rows` without the chunks that
        have no token): what a loaded snapshot is checked against. ``chunking``: as
        :meth:`bm25_rows`.
        """
        with self._read() as tx:
            seq = tx.one("SELECT seq FROM collections WHERE tenant_id = ? AND name = ?", self._key(name))
            rows = tx.all(
                f"SELECT chunk_id FROM chunks WHERE collection_id = {CID} AND chunking_id = ? "  # noqa: S608
                f"AND tokens != '[]' ORDER BY {self.chunk_order}",
                (*self._key(name), self._chunking(tx, name, chunking)),
            )
        return (0 if seq is None else int(seq[0])), [r[0] for r in rows]

    def pending_deletes(self, name: str) -> list[str]:
        """Chunk ids whose vectors a committed write meant to delete but has not yet (see :meth:`write_batch`)."""
        with self._read() as tx:
            rows = tx.all(
                f"SELECT chunk_id FROM pending_deletes WHERE collection_id = {CID} AND version = 0",  # noqa: S608
                self._key(name),
            )
        return [r[0] for r in rows]

    def clear_pending(self, name: str, chunk_ids: Sequence[str]) -> None:
        """Forget pending deletes once the vector store has done them."""
        with self._write() as tx:
            row = tx.one("SELECT id FROM collections WHERE tenant_id = ? AND name = ?", self._key(name))
            if row is not None:
                tx.many(
                    "DELETE FROM pending_deletes WHERE collection_id = ? AND version = 0 AND chunk_id = ?",
                    [(row[0], c) for c in chunk_ids],
                )

    def counts(self, name: str, *, chunking: str | None = None) -> tuple[int, int]:
        """``(documents, chunks)`` stored for a collection (chunks of ``chunking``; ``None``: the live one)."""
        with self._read() as tx:
            docs = tx.one(f"SELECT COUNT(*) FROM documents WHERE collection_id = {CID}", self._key(name))  # noqa: S608
            chunks = tx.one(
                f"SELECT COUNT(*) FROM chunks WHERE collection_id = {CID} AND chunking_id = ?",  # noqa: S608
                (*self._key(name), self._chunking(tx, name, chunking)),
            )
        return int(docs[0] if docs else 0), int(chunks[0] if chunks else 0)

    def replace_chunks(
        self, name: str, chunking: str, document_ids: Sequence[str], chunks: Sequence[StoredChunk]
    ) -> None:
        """In one transaction: drop the ``chunking`` chunks of ``document_ids``, insert ``chunks``.

        A reindex that re-chunks writes its new chunking with it (no seq, no change-log row: the
        documents did not change); ``chunks`` belong to ``document_ids``.

        Raises:
            CollectionNotFound: No such collection.
        """
        with self._write() as tx:
            row = tx.one("SELECT id FROM collections WHERE tenant_id = ? AND name = ?", self._key(name))
            if row is None:
                raise CollectionNotFound(name)
            cid = int(row[0])
            tx.many(
                "DELETE FROM chunks WHERE collection_id = ? AND chunking_id = ? AND document_id = ?",
                [(cid, chunking, d) for d in document_ids],
            )
            tx.many(_INSERT_CHUNK, [(cid, chunking, *_chunk_row(c)) for c in chunks])

    def drop_chunking(self, name: str, chunking: str) -> int:
        """Delete every chunk of ``chunking`` (a version's, once no version uses it); returns the rows deleted."""
        with self._write() as tx:
            return tx.run(
                f"DELETE FROM chunks WHERE collection_id = {CID} AND chunking_id = ?",  # noqa: S608
                (*self._key(name), chunking),
            )

    # --- the write path ------------------------------------------------------------------
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
        """Apply one ingestion batch atomically, at the collection's next seq.

        The seq is taken first (``UPDATE collections SET seq = seq + 1 ... RETURNING``): on
        PostgreSQL its row lock serialises the writers of one collection across processes until
        this transaction ends; SQLite's write lock does the same for the whole file.

        Args:
            name: Collection.
            documents: Documents to insert or replace: :class:`StoredDocument` (with full text),
                or ``(document_id, content_hash)`` (no text kept). Each gets an ``upsert`` row in
                the change log.
            chunks: Chunks to insert or replace (no longer pending deletion, if they were).
            deleted_chunk_ids: Chunks to remove (stale chunks of changed documents).
            deleted_document_ids: Documents to remove entirely (their chunks too); each gets a
                ``delete`` row in the change log.
            config: New collection configuration (e.g. a widened metadata schema), if changed.
            pending: Chunk ids whose vectors are to be deleted from the vector store after this
                commit: recorded with it, so a failed vector delete is retried by the next write
                (:meth:`pending_deletes`) instead of leaving orphans nothing knows of.

        Returns:
            The collection's new seq.

        Raises:
            CollectionNotFound: The collection does not exist (dropped meanwhile): nothing written.
            StoreUnavailable: The database is locked past its busy timeout, or unreachable.
        """
        docs = [d if isinstance(d, StoredDocument) else StoredDocument(d[0], d[1]) for d in documents]
        now = time.time()
        with self._write() as tx:
            row = tx.one(
                "UPDATE collections SET seq = seq + 1 WHERE tenant_id = ? AND name = ? RETURNING id, seq, tenant_id",
                self._key(name),
            )
            if row is None:
                raise CollectionNotFound(name)
            cid, seq, tenant = int(row[0]), int(row[1]), row[2]
            chunking = self._chunking(tx, name, None)  # the live version's (a reindex replays into its own)
            tx.many(
                "INSERT INTO pending_deletes (collection_id, version, chunk_id) VALUES (?, 0, ?) "
                "ON CONFLICT DO NOTHING",
                [(cid, c) for c in pending],
            )
            tx.many(
                "DELETE FROM pending_deletes WHERE collection_id = ? AND version = 0 AND chunk_id = ?",
                [(cid, c.chunk_id) for c in chunks],
            )
            tx.many(_UPSERT_DOCUMENT, [_document_row(cid, tenant, seq, d) for d in docs])
            tx.many(
                "DELETE FROM chunks WHERE collection_id = ? AND chunking_id = ? AND chunk_id = ?",
                [(cid, chunking, c) for c in [*deleted_chunk_ids, *(c.chunk_id for c in chunks)]],
            )
            for doc in deleted_document_ids:
                tx.run(
                    "DELETE FROM chunks WHERE collection_id = ? AND chunking_id = ? AND document_id = ?",
                    (cid, chunking, doc),
                )
                tx.run("DELETE FROM documents WHERE collection_id = ? AND document_id = ?", (cid, doc))
            tx.many(_INSERT_CHUNK, [(cid, chunking, *_chunk_row(c)) for c in chunks])
            changes: list[tuple[Any, ...]] = [(cid, seq, d.document_id, "upsert", d.content_hash, now) for d in docs]
            changes += [(cid, seq, d, "delete", None, now) for d in deleted_document_ids]
            tx.many(
                "INSERT INTO change_log (collection_id, seq, document_id, op, content_hash, at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (collection_id, seq, document_id) "
                "DO UPDATE SET op = excluded.op, content_hash = excluded.content_hash",
                changes,
            )
            if config is not None:
                tx.run("UPDATE collections SET config = ? WHERE id = ?", (json.dumps(config), cid))
        return seq

    def change_log_since(self, name: str, seq: int, *, limit: int = 10_000) -> list[Change]:
        """Change-log rows after ``seq``, in ``(seq, document_id)`` order.

        Whole seqs only: the rows of the last seq read are all returned even past ``limit``,
        so a follower that resumes after the last seq it saw misses nothing.
        """
        with self._read() as tx:
            last = tx.one(
                f"SELECT MAX(seq) FROM (SELECT seq FROM change_log WHERE collection_id = {CID} "  # noqa: S608
                "AND seq > ? ORDER BY seq LIMIT ?) AS head",
                (*self._key(name), seq, limit),
            )
            if last is None or last[0] is None:
                return []
            rows = tx.all(
                f"SELECT seq, op, document_id, content_hash, at FROM change_log WHERE collection_id = {CID} "  # noqa: S608
                "AND seq > ? AND seq <= ? ORDER BY seq, document_id",
                (*self._key(name), seq, last[0]),
            )
        return [Change(int(r[0]), r[1], r[2], r[3], float(r[4])) for r in rows]


_DOC_COLUMNS = "document_id, content_hash, title, text, metadata, updated_seq"
_INSERT_CHUNK = (
    "INSERT INTO chunks (collection_id, chunking_id, chunk_id, document_id, position, text, tokens, payload) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def _chunk_row(c: StoredChunk) -> tuple[Any, ...]:
    return (c.chunk_id, c.document_id, c.position, c.text, json.dumps(c.tokens), json.dumps(c.payload))
_UPSERT_DOCUMENT = (
    "INSERT INTO documents (collection_id, document_id, tenant_id, content_hash, title, text, metadata, "
    "updated_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (collection_id, document_id) DO UPDATE SET "
    "content_hash = excluded.content_hash, title = excluded.title, text = excluded.text, "
    "metadata = excluded.metadata, updated_seq = excluded.updated_seq"
)


def _document_row(cid: int, tenant: str, seq: int, d: StoredDocument) -> tuple[Any, ...]:
    metadata = None if d.metadata is None else json.dumps(d.metadata)
    return (cid, d.document_id, tenant, d.content_hash, d.title, d.text, metadata, seq)


def _document(r: tuple[Any, ...]) -> StoredDocument:
    return StoredDocument(r[0], r[1], r[2], r[3], None if r[4] is None else _payload(r[4]), int(r[5]))
