"""The queries of collections, documents, chunks and the change log (SQLAlchemy Core, both dialects).

Over 500 lines by design: every statement of the state of record's collections, documents,
chunks and change log, built once at import, in one module for both dialects.

Every method is one transaction (:mod:`indexing.state_db`); JSON columns are text, times Unix
seconds. Statements are built once, at import, with bound parameters: SQLAlchemy renders each
for the dialect and caches its compiled form; ``IN`` lists are expanding parameters.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy import bindparam as bp

from indexing.docstore import Change, CollectionState, StoredChunk, StoredDocument, chunking_id_of
from indexing.schema import (
    change_log,
    chunks,
    collection_versions,
    collections,
    documents,
    pending_deletes,
    query_references,
    rollouts,
)
from indexing.state_db import SqlBase, cached, first, loads, many, timed, timed_bulk
from indexing.state_dialect import json_id, json_in
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


_LONG_NUMBER = re.compile(r"\d{19}")  # could be past 64 bits: the careful parser


def _payload(text: str) -> dict[str, Any]:
    """A stored payload, integers past 64 bits read as strings (:func:`_int64`).

    orjson (several times faster: search hydration decodes every hit's payload) unless a number
    of 19 digits or more, or something only the ``json`` module reads (NaN, a lone surrogate), is in it.
    """
    if _LONG_NUMBER.search(text) is None:
        try:
            return dict(orjson.loads(text))
        except orjson.JSONDecodeError:
            pass
    return dict(json.loads(text, parse_int=_int64))


def _batches(items: list[str], size: int = _BATCH) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


_C, _D, _K, _P, _L, _V = collections.c, documents.c, chunks.c, pending_deletes.c, change_log.c, collection_versions.c
_NAMED = sa.and_(_C.tenant_id == bp("tenant"), _C.name == bp("cname"))
CID = sa.select(_C.id).where(_NAMED).scalar_subquery()  # the collection's id from (tenant, name)


_IDS = bp("ids", type_=sa.Text())
# the chunking id of the collection's live version, from (tenant, name), in the reader's snapshot
# (indexing.docstore.chunking_id_of: "" for the original chunking, or when no version row exists)
LIVE_CHUNKING_ID = sa.func.coalesce(
    sa.select(json_id(_V.chunking)).select_from(
        collections.join(collection_versions, sa.and_(_V.collection_id == _C.id, _V.version == _C.live_version))
    ).where(_NAMED).scalar_subquery(),
    "",
)
_LIVE_CHUNKING = sa.select(_V.chunking).select_from(
    collections.join(collection_versions, sa.and_(_V.collection_id == _C.id, _V.version == _C.live_version))
).where(_NAMED)
_COLLECTION_ID = sa.select(_C.id).where(_NAMED)
_CONFIG = sa.select(_C.config).where(_NAMED)
_STATE = sa.select(_C.id, _C.tenant_id, _C.name, _C.live_version, _C.seq, _C.shared, _C.created_at).where(_NAMED)
_SEQ = sa.select(_C.seq).where(_NAMED)
_NAMES = sa.select(_C.name).where(_C.tenant_id == bp("tenant")).order_by(_C.name)
_HASHES = sa.select(_D.document_id, _D.content_hash).where(
    _D.collection_id == CID, json_in(_D.document_id, _IDS)
)
_DOC_COLUMNS = (_D.document_id, _D.content_hash, _D.title, _D.text, _D.metadata, _D.updated_seq)
_DOCS = sa.select(*_DOC_COLUMNS).where(_D.collection_id == CID, json_in(_D.document_id, _IDS))
_DOC_PAGE = (
    sa.select(*_DOC_COLUMNS).where(_D.collection_id == CID, _D.document_id > bp("after"))
    .order_by(_D.document_id).limit(bp("limit"))
)
_DOC_IDS = (
    sa.select(_D.document_id).where(_D.collection_id == CID, _D.document_id > bp("after")).order_by(_D.document_id)
)
_IN_CHUNKING = sa.and_(_K.collection_id == CID, _K.chunking_id == bp("chunking"))
_CHUNK_IDS_OF = (
    sa.select(_K.document_id, _K.chunk_id).where(_IN_CHUNKING, json_in(_K.document_id, _IDS))
    .order_by(_K.position)
)
_CHUNK_COLUMNS = (_K.chunk_id, _K.document_id, _K.position, _K.text)
_CHUNKS = sa.select(*_CHUNK_COLUMNS, _K.payload).where(_IN_CHUNKING, json_in(_K.chunk_id, _IDS))
_LIVE_CHUNKS = sa.select(*_CHUNK_COLUMNS, _K.payload).where(
    _K.collection_id == CID, _K.chunking_id == LIVE_CHUNKING_ID, json_in(_K.chunk_id, _IDS)
)  # the search page's read: one statement
_CHUNKS_TOKENS = sa.select(*_CHUNK_COLUMNS, _K.payload, _K.tokens).where(
    _IN_CHUNKING, json_in(_K.chunk_id, _IDS)
)
_PENDING = sa.select(_P.chunk_id).where(_P.collection_id == CID, _P.version == 0)
_COUNT_DOCS = sa.select(sa.func.count()).select_from(documents).where(_D.collection_id == CID)
_COUNT_CHUNKS = sa.select(sa.func.count()).select_from(chunks).where(_IN_CHUNKING)
_DEL_CHUNK = chunks.delete().where(
    _K.collection_id == bp("cid"), _K.chunking_id == bp("chunking"), _K.chunk_id == bp("id")
)
_DEL_CHUNKS_OF = chunks.delete().where(
    _K.collection_id == bp("cid"), _K.chunking_id == bp("chunking"), _K.document_id == bp("id")
)
_DEL_DOC = documents.delete().where(_D.collection_id == bp("cid"), _D.document_id == bp("id"))
_DEL_PENDING = pending_deletes.delete().where(_P.collection_id == bp("cid"), _P.version == 0, _P.chunk_id == bp("id"))
_INSERT_CHUNK = sa.text(
    "INSERT INTO chunks (collection_id, chunking_id, chunk_id, document_id, position, text, tokens, payload) "
    "VALUES (:cid, :chunking, :chunk_id, :document_id, :position, :text, :tokens, :payload)"
)
_NEXT_SEQ = (
    collections.update().where(_NAMED).values(seq=_C.seq + 1).returning(_C.id, _C.seq, _C.tenant_id)
)
# Plain SQL where both dialects spell it the same (ON CONFLICT): SQLAlchemy binds the names.
_UPSERT_COLLECTION = sa.text(
    "INSERT INTO collections (tenant_id, name, config, created_at) VALUES (:tenant, :cname, :config, :at) "
    "ON CONFLICT (tenant_id, name) DO UPDATE SET config = excluded.config"
)
_ADD_PENDING = sa.text(
    "INSERT INTO pending_deletes (collection_id, version, chunk_id) VALUES (:cid, 0, :id) ON CONFLICT DO NOTHING"
)
_UPSERT_DOCUMENT = sa.text(
    "INSERT INTO documents (collection_id, document_id, tenant_id, content_hash, title, text, metadata, "
    "updated_seq) VALUES (:cid, :document_id, :tenant, :content_hash, :title, :text, :metadata, :seq) "
    "ON CONFLICT (collection_id, document_id) DO UPDATE SET content_hash = excluded.content_hash, "
    "title = excluded.title, text = excluded.text, metadata = excluded.metadata, updated_seq = excluded.updated_seq"
)
_LOG_CHANGE = sa.text(
    "INSERT INTO change_log (collection_id, seq, document_id, op, content_hash, at) "
    "VALUES (:cid, :seq, :document_id, :op, :content_hash, :at) ON CONFLICT (collection_id, seq, document_id) "
    "DO UPDATE SET op = excluded.op, content_hash = excluded.content_hash"
)
_LOG_HEAD: sa.Select[Any] = sa.select(sa.func.max(sa.literal_column("seq"))).select_from(
    sa.select(_L.seq).where(_L.collection_id == CID, _L.seq > bp("seq")).order_by(_L.seq).limit(bp("limit"))
    .subquery("head")
)
_LOG = (
    sa.select(_L.seq, _L.op, _L.document_id, _L.content_hash, _L.at)
    .where(_L.collection_id == CID, _L.seq > bp("seq"), _L.seq <= bp("last")).order_by(_L.seq, _L.document_id)
)


class SqlCollections(SqlBase):
    """Collections, documents, chunks and the change log."""

    def _key(self, name: str) -> dict[str, Any]:
        return {"tenant": self.tenant, "cname": name}

    def _chunking(self, conn: sa.Connection, name: str, chunking: str | None) -> str:
        """``chunking``, or (``None``) the chunking id of the collection's live version, in ``conn``'s snapshot."""
        if chunking is not None:
            return chunking
        row = first(conn, _LIVE_CHUNKING, self._key(name))
        raw = None if row is None else row[0]
        return "" if raw is None else chunking_id_of(loads(raw or "{}"))

    # --- collections -------------------------------------------------------------------
    def collection_config(self, name: str) -> dict[str, Any] | None:
        """The stored configuration of a collection, or ``None`` (cached until a commit)."""
        raw = self._config_text(name)
        return None if raw is None else dict(loads(raw))

    @cached("config")
    def _config_text(self, name: str) -> str | None:
        with self._read() as conn:
            return conn.execute(_CONFIG, self._key(name)).scalar()

    @cached("state")
    def collection_state(self, name: str) -> CollectionState | None:
        """The collection's id, live version, seq and live chunking id, or ``None`` (cached until a commit)."""
        with self._read() as conn:
            row = conn.execute(_STATE, self._key(name)).first()
            chunking = "" if row is None else self._chunking(conn, name, None)
        if row is None:
            return None
        return CollectionState(
            int(row[0]), row[1], row[2], int(row[3]), int(row[4]), bool(row[5]), float(row[6]), chunking
        )

    @timed
    def list_collections(self) -> list[str]:
        """Names of all collections, sorted."""
        with self._read() as conn:
            return list(conn.execute(_NAMES, {"tenant": self.tenant}).scalars())

    @timed
    def put_collection(self, name: str, config: dict[str, Any]) -> None:
        """Create a collection or replace its configuration (takes no seq)."""
        with self._write() as conn:
            conn.execute(_UPSERT_COLLECTION, {**self._key(name), "config": json.dumps(config), "at": time.time()})

    @timed_bulk
    def drop_collection(self, name: str) -> None:
        """Delete a collection with its documents, chunks, change log and versions (jobs stay)."""
        with self._write() as conn:
            cid = conn.execute(_COLLECTION_ID, self._key(name)).scalar()
            if cid is None:
                return
            for table in (chunks, documents, pending_deletes, change_log, collection_versions, rollouts,
                          query_references):
                conn.execute(table.delete().where(table.c.collection_id == cid))
            conn.execute(collections.delete().where(_C.id == cid))

    @cached("seq")
    def version(self, name: str) -> int:
        """The collection's ``seq`` (0 for an unknown one; cached until a commit)."""
        with self._read() as conn:
            seq = conn.execute(_SEQ, self._key(name)).scalar()
        return 0 if seq is None else int(seq)

    # --- documents ---------------------------------------------------------------------
    @timed
    def document_hashes(self, name: str, document_ids: Iterable[str]) -> dict[str, str]:
        """``document_id -> content_hash`` for those of ``document_ids`` that are stored."""
        out: dict[str, str] = {}
        with self._read() as conn:
            for part in _batches(list(document_ids)):
                out.update((r[0], r[1]) for r in conn.execute(_HASHES, {**self._key(name), "ids": json.dumps(part)}))
        return out

    @timed
    def get_documents(self, name: str, document_ids: Sequence[str]) -> dict[str, StoredDocument]:
        """Stored documents by id, with title, full text and metadata (missing ids absent)."""
        rows: list[Any] = []
        with self._read() as conn:
            for part in _batches(list(document_ids)):
                rows += conn.execute(_DOCS, {**self._key(name), "ids": json.dumps(part)}).all()
        return {r[0]: _document(r) for r in rows}

    @timed
    def list_documents(self, name: str, *, after: str = "", limit: int = 1000) -> list[StoredDocument]:
        """Up to ``limit`` documents with ids > ``after``, in id order (a reindex pages with it)."""
        with self._read() as conn:
            rows = conn.execute(_DOC_PAGE, {**self._key(name), "after": after, "limit": limit}).all()
        return [_document(r) for r in rows]

    @timed
    def document_ids(self, name: str, *, after: str | None = None, limit: int | None = None) -> list[str]:
        """Stored document ids in id order after ``after`` (keyset paging); ``limit`` ``None``: all."""
        query = _DOC_IDS if limit is None else _DOC_IDS.limit(limit)
        with self._read() as conn:
            return list(conn.execute(query, {**self._key(name), "after": after or ""}).scalars())

    # --- chunks ------------------------------------------------------------------------
    @timed
    def chunk_ids_of(
        self, name: str, document_ids: Iterable[str], *, chunking: str | None = None
    ) -> dict[str, list[str]]:
        """``document_id -> [chunk_id, ...]`` (by position) for the stored ones of ``document_ids``.

        ``chunking``: the chunking id whose chunks to read (``None``: the live version's).
        """
        out: dict[str, list[str]] = {}
        with self._read() as conn:
            key = {**self._key(name), "chunking": self._chunking(conn, name, chunking)}
            for part in _batches(list(document_ids)):
                for doc_id, chunk_id in conn.execute(_CHUNK_IDS_OF, {**key, "ids": json.dumps(part)}):
                    out.setdefault(doc_id, []).append(chunk_id)
        return out

    @timed
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
        query = _CHUNKS_TOKENS if with_tokens else _CHUNKS
        rows: list[Any] = []
        if chunking is None and not with_tokens and len(chunk_ids) <= _BATCH:  # a search page: one statement
            rows = self._fetch(_LIVE_CHUNKS, {**self._key(name), "ids": json.dumps(list(chunk_ids))})
        else:
            with self._read() as conn:  # JSON is decoded after the transaction
                key = {**self._key(name), "chunking": self._chunking(conn, name, chunking)}
                for part in _batches(list(chunk_ids)):
                    rows += conn.execute(query, {**key, "ids": json.dumps(part)}).all()
        if with_tokens:
            return {r[0]: StoredChunk(r[0], r[1], r[2], r[3], loads(r[5]), _payload(r[4])) for r in rows}
        return {r[0]: StoredChunk(r[0], r[1], r[2], r[3], [], _payload(r[4])) for r in rows}

    @timed_bulk
    def bm25_rows(
        self, name: str, *, chunking: str | None = None
    ) -> tuple[int, list[tuple[str, str, list[str], dict[str, Any]]]]:
        """``(seq, [(chunk_id, document_id, tokens, payload), ...])`` in insertion order, one snapshot.

        ``chunking``: the chunking id whose chunks to read (``None``: the live version's).
        """
        query = sa.select(_K.chunk_id, _K.document_id, _K.tokens, _K.payload).where(_IN_CHUNKING)
        with self._read() as conn:
            seq = conn.execute(_SEQ, self._key(name)).scalar()
            key = {**self._key(name), "chunking": self._chunking(conn, name, chunking)}
            rows = conn.execute(query.order_by(self.chunk_order), key).all()
        return (0 if seq is None else int(seq)), [(r[0], r[1], loads(r[2]), _payload(r[3])) for r in rows]

    @timed_bulk
    def bm25_chunk_ids(self, name: str, *, chunking: str | None = None) -> tuple[int, list[str]]:
        """``(seq, chunk ids)`` of the chunks with BM25 tokens, in insertion order, one snapshot.

        The rows a BM25 snapshot of this seq holds (:meth:`bm25_rows` without the chunks that
        have no token): what a loaded snapshot is checked against. ``chunking``: as
        :meth:`bm25_rows`.
        """
        query = sa.select(_K.chunk_id).where(_IN_CHUNKING, _K.tokens != "[]").order_by(self.chunk_order)
        with self._read() as conn:
            seq = conn.execute(_SEQ, self._key(name)).scalar()
            key = {**self._key(name), "chunking": self._chunking(conn, name, chunking)}
            ids = list(conn.execute(query, key).scalars())
        return (0 if seq is None else int(seq)), ids

    @timed
    def pending_deletes(self, name: str) -> list[str]:
        """Chunk ids whose vectors a committed write meant to delete but has not yet (see :meth:`write_batch`)."""
        with self._read() as conn:
            return list(conn.execute(_PENDING, self._key(name)).scalars())

    @timed
    def clear_pending(self, name: str, chunk_ids: Sequence[str]) -> None:
        """Forget pending deletes once the vector store has done them."""
        with self._write(notify=False) as conn:
            cid = conn.execute(_COLLECTION_ID, self._key(name)).scalar()
            if cid is not None and chunk_ids:
                conn.execute(_DEL_PENDING, [{"cid": cid, "id": c} for c in chunk_ids])

    @timed
    def counts(self, name: str, *, chunking: str | None = None) -> tuple[int, int]:
        """``(documents, chunks)`` stored for a collection (chunks of ``chunking``; ``None``: the live one)."""
        with self._read() as conn:
            docs = conn.execute(_COUNT_DOCS, self._key(name)).scalar()
            key = {**self._key(name), "chunking": self._chunking(conn, name, chunking)}
            n_chunks = conn.execute(_COUNT_CHUNKS, key).scalar()
        return int(docs or 0), int(n_chunks or 0)

    def replace_chunks(
        self, name: str, chunking: str, document_ids: Sequence[str], chunks: Sequence[StoredChunk]
    ) -> None:
        """In one transaction: drop the ``chunking`` chunks of ``document_ids``, insert ``chunks``.

        A reindex that re-chunks writes its new chunking with it (no seq, no change-log row: the
        documents did not change); ``chunks`` belong to ``document_ids``.

        Raises:
            CollectionNotFound: No such collection.
        """
        rows = len(document_ids) + len(chunks)
        deadline_s = self.timeout_s + rows / 1000  # 1 s more per 1,000 rows
        self._calls.call_within(deadline_s, self._replace_chunks, name, chunking, document_ids, chunks)

    def _replace_chunks(
        self, name: str, chunking: str, document_ids: Sequence[str], chunks: Sequence[StoredChunk]
    ) -> None:
        with self._write(notify=False) as conn:
            cid = conn.execute(_COLLECTION_ID, self._key(name)).scalar()
            if cid is None:
                raise CollectionNotFound(name)
            many(conn, _DEL_CHUNKS_OF, [{"cid": cid, "chunking": chunking, "id": d} for d in document_ids])
            many(conn, _INSERT_CHUNK, [_chunk_row(cid, chunking, c) for c in chunks])

    @timed_bulk
    def drop_chunking(self, name: str, chunking: str) -> int:
        """Delete every chunk of ``chunking`` (a version's, once no version uses it); returns the rows deleted."""
        with self._write(notify=False) as conn:
            result = conn.execute(chunks.delete().where(_IN_CHUNKING), {**self._key(name), "chunking": chunking})
            return int(result.rowcount)

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
            StateStoreUnavailable: The database is locked past the deadline, or unreachable.
        """
        rows = len(documents) + len(chunks) + len(deleted_chunk_ids) + len(deleted_document_ids) + len(pending)
        return self._calls.call_within(  # the deadline grows with the batch: 1 s more per 1,000 rows
            self.timeout_s + rows / 1000, self._write_batch, name, documents, chunks, deleted_chunk_ids,
            deleted_document_ids, config, pending,
        )

    def _write_batch(
        self,
        name: str,
        documents: Sequence[StoredDocument | tuple[str, str]],
        chunks: Sequence[StoredChunk],
        deleted_chunk_ids: Sequence[str],
        deleted_document_ids: Sequence[str],
        config: dict[str, Any] | None,
        pending: Sequence[str],
    ) -> int:
        docs = [d if isinstance(d, StoredDocument) else StoredDocument(d[0], d[1]) for d in documents]
        now = time.time()
        with self._write() as conn:
            row = first(conn, _NEXT_SEQ, self._key(name))
            if row is None:
                raise CollectionNotFound(name)
            cid, seq, tenant = int(row[0]), int(row[1]), row[2]
            chunking = self._chunking(conn, name, None)  # the live version's (a reindex replays into its own)
            many(conn, _ADD_PENDING, [{"cid": cid, "id": c} for c in pending])
            many(conn, _DEL_PENDING, [{"cid": cid, "id": c.chunk_id} for c in chunks])
            many(conn, _UPSERT_DOCUMENT, [_document_row(cid, tenant, seq, d) for d in docs])
            gone = [*deleted_chunk_ids, *(c.chunk_id for c in chunks)]
            many(conn, _DEL_CHUNK, [{"cid": cid, "chunking": chunking, "id": c} for c in gone])
            many(conn, _DEL_CHUNKS_OF, [{"cid": cid, "chunking": chunking, "id": d} for d in deleted_document_ids])
            many(conn, _DEL_DOC, [{"cid": cid, "id": d} for d in deleted_document_ids])
            many(conn, _INSERT_CHUNK, [_chunk_row(cid, chunking, c) for c in chunks])
            changes = [_change(cid, seq, d.document_id, "upsert", d.content_hash, now) for d in docs]
            changes += [_change(cid, seq, d, "delete", None, now) for d in deleted_document_ids]
            many(conn, _LOG_CHANGE, changes)
            if config is not None:
                conn.execute(collections.update().where(_C.id == cid).values(config=json.dumps(config)))
        return seq

    @timed
    def change_log_since(self, name: str, seq: int, *, limit: int = 10_000) -> list[Change]:
        """Change-log rows after ``seq``, in ``(seq, document_id)`` order.

        Whole seqs only: the rows of the last seq read are all returned even past ``limit``,
        so a follower that resumes after the last seq it saw misses nothing.
        """
        with self._read() as conn:
            last = conn.execute(_LOG_HEAD, {**self._key(name), "seq": seq, "limit": limit}).scalar()
            if last is None:
                return []
            rows = conn.execute(_LOG, {**self._key(name), "seq": seq, "last": last}).all()
        return [Change(int(r[0]), r[1], r[2], r[3], float(r[4])) for r in rows]


def _chunk_row(cid: int, chunking: str, c: StoredChunk) -> dict[str, Any]:
    return {
        "cid": cid, "chunking": chunking, "chunk_id": c.chunk_id, "document_id": c.document_id,
        "position": c.position, "text": c.text, "tokens": json.dumps(c.tokens), "payload": json.dumps(c.payload),
    }


def _document_row(cid: int, tenant: str, seq: int, d: StoredDocument) -> dict[str, Any]:
    metadata = None if d.metadata is None else json.dumps(d.metadata)
    return {
        "cid": cid, "document_id": d.document_id, "tenant": tenant, "content_hash": d.content_hash,
        "title": d.title, "text": d.text, "metadata": metadata, "seq": seq,
    }


def _change(cid: int, seq: int, document_id: str, op: str, content_hash: str | None, at: float) -> dict[str, Any]:
    return {"cid": cid, "seq": seq, "document_id": document_id, "op": op, "content_hash": content_hash, "at": at}


def _document(r: Any) -> StoredDocument:
    return StoredDocument(r[0], r[1], r[2], r[3], None if r[4] is None else _payload(r[4]), int(r[5]))
