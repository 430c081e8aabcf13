"""Deadlines for state-of-record calls, and the rule that none of them waits on an event loop.

Every public call of a backend goes through :class:`Deadlines`: it runs on a bounded thread pool
(PostgreSQL: the pool checkout, the connect and the query all count) or in the caller's thread
(SQLite: local, no network), and the caller gets its answer or
:class:`~quarry.errors.StateStoreUnavailable` by ``timeout_s``. A kernel that still ACKs a
stalled peer (a paused proxy, a frozen server) lets neither ``statement_timeout`` nor TCP
timeouts fire, so the deadline is the client's own: a watchdog thread fails the call's future
at its deadline and aborts the connection the call holds (a socket shut down, an SQLite
``interrupt()``), which the pool then discards.

An ``async`` caller awaits :meth:`Deadlines.submit`'s future. Code on an event loop that would
rather answer from the caches (:mod:`indexing.state_cache`) than wait enters
:func:`cache_only`: there any call that is not a cache hit raises :class:`CacheMiss` instead of
running, and the caller goes to a worker thread (:func:`off_loop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import exc as sa_exc

from quarry.errors import StateStoreUnavailable

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")
_local = threading.local()  # .cache_only: bool; .call: the _Call this thread runs


class CacheMiss(Exception):  # noqa: N818 - a signal, not an error a caller ever sees
    """Raised inside :func:`cache_only` by a state call the caches cannot answer."""


@contextlib.contextmanager
def cache_only() -> Iterator[None]:
    """In this block, state calls answer from the caches or raise :class:`CacheMiss` (never wait)."""
    before = getattr(_local, "cache_only", False)
    _local.cache_only = True
    try:
        yield
    finally:
        _local.cache_only = before


def caching_only() -> bool:
    """Whether this thread is inside :func:`cache_only`."""
    return bool(getattr(_local, "cache_only", False))


async def off_loop(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(...)`` on the event loop when the caches answer it, else in a worker thread.

    ``fn`` must only read until its first state call (it runs again, whole, in the thread).
    """
    try:
        with cache_only():
            return fn(*args, **kwargs)
    except CacheMiss:
        return await asyncio.to_thread(fn, *args, **kwargs)


class _Call:
    """One call's deadline, outcome and the connection it holds (to abort)."""

    __slots__ = ("timeout_s", "deadline", "future", "handle", "finished", "expired", "lock")

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.future: Future[Any] = Future()
        self.handle: Any = None
        self.finished = False
        self.expired = False
        self.lock = threading.Lock()


class Deadlines:
    """Runs state calls with a deadline (see the module doc); one per backend, thread-safe.

    Args:
        timeout_s: Each call's deadline, in seconds.
        workers: Threads that run calls (the connection pool's size).
        location: The state of record, for messages.
        abort: Aborts a connection a late call holds (from another thread); must not block.
        inline: Run :meth:`call` in the caller's thread (the watchdog still aborts it).
    """

    def __init__(
        self, timeout_s: float, workers: int, location: str, abort: Callable[[Any], None], *, inline: bool = False
    ) -> None:
        self.timeout_s = timeout_s
        self._location = location
        self._abort = abort
        self._inline = inline
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="quarry-state")
        self._heap: list[tuple[float, int, _Call]] = []
        self._order = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._watchdog = threading.Thread(target=self._watch, name="quarry-state-watchdog", daemon=True)
        self._watchdog.start()
        self._warned: set[str] = set()

    def _late(self, timeout_s: float | None = None) -> StateStoreUnavailable:
        waited = self.timeout_s if timeout_s is None else timeout_s
        return StateStoreUnavailable(
            f"the state store {self._location} did not answer within {waited:g} s (QUARRY_DOCSTORE__TIMEOUT_S)",
            retry_after_s=max(1.0, self.timeout_s),
        )

    def _arm(self, timeout_s: float | None = None) -> _Call:
        call = _Call(self.timeout_s if timeout_s is None else timeout_s)
        with self._cv:
            first = not self._heap or call.deadline < self._heap[0][0]
            heapq.heappush(self._heap, (call.deadline, next(self._order), call))
            if first:
                self._cv.notify()
        return call

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(...)`` within the deadline (nested calls run in the outer call's thread and deadline).

        Raises:
            StateStoreUnavailable: No answer within ``timeout_s``.
            CacheMiss: Inside :func:`cache_only`.
        """
        return self.call_within(self.timeout_s, fn, *args, **kwargs)

    def call_within(self, timeout_s: float, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """:meth:`call` with a deadline of its own (a bulk read of a whole collection's rows).

        Raises:
            StateStoreUnavailable: No answer within ``timeout_s``.
            CacheMiss: Inside :func:`cache_only`.
        """
        if getattr(_local, "call", None) is not None:
            return fn(*args, **kwargs)
        if self._closed:
            raise sa_exc.ResourceClosedError(f"the state store {self._location} is closed")
        if caching_only():
            raise CacheMiss(getattr(fn, "__name__", "call"))
        self._on_loop(fn)
        if not self._inline:
            return self._submit(timeout_s, fn, args, kwargs).result()
        call = self._arm(timeout_s)
        _local.call = call
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if call.expired:
                raise self._late(timeout_s) from exc
            raise
        finally:
            _local.call = None
            with call.lock:
                call.finished = True

    def submit(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """``fn(...)`` on the pool: a future that holds its outcome, or ``StateStoreUnavailable`` at the deadline."""
        return self._submit(self.timeout_s, fn, args, kwargs)

    def _submit(self, timeout_s: float, fn: Callable[..., T], args: Any, kwargs: Any) -> Future[T]:
        if self._closed:
            raise sa_exc.ResourceClosedError(f"the state store {self._location} is closed")
        call = self._arm(timeout_s)
        self._pool.submit(self._run, call, fn, args, kwargs)
        return call.future

    def _run(self, call: _Call, fn: Callable[..., Any], args: Any, kwargs: Any) -> None:
        if call.expired:  # waited in the queue past its deadline
            return
        _local.call = call
        try:
            outcome, failed = fn(*args, **kwargs), False
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            outcome, failed = exc, True
        finally:
            _local.call = None
            with call.lock:
                call.finished = True
        with contextlib.suppress(InvalidStateError):  # the watchdog failed it first
            if failed:
                call.future.set_exception(outcome)
            else:
                call.future.set_result(outcome)

    @contextlib.contextmanager
    def guard(self, handle: Any, timeout_s: float | None = None) -> Iterator[None]:
        """Run the block in this thread with a deadline that aborts ``handle`` (a connection held outside a call).

        Raises:
            StateStoreUnavailable: The block failed after its deadline passed.
        """
        call = self._arm(timeout_s)
        call.handle = handle
        try:
            yield
        except Exception as exc:
            if call.expired:
                raise self._late(call.timeout_s) from exc
            raise
        finally:
            with call.lock:
                call.finished = True

    def attach(self, handle: Any) -> None:
        """Record the connection the current call holds (the pool's checkout event)."""
        call: _Call | None = getattr(_local, "call", None)
        if call is not None:
            with call.lock:
                call.handle = handle
                late = call.expired
            if late:
                self._abort(handle)

    def detach(self) -> None:
        """The current call gave its connection back."""
        call: _Call | None = getattr(_local, "call", None)
        if call is not None:
            with call.lock:
                call.handle = None

    def _watch(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._heap:
                    self._cv.wait()
                if self._closed:
                    return
                deadline, _, call = self._heap[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self._cv.wait(wait)
                    continue
                heapq.heappop(self._heap)
            self._expire(call)

    def _expire(self, call: _Call) -> None:
        with call.lock:
            if call.finished:
                return
            call.expired = True
            handle = call.handle
        with contextlib.suppress(InvalidStateError):
            call.future.set_exception(self._late(call.timeout_s))
        if handle is not None:
            try:
                self._abort(handle)
            except Exception:  # noqa: BLE001 - the connection is discarded anyway
                log.debug("aborting a late state-store connection failed", exc_info=True)

    def _on_loop(self, fn: Callable[..., Any]) -> None:
        """Warn (once per function) when a call would wait on a running event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        name = getattr(fn, "__qualname__", repr(fn))
        if name not in self._warned:
            self._warned.add(name)
            log.warning("state-store call %s waits on the event loop; it should go through off_loop()", name)

    def close(self) -> None:
        """Stop the watchdog and the pool (calls in flight are left to end on their own)."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._pool.shutdown(wait=False, cancel_futures=True)
