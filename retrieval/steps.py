"""The driver of a query written as steps: run in a thread, blocking on each future until a deadline.

:meth:`retrieval.search.Searcher._steps` yields futures (the query's vector, its ANN hits) and
:class:`StateRead` steps; :func:`resolve` runs them in the calling thread (CLI, evaluation),
:meth:`~retrieval.search.Searcher.search_async` awaits the same steps on the event loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from retrieval.results import SearchResult


class Late(Exception):
    """Thrown into the query's steps when the future they wait on missed the dense deadline."""


class StateRead:
    """A step that reads the state of record: ``fn(*args)``, a method of the docstore.

    :func:`resolve` runs it in its own thread; :meth:`Searcher.search_async` on the docstore's
    threads (:meth:`~indexing.docstore.StateStore.submit`), so that no state call waits on the
    event loop. Either way it answers or fails (``StateStoreUnavailable``) within the docstore's
    deadline.
    """

    __slots__ = ("fn", "args")

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args

    def run(self) -> Future[Any]:
        """Run it here: a finished future with its outcome."""
        done: Future[Any] = Future()
        try:
            done.set_result(self.fn(*self.args))
        except Exception as exc:  # noqa: BLE001 - handed to the steps through the future
            done.set_exception(exc)
        return done


def resolve(steps: Generator[Future[Any] | StateRead, Any, SearchResult], deadline: float | None) -> SearchResult:
    """Run :meth:`Searcher._steps` in this thread, blocking on each future until ``deadline`` (monotonic s)."""
    step = advance(steps, None)
    while isinstance(step, StateRead | Future):
        if isinstance(step, StateRead):
            step = advance(steps, step.run())
            continue
        left = None if deadline is None else min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)
        done, _ = wait([step], timeout=left)
        step = advance(steps, step) if done else advance(steps, None, Late())
    return step


def resolve_all(
    all_steps: list[Generator[Future[Any] | StateRead, Any, SearchResult]], deadline: float | None
) -> list[SearchResult | Exception]:
    """Run several queries' steps in this thread at once, each in the order :func:`resolve` runs one.

    Each query advances as soon as the future it waits on is done, so the queries' model and store
    calls are in flight together (a micro-batcher then serves them in one call). Past ``deadline``
    (monotonic s) the queries still waiting get :class:`Late` thrown in.

    Returns:
        Per query, in order: its result, or the exception its steps raised.
    """
    out: list[SearchResult | Exception | None] = [None] * len(all_steps)
    waiting: list[tuple[Future[Any], int]] = []

    def run(i: int, done: Future[Any] | None, late: Late | None = None) -> None:
        try:
            step = advance(all_steps[i], done, late)
            while isinstance(step, StateRead):
                step = advance(all_steps[i], step.run())
        except Exception as exc:  # noqa: BLE001 - this query's failure, handed to the caller
            out[i] = exc
            return
        if isinstance(step, Future):
            waiting.append((step, i))
        else:
            out[i] = step

    for i in range(len(all_steps)):
        run(i, None)
    while waiting:
        left = None if deadline is None else min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)
        done, _ = wait({f for f, _ in waiting}, timeout=left, return_when=FIRST_COMPLETED)
        gone = [(f, i) for f, i in waiting if f in done] if done else list(waiting)
        waiting[:] = [w for w in waiting if w not in gone]
        for f, i in gone:
            if done:
                run(i, f)
            else:
                run(i, None, Late())
    return cast("list[SearchResult | Exception]", out)  # each query ended: a result or its exception


def advance(
    steps: Generator[Future[Any] | StateRead, Any, SearchResult], done: Future[Any] | None, late: Late | None = None
) -> Future[Any] | StateRead | SearchResult:
    """Start the steps, or hand them a finished future's outcome or a missed deadline.

    ``done`` is ``None`` to start; else its result is sent in or its exception thrown in. ``late``
    is thrown in instead when the future the steps wait on ran past the deadline.

    Returns:
        The next future to wait on, or the search result once the steps end.
    """
    try:
        if late is not None:
            return steps.throw(late)
        if done is None:
            return next(steps)
        exc = done.exception()
        return steps.throw(exc) if exc is not None else steps.send(done.result())
    except StopIteration as end:
        return cast("SearchResult", end.value)


def outcome(done: Future[Any]) -> BaseException | None:
    """A finished future's exception (``None``: it succeeded, or was cancelled: the next call finds out)."""
    return None if done.cancelled() else done.exception()


def read_outcome(waiting: asyncio.Future[Any]) -> None:
    """Mark a finished wrapper's exception read (asyncio logs unread ones; advance reads the source)."""
    if not waiting.cancelled():
        waiting.exception()
