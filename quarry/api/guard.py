r"""What every request passes before it is routed: a clean path and a bounded body.

* A path holding a control character (U+0000-U+001F, U+007F-U+009F) is a 400. Collection names
  and document ids never hold one (:func:`indexing.documents.parse_document` refuses such ids), and
  a route pattern ends in ``$``, which also matches *before* a trailing newline: with documents
  ``victim`` and ``victim\n`` stored, ``DELETE .../documents/victim%0A`` used to delete
  ``victim``. A legacy id with a control character is deleted by ``POST .../documents/delete``,
  whose ids travel in the JSON body.
* A body over ``QUARRY_API__MAX_BODY_BYTES`` is a 413 ``PayloadTooLarge``: at once when its
  ``Content-Length`` says so (nothing is read), else as soon as the bytes streamed in pass the
  limit (Starlette's :class:`~starlette.middleware.body_limit.RequestBodyLimitResponder`
  counts them; the handler stops reading there, so a body is never buffered past the limit).
  An upload job's NDJSON body (:mod:`quarry.ingest_upload`) is bounded by
  ``QUARRY_INGEST__MAX_UPLOAD_BYTES`` instead.
* ``HEAD`` is answered as ``GET`` without the body (RFC 9110, 9.3.2): FastAPI's routes take GET
  only, so ``HEAD /healthz`` (what some load balancers and monitors send) was a 405.

The path parameter convertor ``whole`` (registered here, once) matches the rest of the path,
newlines included, so that a route's parameter is always the whole value or no match at all.
"""

from __future__ import annotations

import re
from typing import ClassVar

from starlette.convertors import Convertor, register_url_convertor
from starlette.datastructures import Headers
from starlette.middleware.body_limit import RequestBodyLimitResponder
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from quarry.api.errors import error_body
from quarry.errors import InvalidRequest, PayloadTooLarge
from quarry.ingest_upload import is_upload_request, upload_too_large
from quarry.settings import ApiSettings, IngestSettings

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_DEFAULT_MAX_BODY_BYTES = ApiSettings.model_fields["max_body_bytes"].default
_DEFAULT_MAX_UPLOAD_BYTES = IngestSettings.model_fields["max_upload_bytes"].default


class WholeConvertor(Convertor[str]):
    """``{name:whole}``: the rest of the path, ``/`` and newlines included.

    Starlette's ``path`` stops before a trailing newline: ``.`` does not match it, and the
    route's ``$`` matches before it.
    """

    regex: ClassVar[str] = "(?s:.*)"

    def convert(self, value: str) -> str:
        """The matched text as is."""
        return value

    def to_string(self, value: str) -> str:
        """The value as is."""
        return value


register_url_convertor("whole", WholeConvertor())


def body_too_large(limit: int) -> PayloadTooLarge:
    """The error of a body over ``limit`` bytes."""
    return PayloadTooLarge(
        f"request body is larger than {limit:,} bytes, the server's limit (QUARRY_API__MAX_BODY_BYTES); "
        "split it (an upsert: fewer documents per request)"
    )


class RequestGuard:
    """Pure ASGI middleware: control characters in the path (400), the body limit (413), HEAD as GET.

    The limit is read per request from the service's settings (``app.state.quarry``), so an app
    built around a factory (``quarry serve``) applies the settings its service loaded.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a bad path or an oversized body; pass anything else on, its body counted."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = _max_body_bytes(scope)
        bad = CONTROL.search(scope["path"])
        if bad is not None:
            error: InvalidRequest = InvalidRequest(
                f"the request path holds a control character (U+{ord(bad.group()):04X}) at character "
                f"{bad.start()}; collection names and document ids never hold one (delete a stored id "
                "that does with POST /v1/collections/{name}/documents/delete)"
            )
            await _reply(error, 400, scope, receive, send, close=False)  # the connection stays usable
            return
        headers = Headers(scope=scope)
        upload = is_upload_request(scope["method"], scope["path"], headers.get("content-type"))
        if upload:  # an upload job's NDJSON body: spooled to disk, bounded by its own setting
            limit = _max_upload_bytes(scope)
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await _reply(upload_too_large(limit) if upload else body_too_large(limit), 413, scope, receive, send)
            return
        if scope["method"] == "HEAD":  # FastAPI routes GET only; HEAD is GET without the body
            scope, send = {**scope, "method": "GET"}, _without_body(send)
        await RequestBodyLimitResponder(self.app, limit)(scope, receive, send)


def _without_body(send: Send) -> Send:
    """``send`` for a HEAD request: the GET answer's status and headers (its length too), no body."""

    async def send_head(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return send_head


def _max_upload_bytes(scope: Scope) -> int:
    service = getattr(getattr(scope.get("app"), "state", None), "quarry", None)
    settings = getattr(service, "settings", None)
    return int(settings.ingest.max_upload_bytes) if settings is not None else _DEFAULT_MAX_UPLOAD_BYTES


def _max_body_bytes(scope: Scope) -> int:
    service = getattr(getattr(scope.get("app"), "state", None), "quarry", None)
    settings = getattr(service, "settings", None)
    return int(settings.api.max_body_bytes) if settings is not None else _DEFAULT_MAX_BODY_BYTES


async def _reply(  # noqa: PLR0913 - the error and the ASGI call
    error: InvalidRequest, status: int, scope: Scope, receive: Receive, send: Send, *, close: bool = True
) -> None:
    """The error; ``close``: ask the client to close the connection (a body left unread: a 413)."""
    body = error_body(type(error).__name__, error.message, error.retryable)
    headers = {"connection": "close"} if close else None
    await JSONResponse(body, status_code=status, headers=headers)(scope, receive, send)
