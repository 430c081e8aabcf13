"""Dynamic batching in process: items submitted by concurrent threads share one call.

Triton's ``dynamic_batching`` with a zero queue delay: up to ``workers`` calls run at once, and
each takes every item that queued while the others were busy (up to ``max_batch`` by weight).
A lone caller never waits for company; under load batches grow by themselves, and a per-call
cost (a model invocation, a vector-store round trip) is paid once per batch instead of per item.

Worker ``i`` takes items only while workers ``0..i-1`` are all busy, so light traffic always
meets worker 0 (whose thread-local state, e.g. torch's OpenMP pool, is warm).

With a ``key``, a batch holds only items of one key (the oldest queued item's): items that cannot
share a call wait for the next free worker instead of queuing behind each other in one batch.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")
_LIVE: weakref.WeakSet[MicroBatcher[Any, Any]] = weakref.WeakSet()


def queue_depths() -> dict[str, int]:
    """Items queued now in the live batchers, summed by name (``quarry-embed-batcher`` -> ``embed``).

    Read without the batchers' locks (a gauge read at scrape time; a length is read atomically).
    """
    depths: dict[str, int] = {}
    for batcher in list(_LIVE):
        label = batcher.name.removeprefix("quarry-").removesuffix("-batcher")
        depths[label] = depths.get(label, 0) + len(batcher._queue)
    return depths


class MicroBatcher(Generic[T, R]):
    """Runs ``process`` over batches of items queued by concurrent callers.

    Args:
        process: Called with a batch of items (in submission order); returns one result per
            item, where a result that is an exception is raised to that item's caller alone.
            If ``process`` raises, every item of the batch gets the exception.
        max_batch: Largest total weight of one batch (a single heavier item runs alone).
        weight: An item's weight against ``max_batch`` (default 1 each).
        name: Prefix of the worker threads' names.
        key: Items of one batch share this key (``None``: any items may share a batch).
    """

    def __init__(
        self,
        process: Callable[[list[T]], Sequence[R | BaseException]],
        *,
        max_batch: int,
        weight: Callable[[T], int] = lambda _item: 1,
        name: str = "quarry-batcher",
        key: Callable[[T], Any] | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._process = process
        self._max_batch = max_batch
        self._weight = weight
        self._name = name
        self._key = key
        self._queue: list[tuple[T, Future[R]]] = []
        self._cond = threading.Condition()
        self._busy: list[bool] = []  # one flag per worker thread; empty until start()
        _LIVE.add(self)

    @property
    def name(self) -> str:
        """The prefix of the worker threads' names (``quarry-embed-batcher``...)."""
        return self._name

    @property
    def started(self) -> bool:
        """Whether the worker threads run."""
        return bool(self._busy)

    def start(self, workers: int) -> None:
        """Start ``workers`` daemon threads (once; later calls do nothing).

        Raises:
            ValueError: ``workers < 1``.
        """
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        with self._cond:
            if self._busy:
                return
            self._busy = [False] * workers
            for i in range(workers):
                threading.Thread(target=self._run, args=(i,), name=f"{self._name}-{i}", daemon=True).start()

    def submit(self, item: T) -> Future[R]:
        """Queue ``item`` for the next call and return at once.

        Returns:
            A future of the item's result; ``result()`` raises what ``process`` raised.

        Raises:
            RuntimeError: :meth:`start` was not called.
        """
        if not self._busy:
            raise RuntimeError("MicroBatcher.submit before start()")
        future: Future[R] = Future()
        # Running from the start: a caller's cancel() (e.g. asyncio cancelling a request that
        # awaits wrap_future) then fails instead of leaving a cancelled future for the worker to
        # complete, which would raise InvalidStateError and kill the worker thread.
        future.set_running_or_notify_cancel()
        with self._cond:
            self._queue.append((item, future))
            self._cond.notify_all()  # the lowest idle worker takes it (see _take)
        return future

    def _run(self, worker: int) -> None:
        while True:
            batch = self._take(worker)
            try:
                results: Sequence[R | BaseException] = self._process([item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"batch of {len(batch)} items gave {len(results)} results")
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting caller
                results = [exc] * len(batch)
            finally:
                with self._cond:
                    self._busy[worker] = False
                    self._cond.notify_all()
            for (_, future), result in zip(batch, results, strict=True):
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    def _take(self, worker: int) -> list[tuple[T, Future[R]]]:
        """Wait for items; worker ``i`` takes some only while workers ``0..i-1`` are all busy."""
        with self._cond:
            while not self._queue or not all(self._busy[:worker]):
                self._cond.wait()
            self._busy[worker] = True
            if self._key is not None:
                batch = self._take_key(self._key)
            else:
                batch, size = [], 0
                while self._queue and size + self._weight(self._queue[0][0]) <= self._max_batch:
                    entry = self._queue.pop(0)
                    batch.append(entry)
                    size += self._weight(entry[0])
                batch = batch or [self._queue.pop(0)]
            if self._queue:  # items left: the next worker may take them now that this one is busy
                self._cond.notify_all()
            return batch

    def _take_key(self, key: Callable[[T], Any]) -> list[tuple[T, Future[R]]]:
        """The oldest item and the queued items of its key, up to ``max_batch`` (caller holds the lock)."""
        first = self._queue.pop(0)
        wanted, batch, size, rest = key(first[0]), [first], self._weight(first[0]), []
        for entry in self._queue:
            weight = self._weight(entry[0])
            if size + weight <= self._max_batch and key(entry[0]) == wanted:
                batch.append(entry)
                size += weight
            else:
                rest.append(entry)
        self._queue = rest
        return batch
