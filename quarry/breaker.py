"""A circuit breaker for a dependency that reported itself unavailable (vector store, model server).

After the dependency raises its "unavailable" error, calls fail fast with a copy of it for
``retry_after_s`` instead of each waiting out the outage (a pgvector pool waits for a connection
that cannot come, pymilvus and the Triton client retry for seconds); then one call tries the
dependency while the others still fail fast, and its outcome closes or reopens the skip: open,
then half-open with one trial call, as service meshes (Envoy's outlier detection) and
resilience libraries (resilience4j's CircuitBreaker) put in front of a failing upstream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from quarry.errors import QuarryError

E = TypeVar("E", bound=QuarryError)


def failed(error: BaseException) -> Future[Any]:
    """A future that already holds ``error``: what a skipped call hands its caller."""
    future: Future[Any] = Future()
    future.set_exception(error)
    return future


class OutageBreaker(Generic[E]):
    """Skips a dependency for ``retry_after_s`` after it raised ``kind``, then lets one call try it.

    Args:
        kind: The dependency's "unavailable" error (``StoreUnavailable``, ``EmbeddingUnavailable``);
            other errors mean it answered.
        retry_after_s: Seconds to skip it after an outage (0: never skip).
        clock: Seconds of a monotonic clock (:func:`time.monotonic` by default); tests pass one
            they step by hand, so that the skip's window does not depend on the machine's speed.
    """

    def __init__(
        self, kind: type[E], retry_after_s: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._kind = kind
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._outage: tuple[float, E] | None = None  # (skip until, monotonic s; cause)
        self._trial = False  # one call is trying the dependency after the skip

    @property
    def outage(self) -> E | None:
        """The error that opened the skip while it lasts (trial included), else ``None``."""
        with self._lock:
            return None if self._outage is None else self._outage[1]

    def check(self) -> E | None:
        """The error to fail a call with at once, or ``None`` to make the call (maybe as the trial).

        A call that gets ``None`` must :meth:`record` its outcome. The error's ``retry_after_s``
        says how long the skip lasts (at least 1 s: ``Retry-After`` counts whole seconds).
        """
        with self._lock:
            if self._outage is None:
                return None
            until, cause = self._outage
            left = until - self._clock()
            if left <= 0 and not self._trial:
                self._trial = True
                return None
            wait = f"retried in {left:.1f} s" if left > 0 else "a retry is in flight"
            return self._kind(f"{cause.message} ({wait})", retry_after_s=max(left, 1.0))

    def record(self, error: BaseException | None) -> None:
        """A call's outcome: ``kind`` opens the skip, success or any other error closes it."""
        with self._lock:
            self._trial = False
            if isinstance(error, self._kind) and self._retry_after_s > 0:
                self._outage = (self._clock() + self._retry_after_s, error)
            else:
                self._outage = None
