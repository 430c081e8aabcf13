"""quarry.heap: the long-lived heap leaves the cyclic GC's walks, and no cycle is kept for good."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from indexing.sources import SourceDocument
from quarry import heap
from quarry.api import create_app
from quarry.service import Quarry


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic GC frees it


@pytest.fixture()
def released() -> Iterator[None]:
    yield
    heap.release()


@pytest.mark.usefixtures("released")
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
    heap.release()
    assert gc.get_freeze_count() == 0


def test_the_server_settles_the_heap_and_each_bm25_snapshot(
    service: Quarry, collection: str, scifact_docs: list[SourceDocument]
) -> None:
    swaps: list[int] = []
    with TestClient(create_app(service)):
        assert service.bm25.on_swap is heap.settle and gc.get_freeze_count() > 0
        service.bm25.on_swap = lambda: swaps.append(gc.get_freeze_count())
        service.upsert(collection, scifact_docs[:3])  # the write rebuilds the collection's snapshot
        assert swaps
    assert service.bm25.on_swap is None and gc.get_freeze_count() == 0  # a stopped server gives them back
