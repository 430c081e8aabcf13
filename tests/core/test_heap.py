"""quarry.heap: the long-lived heap leaves the cyclic GC's walks, and no cycle is kept for good."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from indexing.sources import SourceDocument
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


@pytest.mark.usefixtures("no_auto_gc")
def test_settle_soon_settles_once_per_burst_and_only_while_retained() -> None:
    heap.settle_soon(0.01)  # nobody retains the heap: nothing happens
    time.sleep(0.1)
    assert gc.get_freeze_count() == 0
    heap.retain()
    try:
        garbage = weakref.ref(Node())  # made after the retain's settle
        for _ in range(3):
            heap.settle_soon(0.2)  # a burst of swaps rides on one settle
        assert garbage() is not None
        wait_until(lambda: garbage() is None)  # the timer's settle collected it
        heap.retain()  # a second server in the same process
        heap.release()
        assert gc.get_freeze_count() > 0  # the first still holds the heap frozen
    finally:
        heap.release()
    assert gc.get_freeze_count() == 0  # the last release unfreezes


def test_the_server_settles_the_heap_and_each_bm25_snapshot(
    service: Quarry, collection: str, scifact_docs: list[SourceDocument]
) -> None:
    swaps: list[int] = []
    service.bm25.on_swap = None
    with TestClient(create_app(service)):
        assert service.bm25.on_swap is heap.settle_soon and gc.get_freeze_count() > 0
        service.bm25.on_swap = lambda: swaps.append(gc.get_freeze_count())
        service.upsert(collection, scifact_docs[:3])  # the write rebuilds the collection's snapshot
        assert swaps
    assert service.bm25.on_swap is None and gc.get_freeze_count() == 0  # a stopped server gives them back
