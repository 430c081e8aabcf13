"""The one place where Quarry's errors become HTTP responses, and where the OpenAPI says so.

Body of every error response (:class:`~quarry.api.models.ErrorOut`)::

    {"error": {"type": "InvalidFilter", "message": "unknown filter field 'yeer'; ...",
               "retryable": false}}

:func:`error_responses` turns the errors a route can raise into its OpenAPI ``responses`` through
the same :data:`STATUS` table the handler uses, so the schema cannot drift from the answers.
The router's own answers carry the methods a path allows: a 405 has an ``Allow`` header naming
every method of that path, and ``OPTIONS`` on a known path answers 204 with that header.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import fastapi.routing
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY
from starlette.routing import BaseRoute, Match

from quarry import errors as e
from quarry.api.models import ErrorOut

log = logging.getLogger(__name__)

STATUS: dict[type[e.QuarryError], int] = {
    e.PayloadTooLarge: 413,
    e.InvalidRequest: 400,
    e.Unauthenticated: 401,
    e.Forbidden: 403,
    e.RateLimited: 429,
    e.Overloaded: 503,
    e.NotFound: 404,
    e.Conflict: 409,
    e.StoreUnavailable: 503,
    e.EmbeddingUnavailable: 503,
    e.GenerationError: 502,
    e.GenerationUnavailable: 503,
    e.LLMNotConfigured: 503,
    e.QuarryError: 500,
}


# What the request-validation handler (422) and the router answer, for the OpenAPI.
_VALIDATION = ("RequestValidationError", "the body or a parameter does not match the schema")
_FASTAPI_UNPARSABLE = "There was an error parsing the body"
_UNPARSABLE = (
    "it is not UTF-8, nests arrays or objects too deeply, or holds a number too long to read; "
    "send UTF-8 JSON of ordinary depth"
)
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}


def status_of(exc: e.QuarryError | type[e.QuarryError]) -> int:
    """HTTP status for an error (or error class): the entry of its nearest ancestor in :data:`STATUS`."""
    cls: type[e.QuarryError] = exc if isinstance(exc, type) else type(exc)
    for parent in cls.__mro__:
        if parent in STATUS:
            return STATUS[parent]
    return 500


def error_responses(*raised: type[e.QuarryError], body: bool = False, validated: bool = True) -> dict[int | str, Any]:
    """OpenAPI ``responses`` of a route, from the error classes it can raise.

    Args:
        raised: Error classes the route may raise; each is documented under its :data:`STATUS`.
        body: The route takes a JSON body: adds :class:`~quarry.errors.PayloadTooLarge` (413).
        validated: The route has a body or parameters FastAPI validates: adds the 422 envelope
            (FastAPI would otherwise document its own ``HTTPValidationError``, which we never send).

    Returns:
        ``{status: {"model": ErrorOut, "description": ...}}``, one entry per status; the
        description lists each error type with the first line of its docstring; a status with a
        retryable error documents ``Retry-After``.
    """
    by_status: dict[int, list[tuple[str, str]]] = {}
    retryable: set[int] = set()
    classes: tuple[type[e.QuarryError], ...] = (*raised, e.PayloadTooLarge) if body else raised
    for cls in classes:
        status = status_of(cls)
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        if (cls.__name__, doc) not in by_status.setdefault(status, []):
            by_status[status].append((cls.__name__, doc))
        if cls.retryable:
            retryable.add(status)
    if validated:
        by_status.setdefault(422, []).append(_VALIDATION)
    out: dict[int | str, Any] = {}
    for status in sorted(by_status):
        entry: dict[str, Any] = {
            "model": ErrorOut, "description": "\n".join(f"- `{name}`: {doc}" for name, doc in by_status[status]),
        }
        if status in retryable:
            entry["headers"] = _RETRY_AFTER
        out[status] = entry
    return out


def error_body(kind: str, message: str, retryable: bool = False) -> dict[str, object]:
    """The JSON error envelope."""
    return {"error": {"type": kind, "message": message, "retryable": retryable}}


async def quarry_error(request: Request, exc: Exception) -> JSONResponse:
    """Render a :class:`~quarry.errors.QuarryError`.

    The body carries ``exc.message`` (Quarry's words); a store error's ``detail`` (the engine's
    or the driver's text) is logged here and never sent.
    """
    assert isinstance(exc, e.QuarryError)
    if isinstance(exc, e.StoreError) and exc.detail:
        level = logging.WARNING if isinstance(exc, e.StoreUnavailable) else logging.ERROR
        log.log(level, "%s %s: %s (%s): %s", request.method, request.url.path, type(exc).__name__, exc.message,
                exc.detail)
    headers = dict(getattr(exc, "headers", {}))  # e.g. Unauthenticated's WWW-Authenticate
    if exc.retry_after_s:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    body = error_body(type(exc).__name__, exc.message, exc.retryable)
    if isinstance(exc, e.UnsupportedParameter):  # OpenAI's error shape: its clients read param and code
        body["error"] = {**body["error"], "param": exc.param, "code": exc.code}  # type: ignore[dict-item]
    return JSONResponse(body, status_code=status_of(exc), headers=headers or None)


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    """Render FastAPI's request validation errors as one readable message (422).

    A body sent with another ``Content-Type`` than JSON is not read as JSON by FastAPI: the
    message says so, instead of "Input should be a valid dictionary".
    """
    assert isinstance(exc, RequestValidationError)
    kind = request.headers.get("content-type", "")
    if request.method in ("POST", "PUT", "PATCH") and not is_json(kind):
        message = f"the request body must be JSON sent with Content-Type: application/json, got {e.clip(kind)}"
        return JSONResponse(error_body("InvalidRequest", message), status_code=422)
    parts = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            parts.append(_json_error(err, exc.body))
            continue
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")  # a key may be the client's
        where = where if len(where) <= e.ECHO_CHARS else f"{where[: e.ECHO_CHARS]}…"
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
    return JSONResponse(error_body("InvalidRequest", "; ".join(parts)), status_code=422)


def is_json(content_type: str) -> bool:
    """Whether FastAPI reads a body of this ``Content-Type`` as JSON (none, ``*/json``, ``*/*+json``)."""
    media = content_type.split(";", 1)[0].strip().lower()
    subtype = media.rpartition("/")[2]
    return not media or subtype == "json" or subtype.endswith("+json")


def _json_error(err: Mapping[str, Any], body: object) -> str:
    """Where a body that is not JSON broke, as ``json.JSONDecodeError`` reports it (line, column)."""
    reason = err.get("ctx", {}).get("error", "JSON decode error")
    loc = err.get("loc", ())
    pos = loc[-1] if loc and isinstance(loc[-1], int) else None
    if pos is None or not isinstance(body, str):
        return f"request body is not valid JSON: {reason}"
    line = body.count("\n", 0, pos) + 1
    column = pos - (body.rfind("\n", 0, pos) + 1) + 1
    near = body[max(0, pos - 20) : pos + 20]
    return f"request body is not valid JSON: {reason} at line {line}, column {column} (char {pos}), near {near!r}"


async def http_error(request: Request, exc: Exception) -> Response:
    """Render the router's own errors (unknown path 404, wrong method 405) in the same envelope.

    A 405 names every method of the path in ``Allow`` (the router names only those of the first
    route that matched the path); ``OPTIONS`` on a known path is answered here: 204 with ``Allow``.
    A 413 is the body limit of :class:`~quarry.api.guard.RequestGuard`, met while the body
    streamed in: rendered as :class:`~quarry.errors.PayloadTooLarge`. A 400 is FastAPI's "error
    parsing the body" (too deep, a too-long integer, not UTF-8): an ``InvalidRequest``.
    """
    assert isinstance(exc, HTTPException)
    limit = request.scope.get(MAX_BODY_SIZE_SCOPE_KEY)
    if exc.status_code == 413 and isinstance(limit, int):
        from quarry.api.guard import body_too_large

        return await quarry_error(request, body_too_large(limit))
    headers, message = dict(exc.headers or {}), str(exc.detail)
    if exc.status_code == 400 and message == _FASTAPI_UNPARSABLE:
        # FastAPI's answer to a body json.loads fails on without a JSONDecodeError: nesting past the
        # recursion limit, an integer of over 4,300 digits, bytes that are not UTF-8.
        message = f"request body cannot be parsed: {_UNPARSABLE}"
    if exc.status_code == 405:
        allow = headers["Allow"] = allowed_methods(request)
        if request.method == "OPTIONS":
            return Response(status_code=204, headers={"Allow": allow})
        message = f"method {request.method} is not allowed on {request.url.path}; allowed: {allow}"
    kind = {400: "InvalidRequest", 404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
    return JSONResponse(error_body(kind, message), status_code=exc.status_code, headers=headers or None)


def allowed_methods(request: Request) -> str:
    """The ``Allow`` header of the request's path: OPTIONS, the methods of its route template, HEAD with GET.

    The template is that of the first route (in the router's order) matching the path, as the
    OpenAPI lists it: ``/v1/collections/c/documents/delete`` is the batch-delete endpoint (POST),
    although the ``DELETE .../documents/{document_id}`` route would also take it.
    """
    template, methods = None, {"OPTIONS"}
    for route in flat_routes(request.app.router.routes):
        path, route_methods = getattr(route, "path", None), getattr(route, "methods", None)
        if not route_methods or (template is not None and path != template):
            continue
        if route.matches(request.scope)[0] != Match.NONE:
            template = path
            methods.update(route_methods)
    if "GET" in methods:  # RequestGuard answers HEAD as GET
        methods.add("HEAD")
    return ", ".join(sorted(methods))


def flat_routes(routes: Sequence[BaseRoute]) -> Iterable[Any]:
    """The app's routes, included routers flattened (FastAPI >= 0.13x nests them)."""
    flatten = getattr(fastapi.routing, "iter_route_contexts", None)
    return routes if flatten is None else flatten(routes)


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    """Anything else is a bug: logged with its traceback, answered as a JSON 500."""
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    message = f"internal error ({type(exc).__name__}); the server log has the details"
    return JSONResponse(error_body("InternalError", message), status_code=500)


def install(app: FastAPI) -> None:
    """Register the handlers on an app."""
    app.add_exception_handler(e.QuarryError, quarry_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, internal_error)
