"""Load shedding by key priority (step 5 of :mod:`quarry.api.access`): who is shed, and how it is refused."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from quarry.api import pacing
from quarry.errors import Overloaded
from quarry.metrics import IN_FLIGHT, SHED
from quarry.settings import AuthSettings

# routes with a cheaper honest answer than their full one (the semantic cache, BM25 alone)
CHEAP_ROUTES = frozenset({
    ("POST", "/v1/collections/{name}/search"), ("POST", "/v1/collections/{name}/answer"),
    ("POST", "/v1/chat/completions"),
})


@dataclass(frozen=True)
class Shed:
    """A request the saturated server sheds: its priority's policy and how to refuse it.

    ``hold_s`` and ``hold_max``: how long its 503 is held, and the most requests held at once
    (``QUARRY_AUTH__SHED_HOLD_S``, ``__SHED_HOLD_MAX``; :mod:`quarry.api.pacing`).
    """

    priority: str
    policy: str
    in_flight: int
    retry_after_s: float
    hold_s: float = 0.0
    hold_max: int = 0

    def refuse(self) -> Overloaded:
        """The 503 (counted in ``quarry_shed_total{priority}``) when no cheap answer exists."""
        SHED.labels(self.priority).inc()
        return Overloaded(
            f"the server is saturated ({self.in_flight} requests in flight) and sheds {self.priority}-priority "
            f"keys first; retry in {self.retry_after_s:g} s",
            retry_after_s=self.retry_after_s,
        )

    async def refused(self) -> Overloaded:
        """:meth:`refuse`'s 503 after the request's hold (Retry-After pacing, :func:`quarry.api.pacing.hold`)."""
        await pacing.hold(self.hold_s, self.retry_after_s, self.hold_max)
        return self.refuse()


def shedding(settings: AuthSettings, priority: int) -> Shed | None:
    """The shed decision of a key of ``priority`` now (``None``: served in full)."""
    if not settings.shed_in_flight or priority > 0:
        return None
    name, policy = ("low", settings.shed_low) if priority < 0 else ("normal", settings.shed_normal)
    in_flight = IN_FLIGHT.count
    if policy == "off" or in_flight <= settings.shed_in_flight:
        return None
    return Shed(name, policy, in_flight, settings.shed_retry_after_s, settings.shed_hold_s, settings.shed_hold_max)


def shed(request: Request) -> Shed | None:
    """The request's :class:`Shed` when the access layer let it through for a cheap answer."""
    found: Shed | None = getattr(request.state, "shed", None)
    return found
