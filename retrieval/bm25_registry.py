"""Keeps one live BM25 snapshot per collection, exact after every write.

Writers call :meth:`BM25Registry.invalidate`; the next reader finds the snapshot's version
behind the docstore's, rebuilds it from the docstore's token lists (so N, avgdl and df are
those of the live chunks), persists it under ``<data_dir>/bm25/<collection>`` and swaps it in.
Readers never see a half-built index: a snapshot is immutable and swapped by reference.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from indexing.docstore import DocStore
from quarry.settings import BM25Settings
from retrieval.bm25 import BM25Index


class BM25Registry:
    """Per-collection BM25 snapshots, rebuilt lazily when the docstore moved on.

    Attributes:
        on_swap: Called (no arguments) after a snapshot was loaded or rebuilt and swapped in,
            in the thread that did it, outside the collection's lock; the server sets
            :func:`quarry.heap.settle_soon` there.
    """

    def __init__(self, docstore: DocStore, folder: Path, params: BM25Settings) -> None:
        self._docstore = docstore
        self._folder = folder
        self._params = params
        self.on_swap: Callable[[], object] | None = None
        self._live: dict[str, BM25Index] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

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
                snap = self._load_or_build(collection)
                self._live[collection] = snap
                swapped = True
        hook = self.on_swap
        if swapped and hook is not None:
            hook()
        return snap

    def invalidate(self, collection: str) -> None:
        """Rebuild now (after a write), so the next query pays nothing."""
        self.get(collection)

    def drop(self, collection: str) -> None:
        """Forget and delete a collection's snapshot."""
        with self._lock_for(collection):
            self._live.pop(collection, None)
            shutil.rmtree(self._path(collection), ignore_errors=True)

    def _load_or_build(self, collection: str) -> BM25Index:
        path = self._path(collection)
        version = self._docstore.version(collection)
        saved = BM25Index.load(path) if path.exists() else None
        if saved is not None and saved.version == version and self._same_params(path):
            return saved
        version, rows = self._docstore.bm25_rows(collection)
        snap = BM25Index.build(rows, self._params, version)
        snap.save(path)
        (path / "quarry-params.json").write_text(self._params.model_dump_json(), encoding="utf-8")
        return snap

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
