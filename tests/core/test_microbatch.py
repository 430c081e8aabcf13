"""MicroBatcher: items queued while a call runs share the next call; results and errors per item."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from quarry.microbatch import MicroBatcher
from tests.core.conftest import wait_until


def _gated(log: list[list[int]], gate: threading.Event) -> Callable[[list[int]], list[int | BaseException]]:
    """Doubles items; the first call waits on ``gate`` so that later items queue meanwhile."""

    def process(items: list[int]) -> list[int | BaseException]:
        log.append(list(items))
        if len(log) == 1:
            gate.wait(10)
        return [ValueError(f"odd {i}") if i == 7 else i * 2 for i in items]

    return process


def _busy(first_item: int) -> tuple[MicroBatcher[int, int], list[list[int]], threading.Event, Future[int]]:
    """A started batcher (``max_batch`` 4) whose worker holds ``first_item`` until the gate opens."""
    log: list[list[int]] = []
    gate = threading.Event()
    batcher: MicroBatcher[int, int] = MicroBatcher(_gated(log, gate), max_batch=4)
    batcher.start(1)
    first = batcher.submit(first_item)
    wait_until(lambda: bool(log))  # the worker has taken the item and waits on the gate
    return batcher, log, gate, first


def test_items_queued_during_a_call_share_the_next_one_in_order() -> None:
    batcher, log, gate, first = _busy(0)
    rest = [batcher.submit(i) for i in (1, 2, 3, 4, 5, 6)]
    gate.set()
    assert first.result(10) == 0
    assert [f.result(10) for f in rest] == [2, 4, 6, 8, 10, 12]
    assert log == [[0], [1, 2, 3, 4], [5, 6]]  # max_batch caps a call; order is kept


def test_a_caller_that_gives_up_does_not_kill_the_worker() -> None:
    batcher, _, gate, first = _busy(1)
    queued = batcher.submit(2)

    async def give_up() -> None:  # what a cancelled request awaiting its vector does
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.wrap_future(queued), 0.01)

    asyncio.run(give_up())
    gate.set()
    assert first.result(10) == 2 and queued.result(10) == 4  # computed anyway, nothing raised
    assert batcher.submit(3).result(10) == 6  # the worker lives on


def test_an_item_error_reaches_only_its_caller() -> None:
    open_gate = threading.Event()
    open_gate.set()
    batcher: MicroBatcher[int, int] = MicroBatcher(_gated([], open_gate), max_batch=8)
    batcher.start(1)
    futures = [batcher.submit(i) for i in (6, 7, 8)]
    with pytest.raises(ValueError, match="odd 7"):
        futures[1].result(10)
    assert futures[0].result(10) == 12
    assert futures[2].result(10) == 16


def test_a_failed_call_fails_each_of_its_items_and_the_batcher_goes_on() -> None:
    calls: list[list[str]] = []

    def process(items: list[str]) -> list[str]:
        calls.append(items)
        if "boom" in items:
            raise RuntimeError("engine down")
        return [s.upper() for s in items]

    batcher: MicroBatcher[str, str] = MicroBatcher(process, max_batch=8)
    batcher.start(2)
    with pytest.raises(RuntimeError, match="engine down"):
        batcher.submit("boom").result(10)
    assert batcher.submit("fine").result(10) == "FINE"


def test_a_result_count_mismatch_fails_the_batch_instead_of_shifting_answers() -> None:
    log: list[list[int]] = []
    gate = threading.Event()

    def process(items: list[int]) -> list[int]:
        log.append(items)
        if len(log) == 1:
            gate.wait(10)
        return [0]  # one result, whatever the batch

    batcher: MicroBatcher[int, int] = MicroBatcher(process, max_batch=8)
    batcher.start(1)
    first = batcher.submit(1)
    wait_until(lambda: bool(log))
    pair = [batcher.submit(2), batcher.submit(3)]
    gate.set()
    assert first.result(10) == 0
    for future in pair:
        with pytest.raises(RuntimeError, match="batch of 2 items gave 1 results"):
            future.result(10)


def test_weight_caps_a_batch_and_a_heavy_item_runs_alone() -> None:
    log: list[list[str]] = []
    gate = threading.Event()

    def process(items: list[str]) -> list[int]:
        log.append(items)
        if len(log) == 1:
            gate.wait(10)
        return [len(s) for s in items]

    batcher: MicroBatcher[str, int] = MicroBatcher(process, max_batch=4, weight=len)
    batcher.start(1)
    first = batcher.submit("a")
    wait_until(lambda: bool(log))
    futures = [batcher.submit(s) for s in ("bb", "cc", "dddddd", "e")]
    gate.set()
    assert [f.result(10) for f in (first, *futures)] == [1, 2, 2, 6, 1]
    assert log == [["a"], ["bb", "cc"], ["dddddd"], ["e"]]


def test_start_and_submit_misuse() -> None:
    batcher: MicroBatcher[int, int] = MicroBatcher(lambda items: items, max_batch=2)
    with pytest.raises(RuntimeError, match="before start"):
        batcher.submit(1)
    with pytest.raises(ValueError, match="workers"):
        batcher.start(0)
    with pytest.raises(ValueError, match="max_batch"):
        MicroBatcher(lambda items: items, max_batch=0)
    batcher.start(1)
    batcher.start(3)  # a second start does nothing
    assert batcher.submit(4).result(10) == 4
