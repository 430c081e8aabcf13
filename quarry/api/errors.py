"""The one place where Quarry's errors become HTTP responses.

Body of every error response::

    {"error": {"type": "InvalidFilter", "message": "unknown filter field 'yeer'; ...",
               "retryable": false}}
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from quarry import errors as e

log = logging.getLogger(__name__)

STATUS: dict[type[e.QuarryError], int] = {
    e.InvalidRequest: 400,
    e.NotFound: 404,
    e.Conflict: 409,
    e.StoreUnavailable: 503,
    e.EmbeddingUnavailable: 503,
    e.QuarryError: 500,
}


def status_of(exc: e.QuarryError) -> int:
    """HTTP status for an error: the entry of its nearest ancestor in :data:`STATUS`."""
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


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
    headers = {"Retry-After": str(math.ceil(exc.retry_after_s))} if exc.retry_after_s else None
    return JSONResponse(
        error_body(type(exc).__name__, exc.message, exc.retryable), status_code=status_of(exc), headers=headers
    )


async def validation_error(_: Request, exc: Exception) -> JSONResponse:
    """Render FastAPI's request validation errors as one readable message (422)."""
    assert isinstance(exc, RequestValidationError)
    parts = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            parts.append(_json_error(err, exc.body))
            continue
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
    return JSONResponse(error_body("InvalidRequest", "; ".join(parts)), status_code=422)


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


async def http_error(_: Request, exc: Exception) -> JSONResponse:
    """Render the router's own errors (unknown path 404, wrong method 405) in the same envelope."""
    assert isinstance(exc, HTTPException)
    kind = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
    return JSONResponse(error_body(kind, str(exc.detail)), status_code=exc.status_code, headers=exc.headers)


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
