"""Per-collection write locks that hold across processes and hosts, and die with their holder.

An upsert reads the collection's state (stored hashes, stale chunks, the metadata schema), writes
the vectors, then commits; two processes doing that at once for one collection would keep both
versions of a document. :meth:`WriteLocks.write_lock` spans the whole of it: a PostgreSQL
session advisory lock (the docstore is shared by replicas) or, for SQLite, an open-file-description
lock on one byte of the single file ``<database>.lock`` beside it (the byte's offset is a hash of
tenant and name: processes sharing a data dir, such as the CLI beside the server). No file per
collection: a name never makes a filesystem entry. Both are released by the operating system or
the server when the holding process dies. Re-entrant per thread; the lock of one thread blocks
the others (the service also keeps its in-process lock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from quarry.errors import StoreUnavailable

POLL_S = 0.02


class WriteLocks:
    """The re-entrant front of a backend's ``_lock_try``/``_lock_release`` pair."""

    location: str
    tenant: str

    def _init_locks(self) -> None:
        self._held: dict[str, list[Any]] = {}  # key -> [thread id, depth, backend handle]
        self._held_guard = threading.Lock()

    def _lock_open(self, key: str) -> Any:
        """A handle to try the lock of ``key`` with (a file, a connection)."""
        raise NotImplementedError

    def _lock_try(self, handle: Any, key: str) -> bool:
        """Take the lock without waiting; whether it was taken."""
        raise NotImplementedError

    def _lock_release(self, handle: Any, key: str) -> None:
        """Release the lock and the handle (errors suppressed: the handle is dropped anyway)."""
        raise NotImplementedError

    @contextmanager
    def write_lock(self, name: str, *, timeout_s: float = 30.0) -> Iterator[None]:
        """Hold collection ``name``'s write lock (keyed by tenant and lower-cased name).

        Raises:
            StoreUnavailable: Another process held it for all of ``timeout_s`` (retryable).
        """
        key = f"{self.tenant}.{name.lower()}"
        me = threading.get_ident()
        with self._held_guard:
            held = self._held.get(key)
            if held is not None and held[0] == me:
                held[1] += 1
        if held is not None and held[0] == me:
            try:
                yield
            finally:
                with self._held_guard:
                    held[1] -= 1
            return
        handle = self._acquire(key, timeout_s)
        with self._held_guard:
            self._held[key] = [me, 1, handle]
        try:
            yield
        finally:
            with self._held_guard:
                del self._held[key]
            self._lock_release(handle, key)

    def _acquire(self, key: str, timeout_s: float) -> Any:
        handle = self._lock_open(key)
        deadline = time.monotonic() + timeout_s
        while not self._lock_try(handle, key):
            if time.monotonic() >= deadline:
                self._lock_release(handle, key)
                raise StoreUnavailable(
                    f"collection write lock {key!r} of the docstore {self.location} is held by another process "
                    f"(waited {timeout_s:g} s); retry",
                    retry_after_s=1.0,
                )
            time.sleep(POLL_S)
        return handle
