"""Keep a server's long-lived heap out of the cyclic garbage collector's walks.

CPython's cyclic GC walks every tracked container of a generation when it collects it. A
serving process holds a large, mostly static heap (modules, FastAPI's routes and pydantic
models, the model's Python objects, BM25 snapshots with a payload dict per chunk), and request
garbage that survives a young collection keeps promoting objects, so full (generation-2)
collections come often and each walks that whole heap while holding the GIL. Measured on the
REST benchmark (SciFact, 32 clients, ONNX int8 query encoder in a child process, 2 cores): 139k
tracked objects; one full collection took 47 ms on an idle server and 73 ms on average under
load, where 26 of them ran in 17 s (1.9 s) beside 0.7 s of young collections: ~0.57 ms of every
request's ~2.3 ms in the server process. With the heap settled the full collections took ~2 ms
each and the server answered 342 instead of 297 requests/s.

:func:`settle` runs a full collection over everything, frozen before or not, then moves the
survivors to the permanent generation (:func:`gc.freeze`, the Python docs' recipe for long-lived
heaps; Instagram's "Dismissing Python Garbage Collection at Instagram" measured the same walks).
Frozen objects are still freed by reference counting as soon as nothing refers to them; a
reference cycle that was alive (or not yet found) when one settle froze it is collected by the
next one, which unfreezes first.

A server calls :func:`retain` once it has warmed up (one settle), :func:`settle_soon` after each
BM25 snapshot swap (at most one settle per ``SETTLE_EVERY_S``, on a timer thread: a full
collection per write would cost a small collection's writes far more than its BM25 rebuild), and
:func:`release` when it stops; the last release unfreezes.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Protocol

SETTLE_EVERY_S = 2.0  # at most one settle per this many seconds after snapshot swaps

_lock = threading.Lock()  # serialises settles (each walks the whole heap); taken before _state
_state = threading.Lock()  # guards _holders and _timer
_holders = 0
_timer: Timer | None = None


def settle() -> float:
    """Collect every generation (frozen objects included), then freeze what survived.

    Returns:
        Seconds the collection took (the GIL is held meanwhile).
    """
    with _lock:
        return _settle_locked()


def _settle_locked() -> float:
    started = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return time.perf_counter() - started


def retain() -> float:
    """A server starts holding the heap settled: settle now (see the module doc).

    Returns:
        Seconds the settle took.
    """
    global _holders
    with _state:
        _holders += 1
    return settle()


class Timer(Protocol):
    """What :func:`settle_soon` needs of a timer (:class:`threading.Timer` has it)."""

    def start(self) -> None:
        """Call the function once the interval has passed."""

    def cancel(self) -> None:
        """Do not call it, if it has not been called yet."""


def _thread_timer(interval_s: float, function: Callable[[], None]) -> Timer:
    timer = threading.Timer(interval_s, function)
    timer.name, timer.daemon = "quarry-heap-settle", True
    return timer


def settle_soon(
    delay_s: float | None = None, *, timer: Callable[[float, Callable[[], None]], Timer] = _thread_timer
) -> None:
    """Settle on a timer thread ``delay_s`` (default ``SETTLE_EVERY_S``) from now, unless one is pending.

    Requests that come while one is pending ride on it, so writes in a burst cost one settle.
    Does nothing while no server holds the heap (:func:`retain`).

    Args:
        delay_s: Seconds from now.
        timer: Makes the (unstarted) timer from ``(delay_s, function)``; a daemon
            :class:`threading.Timer` by default. Tests pass one they fire by hand, so that the
            order of settle and check does not depend on the machine's speed.
    """
    global _timer
    with _state:
        if _holders == 0 or _timer is not None:
            return
        _timer = timer(SETTLE_EVERY_S if delay_s is None else delay_s, _settle_from_timer)
        _timer.start()


def release() -> None:
    """A server stops holding the heap; the last one cancels a pending settle and unfreezes."""
    global _holders, _timer
    with _state:
        _holders = max(0, _holders - 1)
        if _holders == 0 and _timer is not None:
            _timer.cancel()
            _timer = None
    with _lock, _state:  # lock order everywhere: _lock, then _state
        if _holders == 0:
            gc.unfreeze()


def _settle_from_timer() -> None:
    global _timer
    with _lock:
        with _state:
            _timer = None
            if _holders == 0:  # released meanwhile: stay unfrozen
                return
        _settle_locked()
