"""What the sync and the async client share: the calls (method, path, body, parser), retries, SSE.

Each API call is a :class:`Call`: the request to send and how to read its JSON. :class:`Quarry`
and :class:`AsyncQuarry` send the same calls through ``httpx.Client`` / ``httpx.AsyncClient``,
so both speak exactly the same API.

Retries: 429 (``RateLimited``) and 503 with ``retryable: true`` (``Overloaded``,
``StoreUnavailable``, ``EmbeddingUnavailable``, ...) are sent again, honouring ``Retry-After``
(capped at ``max_retry_wait_s``; without the header an exponential backoff from 0.5 s), at
most ``max_retries`` times (tenacity); a connection that could not be opened is retried by the
transport (``httpx.HTTPTransport(retries=...)``: the request was never sent). A request whose
body is a one-pass stream (an upload) is not retried.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from tenacity import RetryCallState, retry_if_exception, stop_after_attempt

from quarry_client.errors import QuarryError, RateLimited
from quarry_client.models import (
    Answer,
    AnswerEvent,
    Collection,
    Document,
    DocumentPage,
    Job,
    SearchResult,
    WriteReport,
)

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV = "QUARRY_URL"
KEY_ENV = "QUARRY_API_KEY"
NDJSON = "application/x-ndjson"
EMPTY_REPORT = WriteReport(documents=0, added=0, updated=0, unchanged=0, deleted=0, chunks_written=0,
                           chunks_deleted=0, embedded=0, truncated=0, elapsed_s=0.0)


def resolve(url: str | None, api_key: str | None) -> tuple[str, str | None]:
    """The server URL and key: the arguments, else ``QUARRY_URL`` / ``QUARRY_API_KEY``, else the default URL."""
    return (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/"), api_key or os.environ.get(KEY_ENV) or None


def headers_for(api_key: str | None) -> dict[str, str]:
    """The request headers: ``Authorization: Bearer <key>`` when a key is given."""
    out = {"User-Agent": "quarry-client/0.1", "Accept": "application/json"}
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


def seg(value: str) -> str:
    """A path segment, percent-encoded (a document id may hold ``/``, ``?`` or spaces)."""
    return quote(value, safe="")


@dataclass
class Call(Generic[T]):
    """One API request and the parser of its JSON body."""

    method: str
    path: str
    parse: Callable[[Any], T]
    json: Any = None
    params: Mapping[str, Any] | None = None
    content: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    retry: bool = True

    def kwargs(self) -> dict[str, Any]:
        """``httpx`` request arguments."""
        out: dict[str, Any] = {"headers": self.headers}
        if self.json is not None:
            out["json"] = self.json
        if self.params:
            out["params"] = {k: v for k, v in self.params.items() if v is not None}
        if self.content is not None:
            out["content"] = self.content
        return out


def _drop_none(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


def is_retried(exc: BaseException) -> bool:
    """429, or a 503 the server marked retryable."""
    return isinstance(exc, RateLimited) or (isinstance(exc, QuarryError) and exc.status == 503 and exc.retryable)


class RetryPolicy:
    """Bounded retries of 429 and retryable 503 (see the module docstring).

    Args:
        max_retries: Retries after the first attempt (0: none).
        max_wait_s: The longest wait between two attempts, in seconds (a longer ``Retry-After`` is cut).
        base_s: The first backoff when no ``Retry-After`` came (doubling each time).
    """

    def __init__(self, max_retries: int = 3, max_wait_s: float = 30.0, base_s: float = 0.5) -> None:
        self.max_retries, self.max_wait_s, self.base_s = max_retries, max_wait_s, base_s

    def wait(self, state: RetryCallState) -> float:
        """Seconds before the next attempt: the error's ``Retry-After``, else exponential backoff."""
        exc = state.outcome.exception() if state.outcome is not None else None
        hinted = getattr(exc, "retry_after_s", None)
        seconds = hinted if hinted is not None else self.base_s * 2 ** (state.attempt_number - 1)
        return float(min(max(seconds, 0.0), self.max_wait_s))

    def tenacity(self, enabled: bool = True) -> dict[str, Any]:
        """The arguments of ``tenacity.Retrying`` / ``AsyncRetrying``."""
        return {
            "retry": retry_if_exception(is_retried), "wait": self.wait, "reraise": True,
            "stop": stop_after_attempt(1 + (self.max_retries if enabled else 0)),
        }


def parse_sse(lines: Iterable[str]) -> Iterator[AnswerEvent]:
    """Server-Sent Events from a stream's lines (``event:``/``data:`` fields, a blank line ends one).

    Comments (``: ping``) are skipped; ``data`` is parsed as JSON (a non-JSON payload is kept as
    ``{"text": ...}``).
    """
    event, data = "message", list[str]()
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield _event(event, "\n".join(data))
            event, data = "message", list[str]()
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
    if data:
        yield _event(event, "\n".join(data))


def _event(name: str, payload: str) -> AnswerEvent:
    try:
        data = json.loads(payload)
    except ValueError:
        data = {"text": payload}
    return AnswerEvent(event=name, data=data if isinstance(data, dict) else {"value": data})


def ndjson(documents: Iterable[Mapping[str, Any]], chunk_bytes: int = 1 << 16) -> Iterator[bytes]:
    """Documents as NDJSON, in chunks of about ``chunk_bytes`` (an upload job's body; one pass)."""
    buf = bytearray()
    for doc in documents:
        buf += json.dumps(doc, ensure_ascii=False).encode("utf-8") + b"\n"
        if len(buf) >= chunk_bytes:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


# --- the calls ----------------------------------------------------------------------------------
def list_collections() -> Call[list[Collection]]:
    """``GET /v1/collections``."""
    return Call("GET", "/v1/collections", lambda b: [Collection.model_validate(c) for c in b["collections"]])


def create_collection(name: str, **options: Any) -> Call[Collection]:
    """``POST /v1/collections`` (``language``, ``chunk_size``, ``chunk_overlap``, ``fusion``, ``tenancy``)."""
    return Call("POST", "/v1/collections", Collection.model_validate, json=_drop_none({"name": name, **options}))


def describe(name: str) -> Call[Collection]:
    """``GET /v1/collections/{name}``."""
    return Call("GET", f"/v1/collections/{seg(name)}", Collection.model_validate)


def drop_collection(name: str) -> Call[str]:
    """``DELETE /v1/collections/{name}``."""
    return Call("DELETE", f"/v1/collections/{seg(name)}", lambda b: str(b["deleted"]))


def recall(name: str) -> Call[dict[str, Any]]:
    """``GET /v1/collections/{name}/recall``."""
    return Call("GET", f"/v1/collections/{seg(name)}/recall", dict)


def upsert(name: str, documents: list[Mapping[str, Any]]) -> Call[WriteReport]:
    """``POST /v1/collections/{name}/documents`` (one atomic batch, at most 1,000)."""
    return Call("POST", f"/v1/collections/{seg(name)}/documents", WriteReport.model_validate,
                json={"documents": [dict(d) for d in documents]})


def delete_documents(name: str, ids: list[str] | None, filters: Mapping[str, Any] | None) -> Call[WriteReport]:
    """``POST /v1/collections/{name}/documents/delete`` by ids or by a metadata filter."""
    return Call("POST", f"/v1/collections/{seg(name)}/documents/delete", WriteReport.model_validate,
                json=_drop_none({"ids": ids, "filters": filters}))


def list_documents(name: str, cursor: str | None, limit: int) -> Call[DocumentPage]:
    """``GET /v1/collections/{name}/documents``."""
    return Call("GET", f"/v1/collections/{seg(name)}/documents", DocumentPage.model_validate,
                params={"cursor": cursor, "limit": limit})


def get_document(name: str, document_id: str) -> Call[Document]:
    """``GET /v1/collections/{name}/documents/{id}``."""
    return Call("GET", f"/v1/collections/{seg(name)}/documents/{seg(document_id)}", Document.model_validate)


def search(name: str, query: str, **options: Any) -> Call[SearchResult]:
    """``POST /v1/collections/{name}/search`` (``top_k``, ``mode``, ``filters``, ``offset``, ``rerank``, ...).

    Sent with an ``X-Request-ID`` of its own (a retry sends the same), kept as the result's ``request_id``.
    """
    rid = uuid.uuid4().hex
    return Call("POST", f"/v1/collections/{seg(name)}/search",
                lambda b: SearchResult.model_validate({**b, "request_id": rid}),
                json=_drop_none({"query": query, **options}), headers={"X-Request-ID": rid})


def answer(name: str, query: str, stream: bool, **options: Any) -> Call[Answer]:
    """``POST /v1/collections/{name}/answer`` (``stream``: Server-Sent Events), with its own ``X-Request-ID``."""
    rid = uuid.uuid4().hex
    headers = {"Accept": "text/event-stream", "X-Request-ID": rid} if stream else {"X-Request-ID": rid}
    return Call("POST", f"/v1/collections/{seg(name)}/answer",
                lambda b: Answer.model_validate({**b, "request_id": rid}),
                json=_drop_none({"query": query, "stream": stream, **options}), headers=headers)


def feedback(name: str, request_id: str, rating: str | None, clicked: list[str] | None) -> Call[dict[str, Any]]:
    """``POST /v1/collections/{name}/feedback``: a thumbs (``up``/``down``) or clicked hits of a served request."""
    return Call("POST", f"/v1/collections/{seg(name)}/feedback", dict,
                json=_drop_none({"request_id": request_id, "rating": rating, "clicked": clicked}))


def submit_path(name: str, path: str, on_error: str | None, prune: bool) -> Call[Job]:
    """``POST /v1/collections/{name}/jobs`` naming a source on the server's disk."""
    return Call("POST", f"/v1/collections/{seg(name)}/jobs", Job.model_validate,
                json=_drop_none({"path": path, "on_error": on_error, "prune": prune}))


def submit_upload(name: str, body: Any, on_error: str | None, prune: bool) -> Call[Job]:
    """``POST /v1/collections/{name}/jobs`` with NDJSON documents as the body (not retried: one pass)."""
    params = _drop_none({"on_error": on_error, "prune": str(prune).lower()})
    return Call("POST", f"/v1/collections/{seg(name)}/jobs", Job.model_validate, params=params, content=body,
                headers={"Content-Type": NDJSON}, retry=isinstance(body, bytes))


def get_job(job_id: str) -> Call[Job]:
    """``GET /v1/jobs/{id}``."""
    return Call("GET", f"/v1/jobs/{seg(job_id)}", Job.model_validate)


def cancel_job(job_id: str) -> Call[Job]:
    """``DELETE /v1/jobs/{id}``."""
    return Call("DELETE", f"/v1/jobs/{seg(job_id)}", Job.model_validate)


def list_jobs(collection: str | None, state: str | None, limit: int) -> Call[list[Job]]:
    """``GET /v1/jobs``: the tenant's jobs, newest first."""
    return Call("GET", "/v1/jobs", lambda b: [Job.model_validate(j) for j in b["jobs"]],
                params={"collection": collection, "state": state, "limit": limit})


def health() -> Call[dict[str, Any]]:
    """``GET /readyz``'s body (200 or 503 both read)."""
    return Call("GET", "/readyz", dict)
