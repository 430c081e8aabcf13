"""quarry.heap: the long-lived heap leaves the cyclic GC's walks, and no cycle is kept for good."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from indexing.document_rules import SourceDocument
from quarry import heap
from quarry.api import create_app
from quarry.service import Quarry
from tests.core.conftest import wait_until


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic GC frees it


@pytest.fixture()
def no_auto_gc() -> Iterator[None]:
    """Only explicit collections here (an automatic one could free a cycle before the test looks)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        while gc.get_freeze_count():
            heap.release()


@pytest.mark.usefixtures("no_auto_gc")
def test_settle_frees_garbage_cycles_and_freezes_the_survivors() -> None:
    garbage = weakref.ref(Node())
    kept = [Node()]
    assert garbage() is not None  # only a collection frees it
    assert heap.settle() >= 0
    assert garbage() is None and gc.get_freeze_count() > 0
    survivor = weakref.ref(kept[0])
    kept.clear()  # frozen, then unreachable: the next settle frees it (it unfreezes first)
    assert survivor() is not None
    heap.settle()
    assert survivor() is None


class HeldTimer:
    """A timer the test fires by hand: the settle runs when the test says, not when a slow machine gets to it."""

    def __init__(self) -> None:
        self.made: list[tuple[float, Callable[[], None]]] = []
        self.started = self.cancelled = 0

    def __call__(self, interval_s: float, function: Callable[[], None]) -> HeldTimer:
        self.made.append((interval_s, function))
        return self

    def start(self) -> None:
        self.started += 1

    def cancel(self) -> None:
        self.cancelled += 1

    def fire(self) -> None:
        self.made[-1][1]()


@pytest.mark.usefixtures("no_auto_gc")
def test_settle_soon_settles_once_per_burst_and_only_while_retained() -> None:
    held = HeldTimer()
    heap.settle_soon(0.01, timer=held)  # nobody retains the heap: nothing happens
    assert held.made == [] and gc.get_freeze_count() == 0
    heap.retain()
    try:
        garbage = weakref.ref(Node())  # made after the retain's settle
        for _ in range(3):
            heap.settle_soon(0.2, timer=held)  # a burst of swaps rides on one settle
        assert [interval for interval, _ in held.made] == [0.2] and held.started == 1
        assert garbage() is not None  # not settled before the timer fires, however long that takes
        held.fire()
        assert garbage() is None  # the timer's settle collected it
        heap.settle_soon(0.2, timer=held)  # the fired timer is no longer pending: a new one
        assert len(held.made) == 2
        heap.retain()  # a second server in the same process
        heap.release()
        assert gc.get_freeze_count() > 0 and held.cancelled == 0  # the first still holds the heap frozen
    finally:
        heap.release()
    assert held.cancelled == 1  # the last release cancels the pending settle ...
    assert gc.get_freeze_count() == 0  # ... and unfreezes
    held.fire()  # a timer that fires after the release anyway leaves the heap unfrozen
    assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("no_auto_gc")
def test_settle_soon_runs_on_a_real_timer_thread() -> None:
    heap.retain()
    try:
        garbage = weakref.ref(Node())
        heap.settle_soon(0.01)
        wait_until(lambda: garbage() is None)  # however late the thread runs, it settles
        wait_until(lambda: heap._timer is None)
    finally:
        heap.release()
    assert gc.get_freeze_count() == 0


def test_the_server_settles_the_heap_and_each_bm25_snapshot(
    service: Quarry, collection: str, scifact_docs: list[SourceDocument]
) -> None:
    swaps: list[int] = []
    service.bm25.on_swap = None
    with TestClient(create_app(service)):
        assert service.bm25.on_swap is heap.settle_soon and gc.get_freeze_count() > 0
        service.bm25.on_swap = lambda: swaps.append(gc.get_freeze_count())
        service.upsert(collection, scifact_docs[:3])  # a write follows the change log: nothing built whole
        service.bm25.drop(collection)  # as a server meeting no snapshot: the next read builds the index whole
        service.bm25.get(collection)
        assert swaps
    assert service.bm25.on_swap is None and gc.get_freeze_count() == 0  # a stopped server gives them back
