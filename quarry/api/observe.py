"""The outermost middleware: request id, request metrics, in-flight count and the request's span.

Pure ASGI (Starlette's ``BaseHTTPMiddleware`` runs each request through an extra task and stream,
which costs more than the BM25 query itself, and would buffer the answer's event stream).
Per request: the id (:func:`quarry.logs.request_id`) set in a context variable and echoed as
``X-Request-ID``; the in-flight count (:data:`quarry.metrics.IN_FLIGHT`, which load shedding can
read; with shedding on, a request yields once after it is counted, so that the requests queued
behind it are counted too); with metrics on (``QUARRY_METRICS__ENABLED``) one latency observation and one counter
increment per route template and status; with tracing on
(:mod:`quarry.tracing`) a server span, which continues a caller's W3C ``traceparent``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from quarry import tracing
from quarry.api import pacing
from quarry.api.access import limited_early, shed_early
from quarry.api.errors import error_body
from quarry.api.shedding import Shed
from quarry.errors import Overloaded, RateLimited
from quarry.logs import REQUEST_ID, SHED_REPLY, request_id
from quarry.metrics import IN_FLIGHT, LATENCY, REQUESTS
from quarry.settings import AuthSettings

log = logging.getLogger(__name__)
HEADER = b"x-request-id"
# Labelled children by route template (and status): bounded sets, looked up without the metric's lock.
_LATENCY: dict[str, Any] = {}
_REQUESTS: dict[tuple[str, int], Any] = {}


class ObserveMiddleware:
    """Request id, request count and latency per route template and status, and tracing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on with its id; count it and time it once the response has gone (or failed)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = Headers(scope=scope)
        rid = request_id(headers.get("x-request-id"))
        token = REQUEST_ID.set(rid)
        metrics = _metrics_on(scope)
        status = 500
        echoed = (HEADER, rid.encode("ascii"))

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), echoed]}
            await send(message)

        span = _server_span(scope, headers, rid) if tracing.TRACER is not None else None
        IN_FLIGHT.add(1)  # always: load shedding reads it, metrics or not
        try:
            limited = _limited_early(scope, headers)
            if limited is not None:  # over its rate, or its id flooded with wrong secrets: 429 before routing
                auth = _auth_settings(scope)
                if auth is not None:  # held a moment (not in flight meanwhile): paced, as a shed 503
                    await pacing.hold(auth.limit_hold_s, limited.retry_after_s or 1.0, auth.shed_hold_max)
                await _reply_early(limited, 429, scope, receive, send_status)
                return
            if _shedding_on(scope):
                # Yield once, so that every request already read from the sockets is counted
                # before any is served: a BM25 search runs on the event loop without yielding,
                # and 32 queued requests were each counted alone (1 in flight), so nothing was
                # shed and a high-priority request waited behind all of them (bench/access.py).
                await asyncio.sleep(0)
                shed = _shed_early(scope, headers)
                if shed is not None:  # held a moment (not in flight meanwhile), then the 503
                    await _reply_shed(await shed.refused(), scope, receive, send_status)
                    return
            if span is None:
                await self.app(scope, receive, send_status)
            else:
                await _traced(span, self.app, scope, receive, send_status)
        finally:
            REQUEST_ID.reset(token)
            path = getattr(scope.get("route"), "path", "unmatched")
            IN_FLIGHT.add(-1)
            if metrics:
                _observe(path, status, time.perf_counter() - started)
            if span is not None:
                span.update_name(f"{scope['method']} {path}")
                span.set_attribute("http.route", path)
                span.set_attribute("http.response.status_code", status)
                span.end()


def _observe(path: str, status: int, seconds: float) -> None:
    latency = _LATENCY.get(path)
    if latency is None:
        latency = _LATENCY[path] = LATENCY.labels(path)
    latency.observe(seconds)
    count = _REQUESTS.get((path, status))
    if count is None:
        count = _REQUESTS[(path, status)] = REQUESTS.labels(path, str(status))
    count.inc()


def _metrics_on(scope: Scope) -> bool:
    """``QUARRY_METRICS__ENABLED`` of the app's service (on before the service is there)."""
    service = getattr(getattr(scope.get("app"), "state", None), "quarry", None)
    settings = getattr(service, "settings", None)
    return settings is None or bool(settings.metrics.enabled)


def _shedding_on(scope: Scope) -> bool:
    """Whether the app sheds load (``QUARRY_AUTH__SHED_IN_FLIGHT`` > 0)."""
    service = getattr(getattr(scope.get("app"), "state", None), "quarry", None)
    settings = getattr(service, "settings", None)
    return settings is not None and settings.auth.shed_in_flight > 0


def _auth_settings(scope: Scope) -> AuthSettings | None:
    service = getattr(getattr(scope.get("app"), "state", None), "quarry", None)
    settings = getattr(service, "settings", None)
    return None if settings is None else settings.auth


def _limited_early(scope: Scope, headers: Headers) -> RateLimited | None:
    if not scope["path"].startswith("/v1/"):
        return None
    access = getattr(getattr(scope.get("app"), "state", None), "access", None)
    return None if access is None else limited_early(access, headers)


def _shed_early(scope: Scope, headers: Headers) -> Shed | None:
    access = getattr(getattr(scope.get("app"), "state", None), "access", None)
    return None if access is None else shed_early(access, scope["method"], scope["path"], headers)


SHED_LOG_EVERY_S = 10.0  # at most one WARNING line per this many seconds while requests are shed
_shed_log = {"since": time.monotonic(), "count": 0}


async def _reply_shed(error: Overloaded, scope: Scope, receive: Receive, send: Send) -> None:
    """The 503 with ``Retry-After``, without uvicorn's access line (:class:`quarry.logs.ShedAccessFilter`).

    One WARNING line counts the shed requests, at most every :data:`SHED_LOG_EVERY_S` seconds.
    """
    _shed_log["count"] += 1
    now = time.monotonic()
    if now - _shed_log["since"] >= SHED_LOG_EVERY_S:
        log.warning("load shedding: %d requests refused (503 + Retry-After) in the last %.0f s",
                    _shed_log["count"], now - _shed_log["since"])
        _shed_log.update(since=now, count=0)
    await _reply_early(error, 503, scope, receive, send)


async def _reply_early(
    error: Overloaded | RateLimited, status: int, scope: Scope, receive: Receive, send: Send
) -> None:
    """A refusal before routing, with ``Retry-After`` and without uvicorn's access line (counted by its metric)."""
    body = error_body(type(error).__name__, error.message, error.retryable)
    retry = str(max(1, math.ceil(error.retry_after_s or 1)))
    token = SHED_REPLY.set(True)
    try:
        await JSONResponse(body, status_code=status, headers={"Retry-After": retry})(scope, receive, send)
    finally:
        SHED_REPLY.reset(token)


def _server_span(scope: Scope, headers: Headers, rid: str) -> Any:
    from opentelemetry.propagate import extract
    from opentelemetry.trace import SpanKind

    assert tracing.TRACER is not None
    attributes = {"http.request.method": scope["method"], "url.path": scope["path"], "quarry.request_id": rid}
    return tracing.TRACER.start_span(
        scope["method"], context=extract(dict(headers)), kind=SpanKind.SERVER, attributes=attributes
    )


async def _traced(span: Any, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Run the app with ``span`` current (the search's and the LLM's spans become its children)."""
    from opentelemetry import context, trace

    token = context.attach(trace.set_span_in_context(span))
    try:
        await app(scope, receive, send)
    finally:
        context.detach(token)
