"""The docstore: collections' configuration and every chunk's text, tokens and payload.

It is the source of truth beside the vector store (SQLite in WAL mode, one file under the data
dir): ingestion diffs against it to decide what to embed, the BM25 channel is rebuilt from its
token lists, and search hits take their text and metadata from it. Each collection carries a
``version`` that every committed write bumps, so BM25 snapshots know when they are stale.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quarry.errors import StoreError, StoreUnavailable

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


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


_SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (
    name TEXT PRIMARY KEY, config TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS documents (
    collection TEXT NOT NULL, document_id TEXT NOT NULL, content_hash TEXT NOT NULL,
    PRIMARY KEY (collection, document_id)
);
CREATE TABLE IF NOT EXISTS chunks (
    collection TEXT NOT NULL, chunk_id TEXT NOT NULL, document_id TEXT NOT NULL,
    position INTEGER NOT NULL, text TEXT NOT NULL, tokens TEXT NOT NULL, payload TEXT NOT NULL,
    PRIMARY KEY (collection, chunk_id)
);
CREATE INDEX IF NOT EXISTS chunks_by_document ON chunks (collection, document_id);
CREATE TABLE IF NOT EXISTS pending_deletes (
    collection TEXT NOT NULL, chunk_id TEXT NOT NULL, PRIMARY KEY (collection, chunk_id)
);
"""


@dataclass(frozen=True)
class StoredChunk:
    """A chunk as the docstore keeps it."""

    chunk_id: str
    document_id: str
    position: int
    text: str
    tokens: list[str]
    payload: dict[str, Any]


class DocStore:
    """Thread-safe SQLite docstore (one connection, serialised by a lock)."""

    def __init__(self, path: Path) -> None:
        """Open (or create) the docstore at ``path``.

        Raises:
            StoreError: The file is not an SQLite database (damaged, or another file), or it or
                its folder cannot be opened; the message names the file.
        """
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.executescript(_SCHEMA)
            except sqlite3.DatabaseError:
                self._db.close()
                raise
        except (sqlite3.DatabaseError, OSError) as exc:  # e.g. "file is not a database"
            raise StoreError(
                f"cannot open the docstore {path}: {exc}; it holds every chunk's text: restore it from a "
                "backup, or move it away to start empty and ingest again"
            ) from exc
        self._lock = threading.RLock()

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write: commits on success, rolls back on any error."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:  # "database is locked" after sqlite's busy timeout
                raise StoreUnavailable(
                    f"the docstore {self.path} is busy ({exc}): another process holds its write lock; retry",
                    retry_after_s=1.0,
                ) from exc
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # --- collections -------------------------------------------------------------------
    def collection_config(self, name: str) -> dict[str, Any] | None:
        """The stored configuration of a collection, or ``None``."""
        with self._lock:
            row = self._db.execute("SELECT config FROM collections WHERE name=?", (name,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def list_collections(self) -> list[str]:
        """Names of all collections, sorted."""
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT name FROM collections ORDER BY name")]

    def put_collection(self, name: str, config: dict[str, Any]) -> None:
        """Create or replace a collection's configuration."""
        with self.transaction() as db:
            db.execute(
                "INSERT INTO collections(name, config) VALUES(?, ?) "
                "ON CONFLICT(name) DO UPDATE SET config=excluded.config",
                (name, json.dumps(config)),
            )

    def drop_collection(self, name: str) -> None:
        """Delete a collection with all its documents and chunks."""
        with self.transaction() as db:
            for table in ("chunks", "documents", "pending_deletes"):
                db.execute(f"DELETE FROM {table} WHERE collection=?", (name,))  # noqa: S608
            db.execute("DELETE FROM collections WHERE name=?", (name,))

    def version(self, name: str) -> int:
        """The collection's write counter."""
        with self._lock:
            row = self._db.execute("SELECT version FROM collections WHERE name=?", (name,)).fetchone()
        return 0 if row is None else int(row[0])

    # --- documents and chunks ----------------------------------------------------------
    def document_hashes(self, name: str, document_ids: Iterable[str]) -> dict[str, str]:
        """``document_id -> content_hash`` for those of ``document_ids`` that are stored."""
        ids = list(document_ids)
        out: dict[str, str] = {}
        with self._lock:
            for part in _batches(ids, 500):
                marks = ",".join("?" * len(part))
                out.update(
                    self._db.execute(
                        f"SELECT document_id, content_hash FROM documents "  # noqa: S608
                        f"WHERE collection=? AND document_id IN ({marks})",
                        (name, *part),
                    ).fetchall()
                )
        return out

    def chunk_ids_of(self, name: str, document_ids: Iterable[str]) -> dict[str, list[str]]:
        """``document_id -> [chunk_id, ...]`` for the stored documents among ``document_ids``."""
        out: dict[str, list[str]] = {}
        with self._lock:
            for part in _batches(list(document_ids), 500):
                marks = ",".join("?" * len(part))
                rows = self._db.execute(
                    f"SELECT document_id, chunk_id FROM chunks "  # noqa: S608
                    f"WHERE collection=? AND document_id IN ({marks}) ORDER BY position",
                    (name, *part),
                )
                for doc_id, chunk_id in rows:
                    out.setdefault(doc_id, []).append(chunk_id)
        return out

    def get_chunks(self, name: str, chunk_ids: Sequence[str], *, with_tokens: bool = False) -> dict[str, StoredChunk]:
        """Chunks by id (missing ids are absent from the result).

        Args:
            name: Collection.
            chunk_ids: Ids to fetch.
            with_tokens: Decode the BM25 token lists too; without it ``tokens`` is ``[]`` (the
                query path shows texts and payloads only).
        """
        tokens = "tokens" if with_tokens else "'[]'"
        rows: list[Any] = []
        with self._lock:  # JSON is decoded after the lock is released
            for part in _batches(list(chunk_ids), 500):
                marks = ",".join("?" * len(part))
                rows += self._db.execute(
                    f"SELECT chunk_id, document_id, position, text, {tokens}, payload FROM chunks "  # noqa: S608
                    f"WHERE collection=? AND chunk_id IN ({marks})",
                    (name, *part),
                ).fetchall()
        return {r[0]: StoredChunk(r[0], r[1], r[2], r[3], json.loads(r[4]), _payload(r[5])) for r in rows}

    def bm25_rows(self, name: str) -> tuple[int, list[tuple[str, str, list[str], dict[str, Any]]]]:
        """``(version, [(chunk_id, document_id, tokens, payload), ...])`` in insertion order."""
        with self._lock:
            version = self.version(name)
            rows = self._db.execute(
                "SELECT chunk_id, document_id, tokens, payload FROM chunks WHERE collection=? ORDER BY rowid",
                (name,),
            ).fetchall()
        return version, [(r[0], r[1], json.loads(r[2]), _payload(r[3])) for r in rows]

    def bm25_chunk_ids(self, name: str) -> tuple[int, list[str]]:
        """``(version, chunk ids)`` of the chunks with BM25 tokens, in insertion order.

        The rows a BM25 snapshot of this version holds (:meth:`bm25_rows` without the chunks
        that have no token): what a loaded snapshot is checked against.
        """
        with self._lock:
            version = self.version(name)
            rows = self._db.execute(
                "SELECT chunk_id FROM chunks WHERE collection=? AND tokens != '[]' ORDER BY rowid", (name,)
            ).fetchall()
        return version, [r[0] for r in rows]

    def pending_deletes(self, name: str) -> list[str]:
        """Chunk ids whose vectors a write meant to delete but has not yet (see :meth:`write_batch`)."""
        with self._lock:
            rows = self._db.execute("SELECT chunk_id FROM pending_deletes WHERE collection=?", (name,))
            return [r[0] for r in rows]

    def clear_pending(self, name: str, chunk_ids: Sequence[str]) -> None:
        """Forget pending deletes once the vector store has done them."""
        with self.transaction() as db:
            db.executemany(
                "DELETE FROM pending_deletes WHERE collection=? AND chunk_id=?", [(name, c) for c in chunk_ids]
            )

    def counts(self, name: str) -> tuple[int, int]:
        """``(documents, chunks)`` stored for a collection."""
        with self._lock:
            docs = self._db.execute("SELECT COUNT(*) FROM documents WHERE collection=?", (name,)).fetchone()[0]
            chunks = self._db.execute("SELECT COUNT(*) FROM chunks WHERE collection=?", (name,)).fetchone()[0]
        return int(docs), int(chunks)

    def document_ids(self, name: str, *, after: str | None = None, limit: int | None = None) -> list[str]:
        """Stored document ids of a collection in id order, from the first after ``after`` (keyset paging).

        Args:
            name: Collection.
            after: Start after this id (a page's last id); ``None``: from the first.
            limit: At most this many; ``None``: all.
        """
        with self._lock:
            rows = self._db.execute(
                "SELECT document_id FROM documents WHERE collection=? AND document_id > ? ORDER BY document_id LIMIT ?",
                (name, after if after is not None else "", -1 if limit is None else limit),
            ).fetchall()
        return [r[0] for r in rows]

    def write_batch(
        self,
        name: str,
        documents: Sequence[tuple[str, str]],
        chunks: Sequence[StoredChunk],
        deleted_chunk_ids: Sequence[str],
        deleted_document_ids: Sequence[str] = (),
        config: dict[str, Any] | None = None,
        pending: Sequence[str] = (),
    ) -> None:
        """Apply one ingestion batch atomically and bump the collection's version.

        Args:
            name: Collection.
            documents: ``(document_id, content_hash)`` to insert or replace.
            chunks: Chunks to insert or replace (no longer pending deletion, if they were).
            deleted_chunk_ids: Chunks to remove (stale chunks of changed documents).
            deleted_document_ids: Documents to remove entirely (their chunks too).
            config: New collection configuration (e.g. a widened metadata schema), if changed.
            pending: Chunk ids whose vectors are to be deleted from the vector store after this
                commit: recorded with it, so a failed vector delete is retried by the next write
                (:meth:`pending_deletes`) instead of leaving orphans nothing knows of.
        """
        with self.transaction() as db:
            db.executemany(
                "INSERT OR IGNORE INTO pending_deletes(collection, chunk_id) VALUES(?,?)",
                [(name, c) for c in pending],
            )
            db.executemany(
                "DELETE FROM pending_deletes WHERE collection=? AND chunk_id=?",
                [(name, c.chunk_id) for c in chunks],
            )
            db.executemany(
                "INSERT OR REPLACE INTO documents(collection, document_id, content_hash) VALUES(?,?,?)",
                [(name, d, h) for d, h in documents],
            )
            db.executemany(
                "DELETE FROM chunks WHERE collection=? AND chunk_id=?",
                [(name, c) for c in deleted_chunk_ids],
            )
            for doc in deleted_document_ids:
                db.execute("DELETE FROM chunks WHERE collection=? AND document_id=?", (name, doc))
                db.execute("DELETE FROM documents WHERE collection=? AND document_id=?", (name, doc))
            db.executemany(
                "INSERT OR REPLACE INTO chunks VALUES(?,?,?,?,?,?,?)",
                [
                    (name, c.chunk_id, c.document_id, c.position, c.text, json.dumps(c.tokens), json.dumps(c.payload))
                    for c in chunks
                ],
            )
            if config is not None:
                db.execute("UPDATE collections SET config=? WHERE name=?", (json.dumps(config), name))
            db.execute("UPDATE collections SET version=version+1 WHERE name=?", (name,))


def _batches(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
