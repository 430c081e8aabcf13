"""The last sampled queries of each collection, on disk: ``<data_dir>/monitor/recent.sqlite``.

The monitor's worker records each sample it measured (query vector, filter, ``top_k``), keeping
the newest ``MonitorSettings.recent_queries`` per collection, so that another process (``quarry
recall``, a reindex's verification) can re-run real queries. Written off the request path only.
One small SQLite file of its own (not the docstore), opened per call: safe across threads and
processes (SQLite's locking; WAL).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from stores.filters import And, Eq, Exists, Filter, In, Ne, Nin, Prefix, Range, parse_filter

SCHEMA = """
CREATE TABLE IF NOT EXISTS recent (
    collection TEXT NOT NULL, at REAL NOT NULL, vector BLOB NOT NULL, filter TEXT, top_k INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS recent_by_collection ON recent (collection, at);
"""
TRIM_EVERY = 64


@dataclass(frozen=True)
class RecordedQuery:
    """One recorded query: ``(dim,) float32`` vector, its filter and ``top_k``."""

    vector: npt.NDArray[np.float32]
    flt: Filter | None
    top_k: int


def filter_to_json(flt: Filter) -> dict[str, Any]:
    """The JSON form of a typed filter, which :func:`stores.filters.parse_filter` reads back."""
    if isinstance(flt, Eq):
        return {flt.field: {"$eq": flt.value}}
    if isinstance(flt, In):
        return {flt.field: {"$in": list(flt.values)}}
    if isinstance(flt, Range):
        bounds = {"$gt": flt.gt, "$gte": flt.gte, "$lt": flt.lt, "$lte": flt.lte}
        return {flt.field: {op: value for op, value in bounds.items() if value is not None}}
    if isinstance(flt, Ne):
        return {flt.field: {"$ne": flt.value}}
    if isinstance(flt, Nin):
        return {flt.field: {"$nin": list(flt.values)}}
    if isinstance(flt, Exists):
        return {flt.field: {"$exists": flt.present}}
    if isinstance(flt, Prefix):
        return {flt.field: {"$prefix": flt.prefix}}
    op = "$and" if isinstance(flt, And) else "$or"
    return {op: [filter_to_json(item) for item in flt.items]}


class RecentQueries:
    """The newest ``keep`` sampled queries per collection in one SQLite file.

    Args:
        path: The SQLite file (its folder is created).
        keep: Queries kept per collection.
    """

    def __init__(self, path: Path, keep: int = 1000) -> None:
        self.path = path
        self.keep = keep
        self._writes = 0
        self._lock = threading.Lock()
        self._ready = False

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection to the file, made (with its table) on the first write: reading makes nothing."""
        if not self._ready:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(self.path, timeout=10.0)) as db, db:
            if not self._ready:
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(SCHEMA)
                self._ready = True
            yield db

    def record(self, collection: str, vector: npt.NDArray[np.float32], flt: Filter | None, top_k: int) -> None:
        """Keep one query (and trim the collection's oldest every ``TRIM_EVERY`` writes)."""
        self.record_many([(collection, vector, flt, top_k)])

    def record_many(self, queries: Sequence[tuple[str, npt.NDArray[np.float32], Filter | None, int]]) -> None:
        """Keep ``(collection, vector, filter, top_k)`` queries in one transaction (trimming as :meth:`record`)."""
        if not queries:
            return
        now = time.time()
        rows = [
            (collection, now, np.asarray(vector, dtype="<f4").tobytes(),
             None if flt is None else json.dumps(filter_to_json(flt)), top_k)
            for collection, vector, flt, top_k in queries
        ]
        with self._lock:
            before = self._writes
            self._writes += len(rows)
            trim = self._writes // TRIM_EVERY != before // TRIM_EVERY
        with self._connect() as db:
            db.executemany("INSERT INTO recent VALUES (?, ?, ?, ?, ?)", rows)
            for collection in dict.fromkeys(r[0] for r in rows) if trim else ():
                db.execute(
                    "DELETE FROM recent WHERE collection = ? AND rowid NOT IN "
                    "(SELECT rowid FROM recent WHERE collection = ? ORDER BY at DESC LIMIT ?)",
                    (collection, collection, self.keep),
                )

    def latest(self, collection: str, n: int) -> list[RecordedQuery]:
        """The newest ``n`` recorded queries of ``collection``, newest first (fewer if fewer were kept)."""
        if not self._ready and not self.path.exists():
            return []
        with self._connect() as db:
            rows = db.execute(
                "SELECT vector, filter, top_k FROM recent WHERE collection = ? ORDER BY at DESC, rowid DESC LIMIT ?",
                (collection, n),
            ).fetchall()
        return [
            RecordedQuery(
                np.frombuffer(blob, dtype="<f4").astype(np.float32),
                None if raw is None else parse_filter(json.loads(raw), stored=True),
                int(top_k),
            )
            for blob, raw, top_k in rows
        ]

    def forget(self, collection: str) -> None:
        """Drop the recorded queries of ``collection`` (it was dropped)."""
        if not self._ready and not self.path.exists():
            return
        with self._connect() as db:
            db.execute("DELETE FROM recent WHERE collection = ?", (collection,))
