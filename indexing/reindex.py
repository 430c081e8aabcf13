"""Reindex: build version ``v+1`` of a collection beside the live one, check it, swap, roll back.

The steps (docs/design-state.md), each safe to interrupt before the swap:

1. take the collection's lease ``reindex:<name>`` (one reindex per collection, across processes
   sharing the state of record; renewed every batch, so a killed holder's lapses after
   ``QUARRY_REINDEX__LEASE_TTL_S``); versions a killed run left ``building`` are dropped;
2. read ``seq`` (``built_from_seq``), then page through the docstore's documents: for each
   chunk, copy its vector from the live version when the model is unchanged (store ``get``: no
   model call), else embed its text with the new model; re-plan the index for the current size
   (or build the one asked for);
3. replay the change log after ``built_from_seq`` (upserts *and* deletes: each changed document's
   vectors are deleted by ``document_id`` and its current chunks written again), in a few passes
   each bounded by the seq at its start (writes that never stop cannot keep it going); writes
   keep going to the live version meanwhile, under the collection's write lock, which the
   build does not hold;
4. verify recall, still without the lock: recall@10 of the new ANN index, searched at the
   searcher's depth as live searches are (``depth``), against the store's exact search
   (:func:`monitoring.exact.exact_recalls`), over a sample of its own vectors as queries, is
   at least ``QUARRY_REINDEX__RECALL_FLOOR``; replay the writes made meanwhile;
5. under the write lock, for as long as the last few writes take: replay what is left (no
   write can land between it and the swap), check that the vector count equals the docstore's
   chunk count (a failed check drops the new version, state ``failed``, and raises
   :class:`~quarry.errors.ReindexFailed`), then swap: ``live_version`` in the docstore (one
   transaction: Quarry's readers take the store collection and the query model from that
   row), then the store alias where ``<name>`` is not itself a physical collection; the old
   version stays ``retired`` until ``retire_after``.

With the chunking unchanged the new version shares the live version's chunks rows (and its BM25
index); how a reindex that re-chunks works, and a reindex's inputs and report: :mod:`indexing.reindex_build`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, NoReturn

from indexing.docstore import CollectionVersion, StateStore, StoredChunk, StoredDocument, chunking_id_of
from indexing.document_plan import indexed_text, plan_chunks
from indexing.document_rules import SourceDocument
from indexing.planner import IndexPlan
from indexing.reindex_build import Build, ReindexReport, clip_id, estimate_chunks, lease_name, sections_of
from indexing.versions import SUFFIX, chunking_of, new_chunking, same_chunking
from monitoring.exact import sampled_recall
from quarry.errors import ModelDimensionMismatch, ReindexFailed, ReindexRunning
from quarry.settings import ReindexSettings
from stores.base import IndexSpec, Metric, VectorRecord, VectorStore
from stores.filters import In

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (chunks done, chunks in total)
TOP_K = 10
CATCH_UP_PASSES = 3  # replays of the writes made meanwhile before the write lock is taken


class Reindexer:
    """Builds, verifies and swaps versions of collections (see the module docstring).

    Args:
        store: The vector store.
        docstore: The state of record.
        settings: ``QUARRY_REINDEX__*``.
        writing: The service's per-collection write lock (a context manager factory).
        plan: ``(vectors, dim) -> IndexPlan``, the planner with the service's budget and engine.
        index_timeout_s: Longest index build.
        depth: Candidates a live search asks the ANN for (``Searcher.depth``): the recall check
            searches as deep.

    Attributes:
        on_batch: Called with ``(phase, done)`` after every batch (``copy``, ``replay``, or
            ``final``: a replay under the write lock) and before the recall check (``verify``,
            0): a test injects a failure or concurrent writes there.
    """

    def __init__(
        self,
        store: VectorStore,
        docstore: StateStore,
        settings: ReindexSettings,
        writing: Callable[[str], AbstractContextManager[None]],
        plan: Callable[[int, int], IndexPlan],
        *,
        index_timeout_s: float = 600.0,
        depth: int = TOP_K,
    ) -> None:
        self._store = store
        self._depth = max(depth, TOP_K)
        self._docstore = docstore
        self._settings = settings
        self._writing = writing
        self._plan = plan
        self.plan = plan  # the schedule's growth trigger asks the same planner
        self._index_timeout_s = index_timeout_s
        self.on_batch: Callable[[str, int], None] | None = None

    # --- the lease ------------------------------------------------------------------------
    def acquire(self, name: str, owner: str) -> None:
        """Take the collection's reindex lease for ``owner``.

        Raises:
            ReindexRunning: Another owner holds it (and it has not lapsed).
        """
        if not self._docstore.acquire_lease(lease_name(name), owner, self._settings.lease_ttl_s):
            held = self._docstore.get_lease(lease_name(name))
            until = time.strftime("%H:%M:%S", time.gmtime(held.expires_at)) if held else ""
            who = f" by {held.owner} until {until} UTC" if held else ""
            raise ReindexRunning(f"a reindex of collection {name!r} is running (lease held{who})",
                                 retry_after_s=self._settings.lease_ttl_s)

    def _renew(self, name: str, owner: str) -> None:
        if not self._docstore.renew_lease(lease_name(name), owner, self._settings.lease_ttl_s):
            raise ReindexFailed(f"reindex of {name!r} lost its lease (it lapsed and another process took it)")

    # --- the build --------------------------------------------------------------------------
    def run(self, build: Build, owner: str, progress: Progress | None = None, *, swap: bool = True) -> ReindexReport:
        """Build, verify and swap the next version (the caller holds the lease as ``owner``).

        ``swap=False`` stops before the swap: the version is left ``candidate`` (a rollout's, see
        :mod:`indexing.rollout`), ``report.counters["seq"]`` the change-log position it holds.

        Raises:
            ReindexFailed: Verification failed, or the lease was lost; the live version serves.
            ModelDimensionMismatch: The model's vectors are not of its stated dimension.
            StoreError, EmbeddingError: A backend failed (the new version is left ``building``
                and dropped by the next run).
        """
        started = time.perf_counter()
        name = build.cfg.name
        self._drop_unfinished(name)
        number = max((v.version for v in self._docstore.list_versions(name)), default=1) + 1
        physical = f"{name}{SUFFIX}{number}"
        live_chunking = build.live.chunking or chunking_of(build.cfg)
        wanted = build.chunking
        if wanted is None or same_chunking(wanted, live_chunking):
            build = replace(build, chunking=dict(live_chunking))  # the same rows
        else:
            build = replace(build, chunking=new_chunking(number, wanted["chunk_size"], wanted["chunk_overlap"]))
        seq = self._docstore.version(name)
        documents, chunks = self._docstore.counts(name)
        if build.rechunk:  # planned for about as many vectors as the new cut makes
            chunks = estimate_chunks(chunks, live_chunking, build.chunking or {})
        dim = build.model.dim
        plan = self._plan(chunks, dim)
        spec = build.index or plan.spec
        record = CollectionVersion(
            version=number, physical_name=physical, state="building",
            model_fingerprint=build.model.fingerprint or None, model_name=build.model_url, dim=dim,
            chunking=dict(build.chunking or {}), analyzer=build.cfg.language,
            index_plan={"kind": spec.kind, "params": spec.params, "search_params": spec.search_params,
                        "reason": plan.reason if build.index is None else "asked for", "planned_for_vectors": chunks},
            built_from_seq=seq, created_at=time.time(),
        )
        self._docstore.create_version(name, record)
        self._store.drop_collection(physical)  # a leftover of a run killed before its row was written
        self._store.create_collection(physical, dim, build.cfg.metric)
        report = ReindexReport(version=number, previous=build.live.version)
        total = max(chunks, 1)
        for done in self._copy(build, physical, report, documents):
            self._renew(name, owner)
            if progress is not None:
                progress(min(done, total), total)
            if self.on_batch is not None:
                self.on_batch("copy", done)
        self._store.build_index(physical, spec, timeout_s=self._index_timeout_s)
        seq = self._catch_up(build, physical, seq, report, owner)  # the bulk of the writes made meanwhile
        self._docstore.set_version_state(name, number, "verifying")
        self._check_recall(build, physical, spec, report)  # without the write lock: writes go on
        seq = self._catch_up(build, physical, seq, report, owner)  # those made during the check
        if not swap:
            self._docstore.set_version_state(name, number, "candidate")
            report.chunks, report.counters["seq"] = self._store.count(physical), seq
            report.elapsed_s = time.perf_counter() - started
            return report
        with self._writing(name):  # held for the last few writes, the counts and the swap
            self._replay(build, physical, seq, report, phase="final")
            report.chunks = self._check_counts(build, physical, report)
            retire_after = time.time() + self._settings.retention_s
            self._docstore.set_live_version(name, number, retire_after=retire_after)
            self._point_alias(name, physical)
        report.elapsed_s = time.perf_counter() - started
        if progress is not None:
            progress(total, total)
        log.info("collection %r: version %d live (%d vectors, %d copied, %d embedded, %d replayed, recall %.3f)",
                 name, number, report.chunks, report.copied, report.embedded, report.replayed, report.recall or 0.0)
        self.purge(name)
        return report

    def _drop_unfinished(self, name: str) -> None:
        """Drop what a killed or failed run left (versions still ``building`` or ``verifying``, their chunks)."""
        for v in self._docstore.list_versions(name):
            if v.state in ("building", "verifying"):
                self._store.drop_collection(v.physical_name)
                self._docstore.set_version_state(name, v.version, "failed")
                self.drop_rows(name, v)
                log.warning("collection %r: dropped version %d left %s by an interrupted reindex", name, v.version,
                            v.state)

    def drop_rows(self, name: str, version: CollectionVersion) -> int:
        """Delete the chunks rows of ``version``'s chunking unless a version still in use has it.

        In use: live, retired (kept for rollback), building or verifying; the live chunking of
        the collection is never dropped. Returns the rows deleted.
        """
        chunking = chunking_id_of(version.chunking)
        state = self._docstore.collection_state(name)
        if state is None or state.chunking_id == chunking:
            return 0
        used = any(
            chunking_id_of(v.chunking) == chunking
            for v in self._docstore.list_versions(name)
            if v.version != version.version and v.state in ("live", "retired", "building", "verifying")
        )
        if used:
            return 0
        dropped = self._docstore.drop_chunking(name, chunking)
        if dropped:
            log.info("collection %r: deleted the %d chunks of chunking %r (version %d)", name, dropped,
                     chunking or "original", version.version)
        return dropped

    def _copy(self, build: Build, physical: str, report: ReindexReport, documents: int) -> Iterator[int]:
        """Write every stored document's chunks into ``physical``; yields chunks done after each batch."""
        name = build.cfg.name
        after = ""
        done = 0
        page = max(1, self._settings.batch_size // 4)  # documents per page (a few chunks each)
        while True:
            docs = self._docstore.list_documents(name, after=after, limit=page)
            if not docs:
                return
            after = docs[-1].document_id
            done += self._write_documents(build, physical, docs, report)
            yield done

    def _write_documents(
        self, build: Build, physical: str, docs: Sequence[StoredDocument], report: ReindexReport
    ) -> int:
        """Write the current chunks of ``docs`` into ``physical`` (vectors copied or embedded)."""
        if build.rechunk:
            return self._write_rechunked(build, physical, docs, report, ())
        name = build.cfg.name
        owned = self._docstore.chunk_ids_of(name, [d.document_id for d in docs], chunking=build.chunking_id)
        ids = [c for d in docs for c in owned.get(d.document_id, [])]
        if not ids:
            return 0
        chunks = self._docstore.get_chunks(name, ids, chunking=build.chunking_id)
        vectors: dict[str, Any] = {}
        if build.same_model:
            vectors = {r.id: r.vector for r in self._store.get(build.live.physical_name, ids)}
            report.copied += len(vectors)
        missing = [i for i in ids if i not in vectors and i in chunks]
        if missing:
            by_id = {d.document_id: d for d in docs}
            texts = []
            for chunk_id in missing:
                chunk = chunks[chunk_id]
                doc = by_id[chunk.document_id]
                texts.append(indexed_text(doc.title or "" if doc.text else "", chunk.text))
            vectors.update(zip(missing, self._embed(build, texts), strict=True))
            report.embedded += len(missing)
        records = [VectorRecord(i, vectors[i], dict(chunks[i].payload)) for i in ids if i in chunks]
        self._store.upsert(physical, records)
        return len(records)

    def _write_rechunked(
        self, build: Build, physical: str, docs: Sequence[StoredDocument], report: ReindexReport,
        clear: Sequence[str],
    ) -> int:
        """Cut ``docs`` anew into ``build``'s chunking (rows and vectors); ``clear``: documents whose rows go too.

        Raises:
            ReindexFailed: A document was stored without its text (before schema step 2).
        """
        name = build.cfg.name
        chunking = build.chunking or {}
        cfg = build.cfg.model_copy(
            update={"chunk_size": chunking["chunk_size"], "chunk_overlap": chunking["chunk_overlap"]}
        )
        live = chunking_id_of(build.live.chunking)
        ids = [d.document_id for d in docs]
        owned = self._docstore.chunk_ids_of(name, ids, chunking=live)
        old = self._docstore.get_chunks(name, [c for cs in owned.values() for c in cs], chunking=live)
        planned: list[tuple[StoredChunk, str]] = []
        for doc in docs:
            if doc.text is None:
                raise ReindexFailed(
                    f"document {clip_id(doc.document_id)} of {name!r} was stored without its text (before schema "
                    "step 2): it cannot be re-chunked; ingest it again, then re-run the reindex"
                )
            mine = [old[c] for c in owned.get(doc.document_id, []) if c in old]
            source = SourceDocument(doc.document_id, doc.text, doc.title or "", dict(doc.metadata or {}),
                                    sections_of(doc, mine))
            planned.extend(plan_chunks(cfg, source))
        self._docstore.replace_chunks(name, build.chunking_id, list(dict.fromkeys([*clear, *ids])),
                                      [c for c, _ in planned])
        vectors: dict[str, Any] = {}
        reuse = [c.chunk_id for c, _ in planned if c.chunk_id in old]  # same id: same indexed text
        if build.same_model and reuse:
            vectors = {r.id: r.vector for r in self._store.get(build.live.physical_name, reuse)}
            report.copied += len(vectors)
        missing = [(c.chunk_id, text) for c, text in planned if c.chunk_id not in vectors]
        if missing:
            vectors.update(zip([i for i, _ in missing], self._embed(build, [t for _, t in missing]), strict=True))
            report.embedded += len(missing)
        records = [VectorRecord(c.chunk_id, vectors[c.chunk_id], dict(c.payload)) for c, _ in planned]
        if records:
            self._store.upsert(physical, records)
        return len(records)

    def _embed(self, build: Build, texts: list[str]) -> list[Any]:
        out: list[Any] = []
        step = self._settings.batch_size
        for i in range(0, len(texts), step):
            result = build.model.embed(texts[i : i + step])
            if result.vectors.shape[1] != build.model.dim:
                raise ModelDimensionMismatch(build.cfg.name, build.model.model_id, expected=build.model.dim,
                                             got=int(result.vectors.shape[1]))
            out.extend(result.vectors)
        return out

    def _catch_up(self, build: Build, physical: str, seq: int, report: ReindexReport, owner: str) -> int:
        """Replay, without the write lock, the writes made since ``seq`` in a few bounded passes.

        Each pass replays up to the collection's seq at its start, so writes that keep coming
        cannot keep it going (a replay slower than the writes would never find the log empty);
        :data:`CATCH_UP_PASSES` passes leave the lock's final replay only the writes made during
        the last one. Returns the last seq applied.
        """
        name = build.cfg.name
        self._renew(name, owner)
        for _ in range(CATCH_UP_PASSES):
            target = self._docstore.version(name)
            if target <= seq:
                break
            seq = self._replay(build, physical, seq, report, until=target)
            self._renew(name, owner)
        return seq

    def _replay(
        self, build: Build, physical: str, seq: int, report: ReindexReport, *, until: int | None = None,
        phase: str = "replay",
    ) -> int:
        """Bring ``physical`` up to the docstore's changes after ``seq`` (up to ``until``, else all).

        ``phase`` names the batches to :attr:`on_batch` (``final``: under the write lock). Returns
        the last seq applied.
        """
        name = build.cfg.name
        while until is None or seq < until:
            changes = self._docstore.change_log_since(name, seq, limit=self._settings.batch_size)
            if not changes:
                return seq
            ids = sorted({c.document_id for c in changes})
            self.refresh(build, physical, ids, report)
            seq = changes[-1].seq
            if self.on_batch is not None:
                self.on_batch(phase, report.replayed)
        return seq

    def refresh(self, build: Build, physical: str, document_ids: Sequence[str], report: ReindexReport) -> None:
        """Make ``physical`` hold exactly the current chunks of ``document_ids`` (deleted ones: none)."""
        self._store.delete_by_filter(physical, In("document_id", tuple(document_ids)))
        current = self._docstore.get_documents(build.cfg.name, list(document_ids))
        docs = [current[i] for i in document_ids if i in current]
        if build.rechunk:  # its own rows: re-cut the changed ones, drop the deleted ones
            self._write_rechunked(build, physical, docs, report, document_ids)
        elif docs:
            self._write_documents(build, physical, docs, report)
        report.replayed += len(document_ids)

    # --- verification ---------------------------------------------------------------------
    def _check_recall(self, build: Build, physical: str, spec: IndexSpec, report: ReindexReport) -> None:
        """Measure the new index's recall (``report.recall``); drop the version and raise under the floor."""
        if self.on_batch is not None:
            self.on_batch("verify", 0)
        cfg = build.cfg
        report.recall = self.recall(cfg.name, physical, cfg.metric, chunking=build.chunking_id)
        floor = self._settings.recall_floor
        if report.recall < floor:
            self._fail(build, physical, report,
                       f"recall@{TOP_K} of its {spec.kind} index at depth {self._depth} is {report.recall:.3f} "
                       f"against exact search, under the floor {floor:g} (QUARRY_REINDEX__RECALL_FLOOR)")

    def _check_counts(self, build: Build, physical: str, report: ReindexReport) -> int:
        """The new version's vector count, once it equals the docstore's chunks (else dropped and raised)."""
        _, chunks = self._docstore.counts(build.cfg.name, chunking=build.chunking_id)
        vectors = self._store.count(physical)
        if vectors != chunks:
            self._fail(build, physical, report,
                       f"the new version holds {vectors} vectors, the docstore {chunks} chunks")
        return vectors

    def _fail(self, build: Build, physical: str, report: ReindexReport, reason: str) -> NoReturn:
        """Drop the version being built (state ``failed``, its store collection and rows) and raise.

        Raises:
            ReindexFailed: Always, with ``reason``; the live version serves.
        """
        name, number = build.cfg.name, report.version
        self._docstore.set_version_state(name, number, "failed")
        self._store.drop_collection(physical)
        failed = self._docstore.get_version(name, number)
        if failed is not None:
            self.drop_rows(name, failed)
        raise ReindexFailed(f"reindex of {name!r} to version {number} did not swap: {reason}; "
                            f"version {report.previous} still serves")

    def recall(self, name: str, physical: str, metric: Metric, *, chunking: str | None = None) -> float:
        """Tie-aware recall@10 of ``physical``'s index, searched at the live depth, against exact search.

        The queries are ``recall_sample`` of its own stored vectors (a seeded sample of the
        chunk ids); each is searched as a live search is (the ANN asked for ``depth``
        candidates, the first 10 kept) and compared with the store's exact answer
        (:func:`monitoring.exact.exact_recalls`: an ANN hit counts when it is in the exact
        top 10 or ties its 10th score).

        Returns:
            Mean recall over the sample, in ``[0, 1]`` (1.0 for an empty collection).

        Raises:
            StoreError: The store failed.
        """
        ids = self._chunk_ids(name, chunking)
        return sampled_recall(
            self._store, name, physical, metric, ids, sample=self._settings.recall_sample, depth=self._depth, k=TOP_K
        )

    def _chunk_ids(self, name: str, chunking: str | None = None) -> list[str]:
        """Every stored chunk id of the collection in ``chunking`` (paging through its documents)."""
        out: list[str] = []
        after = ""
        while docs := self._docstore.list_documents(name, after=after, limit=1000):
            after = docs[-1].document_id
            owned = self._docstore.chunk_ids_of(name, [d.document_id for d in docs], chunking=chunking)
            out.extend(c for d in docs for c in owned.get(d.document_id, []))
        return out

    # --- swap, retention, rollback ----------------------------------------------------------
    def _point_alias(self, name: str, physical: str) -> None:
        """Point the store alias ``name`` at ``physical`` unless ``name`` is still a physical collection."""
        if name not in self._store.list_collections():
            self._store.set_alias(name, physical)

    def purge(self, name: str, now: float | None = None) -> list[int]:
        """Drop the store collections of retired versions past ``retire_after``; returns their numbers."""
        now = time.time() if now is None else now
        dropped = []
        for v in self._docstore.list_versions(name):
            if v.state == "retired" and v.retire_after is not None and v.retire_after <= now:
                self._store.drop_collection(v.physical_name)
                self._docstore.set_version_state(name, v.version, "failed")  # no store collection left
                self.drop_rows(name, v)
                dropped.append(v.version)
        if dropped:
            live = self._docstore.collection_state(name)
            current = self._docstore.get_version(name, live.live_version) if live else None
            if current is not None:
                self._point_alias(name, current.physical_name)
        return dropped

    def rollback_target(self, name: str) -> CollectionVersion | None:
        """The most recent retired version whose store collection is still kept, or ``None``."""
        now = time.time()
        kept = [
            v for v in self._docstore.list_versions(name)
            if v.state == "retired" and (v.retire_after is None or v.retire_after > now)
            and self._store.has_collection(v.physical_name)
        ]
        return max(kept, key=lambda v: v.swapped_at or v.created_at, default=None)

    def rollback(
        self, build: Build, target: CollectionVersion, before_swap: Callable[[], None] | None = None
    ) -> ReindexReport:
        """Make ``target`` (a retired version) live again, after replaying the writes it missed.

        ``build.model`` is ``target``'s model; ``build.live`` the version being replaced;
        ``build.chunking`` ``target``'s (set here). The writes since ``build.live`` was built are
        replayed into ``target`` (a superset of those it missed after its retirement; re-cut into
        its chunking when it has rows of its own), under the write lock, then ``live_version`` and
        the alias swap back. ``before_swap`` runs under the lock just before the swap (the service writes
        the collection's config there).
        """
        name = build.cfg.name
        build = replace(build, chunking=dict(target.chunking or build.live.chunking))
        report = ReindexReport(version=target.version, previous=build.live.version)
        with self._writing(name):
            self._replay(build, target.physical_name, build.live.built_from_seq or 0, report)
            if before_swap is not None:
                before_swap()
            retire_after = time.time() + self._settings.retention_s
            self._docstore.set_live_version(name, target.version, retire_after=retire_after)
            self._point_alias(name, target.physical_name)
        report.chunks = self._store.count(target.physical_name)
        return report
