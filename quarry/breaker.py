"""A circuit breaker for a dependency that reported itself unavailable (vector store, model server).

After the dependency raises its "unavailable" error, calls fail fast with a copy of it for
``retry_after_s`` instead of each waiting out the outage (a pgvector pool waits for a connection
that cannot come, pymilvus and the Triton client retry for seconds); then one call tries the
dependency while the others still fail fast, and its outcome closes or reopens the skip: open,
then half-open with one trial call, as service meshes (Envoy's outlier detection) and
resilience libraries (resilience4j's CircuitBreaker) put in front of a failing upstream.

Which errors count: an outage is evidence about the dependency, not about one call. Its
"unavailable" error (connection refused or lost) opens the skip at once. A timeout (the
``timeout`` subclass: one call not answered in time) is first that call's own failure, since a
single slow query (a huge filter) times out while the dependency serves everyone else; only
``timeouts_to_open`` timeouts in a row, with no answer between them, open the skip (a hung
server answers nobody). Any answer, or any other error, resets the count.
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
        timeout: The subclass of ``kind`` that means one call timed out (``StoreTimeout``,
            ``EmbeddingTimeout``); ``None``: every ``kind`` error opens the skip.
        timeouts_to_open: Timeouts in a row, with no answer between, that open the skip.
        clock: Seconds of a monotonic clock (:func:`time.monotonic` by default); tests pass one
            they step by hand, so that the skip's window does not depend on the machine's speed.
    """

    def __init__(
        self,
        kind: type[E],
        retry_after_s: float,
        *,
        timeout: type[E] | None = None,
        timeouts_to_open: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kind = kind
        self._retry_after_s = retry_after_s
        self._timeout = timeout
        self._timeouts_to_open = timeouts_to_open
        self._clock = clock
        self._lock = threading.Lock()
        self._outage: tuple[float, E] | None = None  # (skip until, monotonic s; cause)
        self._trial = False  # one call is trying the dependency after the skip
        self._timeouts = 0  # timeouts recorded since the last answer

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
        """A call's outcome: ``kind`` opens the skip, success or any other error closes it.

        A ``timeout`` error opens it only as the ``timeouts_to_open``-th in a row; before that
        it changes nothing (a skip already open stays open).
        """
        with self._lock:
            self._trial = False
            if not isinstance(error, self._kind):
                self._timeouts = 0
                self._outage = None
                return
            if self._timeout is not None and isinstance(error, self._timeout):
                self._timeouts += 1
                if self._timeouts < self._timeouts_to_open:
                    return
            if self._retry_after_s > 0:
                self._outage = (self._clock() + self._retry_after_s, error)
