"""Keeps one live BM25 index per collection that follows the docstore's change log.

Every replica (process) holds a :class:`~indexing.bm25_live.LiveBM25` per collection. A search
reads its current immutable view; at most once per ``bm25.max_staleness_s`` (default 1 s) the
search that finds the view due asks the docstore for the collection's ``seq`` (one cheap
query instead of one per search) and, if it moved, applies the change-log tail
(:meth:`StateStore.change_log_since`): each changed document's current chunks replace its rows.
A write through this process calls :meth:`BM25Registry.invalidate`, which catches up at once
(read-your-writes). So two replicas answer with the same N, avgdl and df within the staleness
bound, and no write rebuilds the whole index.

A replica that starts loads its saved snapshot (``<data_dir>/bm25/<collection>``, stamped with
the seq and the collection's id) and replays the tail; without one, or when it is behind by
more than :data:`REBUILD_AFTER` changes (or more changes than it has rows), it builds from the
docstore's rows in one read. A snapshot is derived state: one that cannot be read, whose parts
disagree, or whose rows are not the docstore's is logged and rebuilt, never served. A collection
whose index can be neither loaded nor rebuilt is listed in :attr:`BM25Registry.failures`
(``/readyz``).

An index is of one chunking (the live version's chunks rows, :mod:`indexing.versions`): when a
reindex that re-chunked swaps in (``CollectionState.chunking_id`` changes), the next refresh
builds the index from the new chunking's rows. Snapshots of a chunking other than the original
are saved as ``<collection>@<chunking id>``, so a snapshot is only ever followed by its own rows.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from indexing.bm25_live import LiveBM25, LiveView, Row, SnapshotUnreadable
from indexing.docstore import CacheMiss, DocStore
from quarry.errors import StateStoreUnavailable
from quarry.settings import BM25Settings

log = logging.getLogger(__name__)

REBUILD_AFTER = 200_000  # change-log rows behind past which a full read beats replaying
SAVE_EVERY_S = 60.0  # a followed index is saved at most this often (and on load/rebuild)


class _Followed:
    """One collection's live index and when it last asked the docstore."""

    def __init__(self, live: LiveBM25, polled: float, chunking: str = "") -> None:
        self.live = live
        self.chunking = chunking
        self.view = live.view()
        self.polled = polled
        self.saved = polled


class BM25Registry:
    """Per-collection BM25 indexes that follow the docstore's change log.

    Attributes:
        on_swap: Called (no arguments) after an index was loaded or rebuilt whole, in the thread
            that did it, outside the collection's lock; the server sets
            :func:`quarry.heap.settle_soon` there.
        failures: Collection -> why its index could be neither loaded nor rebuilt (the last
            attempt's error); a later success removes it.
        clock: Monotonic seconds (tests move it).
        lazy: Set by a process that writes but does not search (``quarry ingest``): a write then
            catches up only an index this process already follows. One it never loaded is left
            to the next reader (a server's start or first search), which loads the saved
            snapshot and replays the change log, or builds it from the docstore; so the writer's
            memory does not grow with the collection (bench/ingest_memory.py).
    """

    def __init__(self, docstore: DocStore, folder: Path, params: BM25Settings) -> None:
        self._docstore = docstore
        self._folder = folder
        self._params = params
        self.on_swap: Callable[[], object] | None = None
        self.clock: Callable[[], float] = time.monotonic
        self._followed: dict[str, _Followed] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.failures: dict[str, str] = {}
        self.lazy = False

    def get(self, collection: str) -> LiveView:
        """The collection's view, at most ``max_staleness_s`` behind the docstore."""
        followed = self._followed.get(collection)
        if followed is not None and self.clock() - followed.polled < self._params.max_staleness_s:
            return followed.view
        return self._refresh(collection)

    def invalidate(self, collection: str) -> None:
        """Catch up now (after a write through this process): read-your-writes (see :attr:`lazy`)."""
        if self.lazy and collection not in self._followed:
            return
        self._refresh(collection)

    def load_all(self) -> None:
        """Load (or repair) every collection's index now, as a server starts.

        A collection that fails is logged and left in :attr:`failures`; the others load. A
        docstore that cannot list its collections is logged: each request then meets its error.
        """
        try:
            collections = self._docstore.list_collections()
        except Exception:
            log.exception("the docstore cannot list its collections: no BM25 index loaded at startup")
            return
        for collection in collections:
            try:
                self.get(collection)
            except Exception:
                log.exception("BM25 index of collection %r can be neither loaded nor rebuilt", collection)

    def drop(self, collection: str) -> None:
        """Forget and delete a collection's index."""
        with self._lock_for(collection):
            self._followed.pop(collection, None)
            self.failures.pop(collection, None)
            shutil.rmtree(self._path(collection), ignore_errors=True)
            for other in self._folder.glob(f"{collection}@*"):  # snapshots of other chunkings
                shutil.rmtree(other, ignore_errors=True)

    def save(self, collection: str) -> None:
        """Save the collection's index now (a server's shutdown; tests)."""
        with self._lock_for(collection):
            followed = self._followed.get(collection)
            if followed is not None:
                self._save(collection, followed)

    # --- following ---------------------------------------------------------------------------
    def _refresh(self, collection: str) -> LiveView:
        swapped = False
        with self._lock_for(collection):
            followed = self._followed.get(collection)
            try:
                state = self._docstore.collection_state(collection)
                now = self.clock()
                cid, seq = (None, 0) if state is None else (state.id, state.seq)
                chunking = "" if state is None else state.chunking_id
                if (followed is None or followed.live.collection_id != cid or seq < followed.live.version
                        or followed.chunking != chunking):
                    followed = self._load_or_build(collection, cid, seq, chunking)
                    self._followed[collection] = followed
                    swapped = True
                elif seq > followed.live.version:
                    if not self._follow(collection, followed.live, seq, chunking):
                        followed = self._build(collection, cid, chunking)
                        self._followed[collection] = followed
                        swapped = True
                    followed.view = followed.live.view()
                    if now - followed.saved >= SAVE_EVERY_S:
                        self._save(collection, followed)
                followed.polled = now
            except (CacheMiss, StateStoreUnavailable):  # not the index's failure: the state's, or an event loop's
                raise
            except Exception as exc:
                self.failures[collection] = f"{type(exc).__name__}: {exc}"
                raise
            self.failures.pop(collection, None)
            view = followed.view
        hook = self.on_swap
        if swapped and hook is not None:
            hook()
        return view

    def _follow(self, collection: str, live: LiveBM25, seq: int, chunking: str = "") -> bool:
        """Apply the change log from ``live.version`` to at least ``seq``; ``False``: rebuild instead."""
        if seq - live.version > REBUILD_AFTER:
            return False
        while live.version < seq:
            changes = self._docstore.change_log_since(collection, live.version, limit=10_000)
            if not changes:
                return False  # the log does not reach seq (pruned): read the rows whole
            documents = list(dict.fromkeys(c.document_id for c in changes))
            live.apply(self._current_rows(collection, documents, chunking), max(c.seq for c in changes))
        return True

    def _current_rows(self, collection: str, documents: list[str], chunking: str = "") -> dict[str, list[Row]]:
        """The documents' current chunks (with tokens); ``[]`` for the deleted ones."""
        out: dict[str, list[Row]] = {d: [] for d in documents}
        for _ in range(5):  # a concurrent write may replace chunks between the two reads
            owned = self._docstore.chunk_ids_of(collection, documents, chunking=chunking)
            wanted = [c for ids in owned.values() for c in ids]
            chunks = self._docstore.get_chunks(collection, wanted, with_tokens=True, chunking=chunking)
            if len(chunks) == len(wanted):
                break
        for doc_id, ids in owned.items():
            out[doc_id] = [
                (c, doc_id, chunks[c].tokens, chunks[c].payload) for c in ids if c in chunks
            ]
        return out

    def _load_or_build(self, collection: str, cid: int | None, seq: int, chunking: str = "") -> _Followed:
        started = time.perf_counter()
        live = self._load_saved(collection, cid, seq, chunking)
        if live is not None and (live.version == seq or self._follow(collection, live, seq, chunking)):
            log.info("BM25 index of collection %r: snapshot at seq %d + change-log tail to %d in %.2f s",
                     collection, live.version if live.version != seq else seq, live.version,
                     time.perf_counter() - started)
            followed = _Followed(live, self.clock(), chunking)
            if live.version != seq:
                self._save(collection, followed)
            return followed
        return self._build(collection, cid, chunking)

    def _build(self, collection: str, cid: int | None, chunking: str = "") -> _Followed:
        version, rows = self._docstore.bm25_rows(collection, chunking=chunking)
        live = LiveBM25.build(rows, self._params, version)
        live.collection_id = cid
        followed = _Followed(live, self.clock(), chunking)
        self._save(collection, followed)
        return followed

    def _save(self, collection: str, followed: _Followed) -> None:
        followed.saved = self.clock()
        path = self._path(collection, followed.chunking)
        try:
            followed.live.save(path)
        except OSError as exc:  # serve it from memory; the next start rebuilds or replays more
            log.warning("BM25 index of collection %r could not be saved to %s (%s); serving it from memory",
                        collection, path, exc)
        followed.view = followed.live.view()

    def _load_saved(self, collection: str, cid: int | None, seq: int, chunking: str = "") -> LiveBM25 | None:
        """The saved index of ``chunking``: readable, of this collection, not ahead of ``seq``, holding its rows."""
        path = self._path(collection, chunking)
        if not path.exists():
            return None
        try:
            saved = LiveBM25.load(path, self._params)
        except SnapshotUnreadable as exc:
            log.warning("BM25 index of collection %r at %s is damaged (%s); rebuilding it from the docstore",
                        collection, path, exc)
            return None
        if saved.collection_id != cid or saved.version > seq:
            return None  # another collection of that name, or a database restored to an older state
        if saved.version == seq:
            version, chunk_ids = self._docstore.bm25_chunk_ids(collection, chunking=chunking)
            held = saved.live_chunk_ids()
            if version == seq and chunk_ids != held:
                log.warning("BM25 index of collection %r at %s holds %d rows, the docstore %d chunks with tokens%s; "
                            "rebuilding it from the docstore", collection, path, len(held),
                            len(chunk_ids), "" if len(held) != len(chunk_ids) else " (other chunk ids)")
                return None
        return saved

    def _path(self, collection: str, chunking: str = "") -> Path:
        return self._folder / (f"{collection}@{chunking}" if chunking else collection)

    def _lock_for(self, collection: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(collection, threading.Lock())
