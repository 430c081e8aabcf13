"""Keep the long-lived heap out of the cyclic garbage collector's walks.

CPython's cyclic GC walks every tracked container of a generation when it collects it. A
serving process holds a large, mostly static heap (modules, FastAPI's routes and pydantic
models, the model's Python objects, BM25 snapshots with a payload dict per chunk), and request
garbage that survives a young collection keeps promoting objects, so full (generation-2)
collections come often and each walks that whole heap while holding the GIL. Measured on the
REST benchmark (SciFact, 32 clients, ONNX int8 query encoder in a child process, 2 cores): 139k
tracked objects, one full collection 47-73 ms, 26 of them in 15 s: 1.9 s, plus 0.7 s of young
collections, i.e. ~0.57 ms of every request's ~2.3 ms in the server process. After
:func:`settle` the full collections took ~2 ms each (0.05 s in 15 s) and the server answered 342
instead of 297 requests/s.

:func:`settle` runs a full collection over everything, frozen before or not (so cyclic garbage of
a replaced snapshot is freed, not kept), then moves the survivors to the permanent generation
(:func:`gc.freeze`, the Python docs' recipe for long-lived heaps; Instagram's "Dismissing Python
Garbage Collection at Instagram" measured the same walks). Frozen objects are still freed by
reference counting as soon as nothing refers to them. Call it once the process holds what it
will keep (after warm-up, after a BM25 snapshot is swapped in); it costs one full collection,
which is small beside what it follows (loading the models; rebuilding a BM25 snapshot).
"""

from __future__ import annotations

import gc
import threading
import time

_lock = threading.Lock()


def settle() -> float:
    """Collect every generation (frozen objects included), then freeze what survived.

    Returns:
        Seconds the collection took (the GIL is held meanwhile).
    """
    with _lock:  # two callers at once would each walk the whole heap
        started = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        return time.perf_counter() - started


def release() -> None:
    """Give the frozen objects back to the collector (a process that stops serving but goes on)."""
    with _lock:
        gc.unfreeze()
