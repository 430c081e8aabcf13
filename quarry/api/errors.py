"""The one place where Quarry's errors become HTTP responses.

Body of every error response::

    {"error": {"type": "InvalidFilter", "message": "unknown filter field 'yeer'; ...",
               "retryable": false}}
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from quarry import errors as e

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


async def quarry_error(_: Request, exc: Exception) -> JSONResponse:
    """Render a :class:`~quarry.errors.QuarryError`."""
    assert isinstance(exc, e.QuarryError)
    headers = {"Retry-After": str(int(exc.retry_after_s))} if exc.retry_after_s else None
    return JSONResponse(
        error_body(type(exc).__name__, exc.message, exc.retryable), status_code=status_of(exc), headers=headers
    )


async def validation_error(_: Request, exc: Exception) -> JSONResponse:
    """Render FastAPI's request validation errors as one readable message (422)."""
    assert isinstance(exc, RequestValidationError)
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
    return JSONResponse(error_body("InvalidRequest", "; ".join(parts)), status_code=422)


def install(app: FastAPI) -> None:
    """Register the handlers on an app."""
    app.add_exception_handler(e.QuarryError, quarry_error)
    app.add_exception_handler(RequestValidationError, validation_error)
