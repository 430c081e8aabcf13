"""The client's errors: the server's error tree, by name, raised from its one envelope.

Every error response of a Quarry server is ``{"error": {"type", "message", "retryable"}}``
(``quarry.api.errors``). :func:`error_from_response` raises the class of this module named by
``type`` (the same names and the same tree as the server's ``quarry.errors``), so a caller
catches ``CollectionNotFound`` or ``Unauthenticated`` and never parses a body. An unknown
``type`` (a newer server) becomes the nearest class for its HTTP status. Two errors are the
client's own: :class:`ConnectionFailed` (nothing answered) and :class:`Timeout` (no answer in
time, or a job not finished by ``wait``'s deadline).
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

import httpx

__all__ = [
    "QuarryError", "InvalidRequest", "RequestValidationError", "InvalidQuery", "InvalidFilter", "InvalidDocument",
    "DimensionMismatch", "UnsupportedIndex", "UnsupportedParameter", "PayloadTooLarge", "Unauthenticated",
    "Forbidden", "RateLimited",
    "Overloaded", "NotFound", "CollectionNotFound", "Conflict", "ReindexRunning", "ReindexFailed",
    "CollectionExists", "ModelMismatch", "ModelDimensionMismatch", "ConfigError", "StoreError", "StoreUnavailable",
    "StoreTimeout", "StateStoreUnavailable", "IndexBuildFailed", "EmbeddingError", "EmbeddingUnavailable",
    "EmbeddingTimeout",
    "RerankError", "GenerationError", "GenerationUnavailable", "GenerationTimeout", "LLMNotConfigured",
    "EvaluationError", "ConnectionFailed", "Timeout", "error_from_response", "error_of", "retry_after",
]


class QuarryError(Exception):
    """Root of every error the client raises.

    Attributes:
        message: The server's explanation (or the client's, for a transport failure).
        status: The HTTP status (``None`` when no response came).
        type: The envelope's ``type`` as sent (the class name, unless the server is newer).
        retryable: Whether the same request may succeed later (the envelope's flag).
        retry_after_s: The ``Retry-After`` header in seconds, when one was sent.
    """

    def __init__(self, message: str, *, status: int | None = None, type: str | None = None,  # noqa: A002
                 retryable: bool = False, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type or self.__class__.__name__
        self.retryable = retryable
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return f"{self.type}: {self.message}" if self.status is not None else self.message


class InvalidRequest(QuarryError):
    """The request was refused as unusable (400, 413, 422)."""


class RequestValidationError(InvalidRequest):
    """The body or a parameter does not match the API's schema (422)."""


class InvalidQuery(InvalidRequest):
    """Empty query text, ``top_k``/``offset`` out of range, or an unknown mode."""


class InvalidFilter(InvalidRequest):
    """A metadata filter names an unknown field, has a wrong type or an unknown operator."""


class InvalidDocument(InvalidRequest):
    """An input document is malformed; nothing of its batch was written."""


class DimensionMismatch(InvalidRequest):
    """A vector's dimension differs from the collection's."""


class UnsupportedIndex(InvalidRequest):
    """The engine cannot build the requested index type or parameters."""


class UnsupportedParameter(InvalidRequest):
    """An OpenAI parameter the chat completions do not honour (``n > 1``, ``tools``, ``logprobs``...)."""


class PayloadTooLarge(InvalidRequest):
    """The request body, or a document in it, is larger than the server accepts (413)."""


class Unauthenticated(QuarryError):
    """No API key was sent, or the one sent is unknown, malformed, expired or revoked (401)."""


class Forbidden(QuarryError):
    """The key lacks the scope or the collection (403)."""


class RateLimited(QuarryError):
    """The key's request rate or token quota is spent (429, retryable after ``retry_after_s``)."""


class Overloaded(QuarryError):
    """The server is saturated and shed the request (503, retryable)."""


class NotFound(QuarryError):
    """No such resource (404)."""


class CollectionNotFound(NotFound):
    """No such collection (404)."""


class Conflict(QuarryError):
    """The request conflicts with the current state (409)."""


class ReindexRunning(Conflict):
    """Another process holds the collection's reindex lease (409, retryable)."""


class ReindexFailed(Conflict):
    """A reindex's verification failed; the live version still serves (409)."""


class CollectionExists(Conflict):
    """The collection name is taken (409)."""


class ModelMismatch(Conflict):
    """The collection's vectors come from another embedding model (409)."""


class ModelDimensionMismatch(ModelMismatch):
    """... of another dimension than the configured one (409)."""


class ConfigError(QuarryError):
    """The server's settings are wrong (500)."""


class StoreError(QuarryError):
    """A vector store operation failed (500)."""


class StoreUnavailable(StoreError):
    """The store cannot be reached (503, retryable)."""


class StoreTimeout(StoreUnavailable):
    """The store did not answer this call in time (503, retryable)."""


class StateStoreUnavailable(StoreUnavailable):
    """The state of record cannot be reached or missed its deadline (503, retryable)."""


class IndexBuildFailed(StoreError):
    """An index build failed or stalled and was rolled back (500)."""


class EmbeddingError(QuarryError):
    """The embedding model failed (500)."""


class EmbeddingUnavailable(EmbeddingError):
    """The embedding server is down (503, retryable)."""


class EmbeddingTimeout(EmbeddingUnavailable):
    """The embedding server did not answer one request in time (retryable)."""


class RerankError(QuarryError):
    """The reranker failed (500)."""


class GenerationError(QuarryError):
    """The LLM server failed or refused the request (502)."""


class GenerationUnavailable(GenerationError):
    """The LLM server is down or missed a deadline (503, retryable)."""


class GenerationTimeout(GenerationUnavailable):
    """No first token, a stall between tokens, or past the total deadline (503)."""


class LLMNotConfigured(GenerationError):
    """An answer was required but the server has no LLM (503)."""


class EvaluationError(QuarryError):
    """An evaluation could not run (500)."""


class ConnectionFailed(QuarryError):
    """The server could not be reached (no HTTP response; retryable)."""


class Timeout(QuarryError):
    """No answer within the client's timeout, or a job not finished by ``wait``'s deadline."""


_BY_NAME: dict[str, type[QuarryError]] = {
    cls.__name__: cls for cls in list(globals().values())
    if isinstance(cls, type) and issubclass(cls, QuarryError)
}
_BY_STATUS: dict[int, type[QuarryError]] = {
    400: InvalidRequest, 401: Unauthenticated, 403: Forbidden, 404: NotFound, 409: Conflict, 413: PayloadTooLarge,
    422: RequestValidationError, 429: RateLimited, 502: GenerationError, 503: StoreUnavailable,
}


def retry_after(headers: httpx.Headers) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or an HTTP date), or ``None`` when absent or unreadable."""
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_of(error: Any, status: int | None = None, retry_after_s: float | None = None) -> QuarryError:
    """The typed error of an envelope's ``error`` object (``{"type", "message", "retryable"}``)."""
    error = error if isinstance(error, dict) else {}
    kind = str(error.get("type") or (f"HTTP {status}" if status else "QuarryError"))
    cls = _BY_NAME.get(kind) or (_BY_STATUS.get(status, QuarryError) if status else QuarryError)
    return cls(str(error.get("message", "")), status=status, type=kind, retryable=bool(error.get("retryable", False)),
               retry_after_s=retry_after_s)


def error_from_response(resp: httpx.Response, body: Any = None) -> QuarryError:
    """The typed error of an error response (status >= 400), read from its envelope.

    Args:
        resp: The response (its body must have been read).
        body: Its parsed JSON, if already parsed.
    """
    if body is None:
        try:
            body = resp.json()
        except ValueError:
            body = None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):  # not Quarry's envelope: a proxy's page, say
        cls = _BY_STATUS.get(resp.status_code, QuarryError)
        text = resp.text[:300] or resp.reason_phrase
        return cls(text, status=resp.status_code, type=f"HTTP {resp.status_code}",
                   retryable=resp.status_code in (429, 502, 503, 504), retry_after_s=retry_after(resp.headers))
    return error_of(error, resp.status_code, retry_after(resp.headers))
