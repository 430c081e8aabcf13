"""Keeps one live BM25 snapshot per collection, exact after every write.

Writers call :meth:`BM25Registry.invalidate`; the next reader finds the snapshot's version
behind the docstore's, rebuilds it from the docstore's token lists (so N, avgdl and df are
those of the live chunks), persists it under ``<data_dir>/bm25/<collection>`` and swaps it in.
Readers never see a half-built index: a snapshot is immutable and swapped by reference.

A snapshot is derived state: one that cannot be read (a truncated ``.npy``), whose parts
disagree, or whose rows are not the docstore's (other chunk ids, another count) is logged and
rebuilt from the docstore, never served. A collection whose snapshot can be neither loaded nor
rebuilt is listed in :attr:`BM25Registry.failures`, which ``/readyz`` reports.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from indexing.docstore import DocStore
from quarry.settings import BM25Settings
from retrieval.bm25 import BM25Index, SnapshotUnreadable

log = logging.getLogger(__name__)


class BM25Registry:
    """Per-collection BM25 snapshots, rebuilt lazily when the docstore moved on.

    Attributes:
        on_swap: Called (no arguments) after a snapshot was loaded or rebuilt and swapped in,
            in the thread that did it, outside the collection's lock; the server sets
            :func:`quarry.heap.settle_soon` there.
        failures: Collection -> why its snapshot could be neither loaded nor rebuilt (the last
            attempt's error); a later success removes it.
    """

    def __init__(self, docstore: DocStore, folder: Path, params: BM25Settings) -> None:
        self._docstore = docstore
        self._folder = folder
        self._params = params
        self.on_swap: Callable[[], object] | None = None
        self._live: dict[str, BM25Index] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.failures: dict[str, str] = {}

    def get(self, collection: str) -> BM25Index:
        """The up-to-date snapshot of ``collection`` (rebuilt and persisted if stale)."""
        version = self._docstore.version(collection)
        snap = self._live.get(collection)
        if snap is not None and snap.version == version:
            return snap
        swapped = False
        with self._lock_for(collection):
            snap = self._live.get(collection)
            if snap is None or snap.version != version:
                try:
                    snap = self._load_or_build(collection)
                except Exception as exc:
                    self.failures[collection] = f"{type(exc).__name__}: {exc}"
                    raise
                self.failures.pop(collection, None)
                self._live[collection] = snap
                swapped = True
        hook = self.on_swap
        if swapped and hook is not None:
            hook()
        return snap

    def load_all(self) -> None:
        """Load (or repair) every collection's snapshot now, as a server starts.

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

    def invalidate(self, collection: str) -> None:
        """Rebuild now (after a write), so the next query pays nothing."""
        self.get(collection)

    def drop(self, collection: str) -> None:
        """Forget and delete a collection's snapshot."""
        with self._lock_for(collection):
            self._live.pop(collection, None)
            self.failures.pop(collection, None)
            shutil.rmtree(self._path(collection), ignore_errors=True)

    def _load_or_build(self, collection: str) -> BM25Index:
        saved = self._load_saved(collection)
        if saved is not None:
            return saved
        version, rows = self._docstore.bm25_rows(collection)
        snap = BM25Index.build(rows, self._params, version)
        path = self._path(collection)
        try:
            snap.save(path)
            (path / "quarry-params.json").write_text(self._params.model_dump_json(), encoding="utf-8")
        except OSError as exc:  # serve the new snapshot; the next start rebuilds it again
            log.warning("BM25 index of collection %r could not be saved to %s (%s); serving it from memory",
                        collection, path, exc)
        return snap

    def _load_saved(self, collection: str) -> BM25Index | None:
        """The saved snapshot if it is readable, current and holds the docstore's rows; else ``None``."""
        path = self._path(collection)
        if not path.exists():
            return None
        try:
            saved = BM25Index.load(path)
        except SnapshotUnreadable as exc:
            log.warning("BM25 index of collection %r at %s is damaged (%s); rebuilding it from the docstore",
                        collection, path, exc)
            return None
        if saved.version != self._docstore.version(collection) or not self._same_params(path):
            return None  # stale: a write or a settings change since it was saved
        version, chunk_ids = self._docstore.bm25_chunk_ids(collection)
        if version == saved.version and chunk_ids != saved.chunk_ids:
            log.warning("BM25 index of collection %r at %s holds %d rows, the docstore %d chunks with tokens%s; "
                        "rebuilding it from the docstore", collection, path, len(saved), len(chunk_ids),
                        "" if len(saved) != len(chunk_ids) else " (other chunk ids)")
            return None
        return saved if version == saved.version else None

    def _same_params(self, path: Path) -> bool:
        try:
            saved = BM25Settings.model_validate_json((path / "quarry-params.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return saved == self._params

    def _path(self, collection: str) -> Path:
        return self._folder / collection

    def _lock_for(self, collection: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(collection, threading.Lock())
