"""Retry-After pacing: a shed request is held a short while before its 503, an early 429 before its 429.

The 429s answered before routing (a key over its rate, an id whose wrong secrets fill the
second: :func:`quarry.api.access.limited_early`) are held the same way, ``min(QUARRY_AUTH__LIMIT_HOLD_S,
Retry-After)``, and count against the same ``QUARRY_AUTH__SHED_HOLD_MAX``: 32 closed-loop
connections sending wrong secrets got ~4,600 429s a second, which took the other tenants' p50
to 3.7x idle (``bench/abuse.py``).

A client that ignores ``Retry-After`` and retries at once turns each shed 503 into the next
request: 32 such closed-loop clients sent ~800 503s a second, and the event loop that answered
them was the one high-priority requests waited on (their p99 4.0x idle, ``bench/access.py``).
Holding each shed request ``min(QUARRY_AUTH__SHED_HOLD_S, Retry-After)`` seconds before its 503
paces such a client from the server side (32 clients: at most 32 / hold_s 503s a second; the
default hold is the default ``Retry-After``, 1 s, so it is paced as if it honoured it); a client
that honours ``Retry-After`` waits the hold and then the ``Retry-After``.

This is tarpitting, as HAProxy's ``http-request tarpit`` (held for ``timeout tarpit``, then
answered with ``deny_status``) and SMTP tarpits (a delay before each reply) do it; here the hold is
short, the answer honest (503 ``Overloaded`` with ``Retry-After``) and only shed requests are held:
``high``-priority keys, open routes and served requests never are.

The hold is a timer (``asyncio.sleep``): no CPU, no worker thread. It is not jittered: with a
random 50-100 % of the hold (AWS's "equal jitter") the high key's p50 under 32 ignoring clients
was no better (2.3-3.6 ms against 2.1-2.4 ms without; two runs of ``bench/access.py``, not
alternated, so a hint only). A held request does not count
as in flight (:data:`quarry.metrics.IN_FLIGHT`, which the shedding decision reads), else 32 held
requests would keep the server "saturated" while it is idle. At most
``QUARRY_AUTH__SHED_HOLD_MAX`` requests are held at once (:data:`quarry.metrics.SHED_HELD`, the
gauge ``quarry_shed_requests_held``); beyond that a shed request gets its 503 at once, so that many
connections cannot pin memory and sockets.
"""

from __future__ import annotations

import asyncio

from quarry.metrics import IN_FLIGHT, SHED_HELD


async def hold(hold_s: float, retry_after_s: float, max_held: int) -> bool:
    """Hold a shed request ``min(hold_s, retry_after_s)`` seconds, if fewer than ``max_held`` are held.

    The caller's request is counted in :data:`~quarry.metrics.IN_FLIGHT` (the outer middleware
    counts every request); it is not counted while held.

    Args:
        hold_s: ``QUARRY_AUTH__SHED_HOLD_S``, seconds (0: no hold).
        retry_after_s: The 503's ``Retry-After``, seconds (the hold never exceeds it).
        max_held: ``QUARRY_AUTH__SHED_HOLD_MAX``, requests held at once.

    Returns:
        Whether the request was held (``False``: no hold set, or ``max_held`` already held).
    """
    delay = min(hold_s, retry_after_s)
    if delay <= 0 or SHED_HELD.count >= max_held:
        return False
    SHED_HELD.add(1)
    IN_FLIGHT.add(-1)
    try:
        await asyncio.sleep(delay)
    finally:
        IN_FLIGHT.add(1)
        SHED_HELD.add(-1)
    return True
