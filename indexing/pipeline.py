"""The ingestion pipeline: documents -> chunks -> embeddings -> vector store + docstore + BM25.

Per batch of documents, nothing is written until every chunk of the batch is embedded; then the
vector store is written (compensated on failure), then the docstore commits in one transaction,
then stale vectors are removed. A re-run is idempotent:

* an unchanged document (same content hash) is skipped: zero embedding calls;
* a changed document gets fresh chunks; chunks whose text is unchanged keep their vectors
  (fetched from the store, not re-embedded) and its old chunks are deleted from both channels;
* a deleted document loses every chunk in both channels.

Chunk ids are deterministic: ``<document_id>:<position>:<sha256(indexed text)[:12]>``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

import numpy as np
import numpy.typing as npt

from embedding.base import Embedder
from indexing.bm25_registry import BM25Registry
from indexing.collections import CollectionConfig, model_mismatch
from indexing.docstore import DocStore, StoredChunk, StoredDocument
from indexing.document_plan import document_hash, merge_schema, plan_chunks
from indexing.document_rules import SourceDocument, check_sizes
from quarry.errors import ModelDimensionMismatch
from stores.base import VectorRecord, VectorStore
from stores.filters import FieldType

log = logging.getLogger(__name__)
FloatVector = npt.NDArray[np.float32]

Progress = Callable[[int], None]
Watch = Callable[[str, int, int], None]
"""Progress inside a batch, ``watch(stage, done, total)``:

* ``("planned", documents, chunks)``: the batch is chunked; ``documents`` changed ones, ``chunks`` to embed;
* ``("embedding", embedded, chunks)``: after each embedding sub-batch (``QUARRY_EMBEDDING__BATCH_SIZE``
  texts), the batch's chunks embedded so far;
* ``("written", chunks, chunks)``: the batch is committed.

A watch may raise :class:`Abandoned` at ``planned`` or ``embedding`` (before anything of the batch is
written): the batch is dropped whole, the earlier ones stay.
"""


class Abandoned(Exception):  # noqa: N818 - a request to stop, not an error
    """Raised by a :data:`Watch` to drop the batch in flight (a cancelled job); nothing of it is written."""
# Chunks planned and embedded elsewhere (the Ray engine): document id -> [(chunk, indexed text, vector)]
Prepared = list[tuple[StoredChunk, str, FloatVector]]
Precomputed = MutableMapping[str, Prepared]


@dataclass
class IngestReport:
    """What one ingestion run did (counts of documents and chunks, seconds)."""

    documents: int = 0
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    chunks_written: int = 0
    chunks_deleted: int = 0
    embedded: int = 0
    truncated: int = 0
    elapsed_s: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    """Where a write's vectors go: the live version's physical store collection and its model.

    Attributes:
        physical: The store collection of the collection's live version (``indexing.versions``).
        embedder: The model of that version (vectors of another model never go in).
    """

    physical: str
    embedder: Embedder


@dataclass
class _Planned:
    chunks: list[StoredChunk]
    texts: dict[str, str]
    hashes: list[StoredDocument]  # the changed documents, with their new hash and full text
    stale: list[str]


class Ingestor:
    """Writes documents into one collection's three places (vectors, docstore, BM25)."""

    def __init__(
        self,
        store: VectorStore,
        docstore: DocStore,
        embedder: Embedder,
        bm25: BM25Registry,
        *,
        batch_size: int = 512,
        embed_batch_size: int = 64,
        max_document_chars: int = 1_000_000,
        max_token_chars: int = 1024,
        watched_call_s: float = 0.0,
    ) -> None:
        """Bind the stores, the model and the batch sizes.

        ``watched_call_s``: with a :data:`Watch` (a job), the most seconds one model call should
        take (0: no limit). The sub-batch then starts at 8 texts and is sized from the last call's
        seconds per text, between 1 and ``embed_batch_size``: on a slow CPU a watcher still sees
        progress, and a cancel lands, about that often. Without a watch it is always
        ``embed_batch_size``.
        """
        self._watched_call_s = watched_call_s
        self._store = store
        self._docstore = docstore
        self._embedder = embedder
        self._bm25 = bm25
        self._batch_size = batch_size
        self._embed_batch_size = embed_batch_size
        self._max_document_chars = max_document_chars
        self._max_token_chars = max_token_chars

    def upsert(
        self,
        cfg: CollectionConfig,
        docs: Sequence[SourceDocument],
        progress: Progress | None = None,
        *,
        atomic: bool = False,
        target: Target | None = None,
        watch: Watch | None = None,
    ) -> IngestReport:
        """Insert or replace documents, in batches of ``batch_size`` (each batch is atomic).

        Args:
            cfg: The target collection.
            target: The live version's store collection and model (default: ``cfg.name`` and
                the ingestor's embedder).
            docs: Validated documents (see :mod:`indexing.sources`).
            progress: Called with the number of documents finished after each batch.
            atomic: All of ``docs`` in one batch: written whole or not at all (a REST request).
            watch: Progress inside each batch (see :data:`Watch`).

        Returns:
            Counts of what was added, updated, skipped and embedded.

        Raises:
            InvalidDocument: A metadata type conflicts with the collection, or a document holds a
                word over ``max_token_chars`` (nothing written).
            PayloadTooLarge: A document is over ``max_document_chars`` (nothing written).
            ModelMismatch: The collection's vectors come from another model, or one of another
                dimension (``ModelDimensionMismatch``); nothing written.
            EmbeddingError: The model failed (the failing batch wrote nothing).
            StoreError: The vector store failed (the failing batch is rolled back).
            Abandoned: ``watch`` dropped the batch in flight (the earlier batches stay written).
        """
        started = time.perf_counter()
        report = IngestReport(documents=len(docs))
        check_sizes(docs, max_document_chars=self._max_document_chars, max_token_chars=self._max_token_chars)
        target = target or Target(cfg.name, self._embedder)
        self._flush_pending(cfg.name, target)
        schema = merge_schema(cfg, docs)
        if schema is not None:
            cfg = cfg.model_copy(update={"schema_": schema})
        size = max(1, len(docs)) if atomic else self._batch_size
        for i in range(0, len(docs), size):
            batch = docs[i : i + size]
            self._upsert_batch(cfg, batch, report, schema, target, watch=watch)
            schema = None
            if progress is not None:
                progress(len(batch))
        self._bm25.invalidate(cfg.name)
        report.elapsed_s = time.perf_counter() - started
        return report

    def upsert_stream(
        self,
        cfg: CollectionConfig,
        docs: Iterable[SourceDocument],
        progress: Progress | None = None,
        *,
        stop: Callable[[], bool] | None = None,
        seen: set[str] | None = None,
        target: Target | None = None,
        vectors: Precomputed | None = None,
        watch: Watch | None = None,
    ) -> IngestReport:
        """Insert or replace a stream of documents, ``batch_size`` at a time (each batch atomic).

        Memory holds one batch: ``docs`` is consumed lazily. Sizes and the metadata schema are
        checked per batch, so a batch that breaks a rule fails after the earlier ones are written
        (a re-run is idempotent: they are then unchanged).

        Args:
            cfg: The target collection.
            docs: Validated documents, e.g. a :class:`indexing.sources.Source`.
            progress: Called with the number of documents finished after each batch.
            stop: Asked after each batch; ``True`` ends the run there (``report.extra["stopped"]``).
            seen: When given, every document id read is added to it (for pruning).
            target: The live version's store collection and model (default: ``cfg.name`` and
                the ingestor's embedder).
            vectors: Chunks planned and embedded elsewhere (the Ray engine's workers), by
                document id, filled before ``docs`` yields the document; a batch takes (pops)
                its documents' entries instead of chunking and embedding them (an unchanged
                document is skipped all the same). The vectors must come from the target's
                model (its fingerprint is checked as for local embedding).
            watch: Progress inside each batch (see :data:`Watch`).

        Returns:
            The counts, ``documents`` being those written or found unchanged (``embedded``
            counts this process's model calls only).

        Raises:
            As :meth:`upsert`, for the failing batch (earlier batches stay written).
        """
        started = time.perf_counter()
        report = IngestReport()
        target = target or Target(cfg.name, self._embedder)
        self._flush_pending(cfg.name, target)
        iterator = iter(docs)
        try:
            while batch := list(islice(iterator, self._batch_size)):
                check_sizes(batch, max_document_chars=self._max_document_chars, max_token_chars=self._max_token_chars)
                schema = merge_schema(cfg, batch)
                if schema is not None:
                    cfg = cfg.model_copy(update={"schema_": schema})
                prepared = {d.id: vectors.pop(d.id) for d in batch if d.id in vectors} if vectors is not None else {}
                self._upsert_batch(cfg, batch, report, schema, target, prepared, watch=watch)
                report.documents += len(batch)
                if seen is not None:
                    seen.update(d.id for d in batch)
                if progress is not None:
                    progress(len(batch))
                if stop is not None and stop():
                    report.extra["stopped"] = True
                    break
        finally:
            self._bm25.invalidate(cfg.name)
            report.elapsed_s = time.perf_counter() - started
        return report

    def delete(
        self, cfg: CollectionConfig, document_ids: Sequence[str], target: Target | None = None
    ) -> IngestReport:
        """Delete documents (and all their chunks) from both channels; unknown ids are ignored.

        The docstore commits first, recording the chunks' vectors as pending deletes; then the
        vectors go. If the vector store fails, the documents are already gone from search
        (hits are hydrated from the docstore) and the next write to the collection (or this
        call again) deletes the vectors left.

        Raises:
            StoreError: The vector store failed (the vectors stay pending deletion).
        """
        started = time.perf_counter()
        owned = self._docstore.chunk_ids_of(cfg.name, document_ids)
        chunk_ids = [c for ids in owned.values() for c in ids]
        known = list(self._docstore.document_hashes(cfg.name, document_ids))
        self._docstore.write_batch(cfg.name, [], [], [], deleted_document_ids=known, pending=chunk_ids)
        self._bm25.invalidate(cfg.name)
        self._flush_pending(cfg.name, target or Target(cfg.name, self._embedder))
        return IngestReport(
            documents=len(document_ids),
            deleted=len(known),
            chunks_deleted=len(chunk_ids),
            elapsed_s=time.perf_counter() - started,
        )

    def _upsert_batch(
        self,
        cfg: CollectionConfig,
        docs: Sequence[SourceDocument],
        report: IngestReport,
        schema: dict[str, FieldType] | None,
        target: Target,
        prepared: dict[str, Prepared] | None = None,
        *,
        watch: Watch | None = None,
    ) -> None:
        planned = self._plan(cfg, docs, report, prepared or {})
        if not planned.hashes and schema is None:
            if watch is not None:
                watch("written", 0, 0)
            return
        changed = {d.document_id for d in planned.hashes}
        given = {c.chunk_id: v for d, ps in (prepared or {}).items() if d in changed for c, _, v in ps}
        if given:
            self._check_given(cfg, target.embedder, given)
        owned = self._docstore.chunk_ids_of(cfg.name, [d.document_id for d in planned.hashes])
        existing = {c for ids in owned.values() for c in ids}
        reuse = [c.chunk_id for c in planned.chunks if c.chunk_id in existing and c.chunk_id not in given]
        kept = self._existing_vectors(target, reuse)
        to_embed = [c for c in planned.chunks if c.chunk_id not in kept and c.chunk_id not in given]
        if watch is not None:
            watch("planned", len(planned.hashes), len(to_embed))
        vectors = self._embed(cfg, [planned.texts[c.chunk_id] for c in to_embed], report, target.embedder, watch)
        fresh = {**given, **dict(zip((c.chunk_id for c in to_embed), vectors, strict=True))}
        known = {**kept, **fresh}
        records = [VectorRecord(c.chunk_id, known[c.chunk_id], dict(c.payload)) for c in planned.chunks]
        try:
            if records:
                self._store.upsert(target.physical, records)
            self._docstore.write_batch(
                cfg.name, planned.hashes, planned.chunks, planned.stale,
                config=cfg.to_json() if schema is not None else None, pending=planned.stale,
            )
        except BaseException:
            restore = {**kept, **{c: v for c, v in given.items() if c in existing}}  # same text: same vector
            self._compensate(cfg.name, target.physical, [c for c in fresh if c not in existing], restore)
            raise
        if planned.stale:
            self._flush_pending(cfg.name, target)
        report.chunks_written += len(records)
        report.chunks_deleted += len(planned.stale)
        if watch is not None:
            watch("written", len(records), len(records))

    def _plan(
        self, cfg: CollectionConfig, docs: Sequence[SourceDocument], report: IngestReport,
        prepared: dict[str, Prepared],
    ) -> _Planned:
        stored = self._docstore.document_hashes(cfg.name, [d.id for d in docs])
        changed = []
        hashes = []
        for doc in docs:
            digest = document_hash(doc, cfg)
            if stored.get(doc.id) == digest:
                report.unchanged += 1
                continue
            if doc.id in stored:
                report.updated += 1
            else:
                report.added += 1
            changed.append(doc)
            hashes.append(StoredDocument(doc.id, digest, doc.title, doc.text, dict(doc.metadata)))
        old = self._docstore.chunk_ids_of(cfg.name, [d.id for d in changed])
        chunks, texts = [], {}
        for doc in changed:
            pairs = [(c, t) for c, t, _ in prepared[doc.id]] if doc.id in prepared else plan_chunks(cfg, doc)
            for chunk, text in pairs:
                chunks.append(chunk)
                texts[chunk.chunk_id] = text
        fresh = {c.chunk_id for c in chunks}
        stale = [c for ids in old.values() for c in ids if c not in fresh]
        return _Planned(chunks, texts, hashes, stale)

    def _embed(
        self, cfg: CollectionConfig, texts: list[str], report: IngestReport, embedder: Embedder | None = None,
        watch: Watch | None = None,
    ) -> list[FloatVector]:
        model = embedder or self._embedder
        out: list[FloatVector] = []
        if texts:
            model.warm_up()  # a remote model's id is known once it answered
            if model.dim != cfg.dim:
                dims = {"expected": cfg.dim, "got": model.dim}
                raise ModelDimensionMismatch(cfg.name, model.model_id, **dims)
            self._check_model(cfg, model)
        truncated: list[int] = []
        paced = watch is not None and self._watched_call_s > 0
        size = min(self._embed_batch_size, 8) if paced else self._embed_batch_size
        i = 0
        while i < len(texts):
            part = texts[i : i + size]
            started = time.perf_counter()
            result = model.embed(part)
            i += len(part)
            if paced:  # the next call's size from this one's seconds per text
                per_text = (time.perf_counter() - started) / len(part)
                fits = int(self._watched_call_s / per_text) if per_text > 0 else self._embed_batch_size
                size = max(1, min(self._embed_batch_size, fits))
            truncated.append(int(result.truncated.sum()))
            if result.vectors.shape[1] != cfg.dim:
                raise ModelDimensionMismatch(
                    cfg.name, model.model_id, expected=cfg.dim, got=result.vectors.shape[1]
                )
            out.extend(result.vectors)
            if watch is not None:  # may raise Abandoned: nothing of this batch is written yet
                watch("embedding", len(out), len(texts))
        report.embedded += len(out)  # counted once the batch's texts are all embedded (an abandoned one: none)
        report.truncated += sum(int(r) for r in truncated)
        return out

    def _check_given(self, cfg: CollectionConfig, model: Embedder, given: dict[str, FloatVector]) -> None:
        """Vectors embedded elsewhere go in only under the collection's model and dimension.

        Raises:
            ModelDimensionMismatch: A vector is not ``cfg.dim`` long.
            ModelMismatch: The target's model is not the collection's.
        """
        model.warm_up()
        bad = next((v for v in given.values() if v.shape != (cfg.dim,)), None)
        if bad is not None:
            raise ModelDimensionMismatch(cfg.name, model.model_id, expected=cfg.dim, got=int(bad.shape[-1]))
        self._check_model(cfg, model)

    def _check_model(self, cfg: CollectionConfig, model: Embedder) -> None:
        """Refuse another model's vectors; record the fingerprint of a collection that had none.

        Raises:
            ModelMismatch: The embedder is not the collection's model (409).
        """
        fingerprint = model.fingerprint
        mismatch = model_mismatch(cfg, model.model_id, fingerprint)
        if mismatch is not None:
            raise mismatch
        if cfg.embedding_fingerprint is None and fingerprint:  # made before fingerprints: adopt
            stored = self._docstore.collection_config(cfg.name)
            if stored is not None:
                self._docstore.put_collection(cfg.name, {**stored, "embedding_fingerprint": fingerprint})
            cfg.embedding_fingerprint = fingerprint  # a config this batch writes keeps it
            log.info("collection %r: recorded model %r's fingerprint %s", cfg.name, cfg.embedding_model, fingerprint)

    def _existing_vectors(self, target: Target, ids: list[str]) -> dict[str, FloatVector]:
        """Vectors already stored for unchanged chunks (re-used instead of re-embedded)."""
        if not ids:
            return {}
        return {r.id: r.vector for r in self._store.get(target.physical, ids)}

    def _flush_pending(self, collection: str, target: Target) -> None:
        """Delete the vectors an earlier write left pending (see ``StateStore.write_batch``).

        Raises:
            StoreError: The vector store failed (they stay pending).
        """
        ids = self._docstore.pending_deletes(collection)
        if ids:
            self._store.delete(target.physical, ids)
            self._docstore.clear_pending(collection, ids)

    def _compensate(self, collection: str, physical: str, fresh: list[str], kept: dict[str, FloatVector]) -> None:
        """Undo a batch's vector writes after its docstore commit failed.

        Deletes the vectors it added and puts back the payloads (metadata) the docstore still
        holds on the vectors it re-used, so filters keep agreeing with the docstore.
        """
        try:
            if fresh:
                self._store.delete(physical, fresh)
            if kept:
                old = self._docstore.get_chunks(collection, list(kept))
                self._store.upsert(
                    physical, [VectorRecord(i, kept[i], dict(c.payload)) for i, c in old.items() if i in kept]
                )
        except Exception:  # noqa: BLE001 - the original error is re-raised by the caller
            return

