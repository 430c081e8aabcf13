"""The checks behind ``/readyz``: each store asked one call at a time within a bound; each dependency's state.

A probe must answer quickly even when the store hangs (a paused server, a black-holed network):
orchestrators give a probe ~1-10 s, and a handler waiting on the store would hold a worker
thread per probe until the store's own timeouts. :class:`StoreProbe` runs the check on one
thread of its own, lets concurrent probes share the call in flight, and awaits it on the event
loop for at most ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from quarry.errors import QuarryError, StoreUnavailable


class StoreProbe:
    """Checks that a store answers (the vector store, or the state of record).

    Args:
        check: A cheap store call (``list_collections``, ``healthy``); raises ``StoreUnavailable`` on an outage.
        timeout_s: Longest a probe waits for it, in seconds.
        what: The store, for the message (``"the vector store"``).
    """

    def __init__(self, check: Callable[[], object], timeout_s: float = 2.0, what: str = "the vector store") -> None:
        self._check = check
        self._timeout_s = timeout_s
        self._what = what
        self._lock = threading.Lock()
        self._inflight: Future[object] | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quarry-readyz")

    async def __call__(self) -> StoreUnavailable | None:
        """``None`` when the store answered; the outage when it failed so or did not answer in time.

        Raises:
            QuarryError: The store answered with another error.
        """
        with self._lock:
            if self._inflight is None or self._inflight.done():
                self._inflight = self._pool.submit(self._check)
            inflight = self._inflight
        waiting = asyncio.wrap_future(inflight)
        waiting.add_done_callback(lambda done: done.cancelled() or done.exception())  # read, if late
        finished, _ = await asyncio.wait({waiting}, timeout=self._timeout_s)
        if not finished:
            return StoreUnavailable(f"{self._what} did not answer within {self._timeout_s:g} s")
        try:
            inflight.result()
        except StoreUnavailable as exc:
            return exc
        return None

    def close(self) -> None:
        """Stop the probe's thread (a check in flight is left to finish on its own)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


_DEGRADED = {  # a dependency that is unavailable -> what search and answers do meanwhile
    "vector_store": "vector store unavailable, BM25 only",
    "embedder": "query model unavailable, BM25 only",
    "llm": "LLM unavailable: answers carry the retrieved sources without generated text",
}


async def dependencies(state: Any, service: Any) -> dict[str, dict[str, str]]:
    """Each dependency's state, ``{"status": "ok" | "unavailable" | "error" | "off", "message": ...}``.

    ``state`` is the app's state (its ``store_probe``, ``state_probe`` and the answer router's
    ``generator``); ``service`` the :class:`~quarry.service.Quarry`. Each check is bounded: the
    stores' probes 2 s, the LLM's 1 s.
    """
    deps: dict[str, dict[str, str]] = {}
    outage = service.searcher.store_outage
    try:
        if outage is None:
            outage = await state.store_probe()
        deps["vector_store"] = _dep(outage)
    except QuarryError as exc:
        deps["vector_store"] = {"status": "error", "message": exc.message}
    try:
        deps["state_store"] = _dep(await state.state_probe())
    except QuarryError as exc:
        deps["state_store"] = {"status": "unavailable", "message": exc.message}
    deps["embedder"] = _dep(service.searcher.embed_outage)
    generator = getattr(state, "generator", None)
    probe = getattr(generator, "probe", None)
    deps["llm"] = {"status": "off", "message": "no LLM configured (QUARRY_LLM__URL)"} if probe is None else _dep(
        await probe()
    )
    deps["reranker"] = (
        {"status": "off", "message": "no reranker configured (QUARRY_RERANK__MODEL)"}
        if service.reranker is None else {"status": "ok", "message": service.reranker.model_id}
    )
    return deps


def degradations(deps: dict[str, dict[str, str]]) -> list[str]:
    """What search and answers do while a dependency that degrades them is unavailable, and why."""
    down = [name for name in _DEGRADED if deps[name]["status"] == "unavailable"]
    return [f"{_DEGRADED[name]}: {deps[name]['message']}" for name in down]


def _dep(outage: QuarryError | None) -> dict[str, str]:
    return {"status": "ok"} if outage is None else {"status": "unavailable", "message": outage.message}
