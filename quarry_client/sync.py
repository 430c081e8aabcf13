"""The synchronous client: :class:`Quarry` (``httpx.Client``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

import httpx
from tenacity import Retrying

from quarry_client import _core
from quarry_client._core import Call, RetryPolicy
from quarry_client.errors import ConnectionFailed, QuarryError, Timeout, error_from_response
from quarry_client.models import (
    Answer,
    AnswerEvent,
    Collection,
    Document,
    DocumentPage,
    DocumentSummary,
    Job,
    SearchResult,
    WriteReport,
)

T = TypeVar("T")


class Quarry:
    """A Quarry server's API, synchronously.

    Args:
        url: The server (``http://host:port``); default ``QUARRY_URL``, else ``http://127.0.0.1:8000``.
        api_key: Sent as ``Authorization: Bearer``; default ``QUARRY_API_KEY`` (none: an open server).
        timeout: Seconds for each request (connect, read, write, pool; a float or an ``httpx.Timeout``).
        max_retries: Retries of a 429 or a retryable 503 (``Retry-After`` honoured), and of a
            connection that could not be opened.
        max_retry_wait_s: The longest wait between two attempts (a longer ``Retry-After`` is cut).
        transport: An ``httpx`` transport to use instead (tests, proxies).

    Raises (every method):
        QuarryError: A subclass named as the server's error type (``CollectionNotFound``,
            ``Unauthenticated``, ``Forbidden``, ``RateLimited`` after the retries...);
            :class:`~quarry_client.errors.ConnectionFailed` when nothing answered,
            :class:`~quarry_client.errors.Timeout` when the answer took longer than ``timeout``.
    """

    def __init__(  # noqa: PLR0913 - the client's options
        self, url: str | None = None, api_key: str | None = None, *, timeout: float | httpx.Timeout = 60.0,
        max_retries: int = 3, max_retry_wait_s: float = 30.0, transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url, api_key = _core.resolve(url, api_key)
        self.retry = RetryPolicy(max_retries, max_retry_wait_s)
        self._http = httpx.Client(
            base_url=self.url, headers=_core.headers_for(api_key), timeout=timeout,
            transport=transport or httpx.HTTPTransport(retries=max_retries),
        )

    # --- plumbing ----------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Quarry:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _send(self, call: Call[Any], stream: bool = False) -> httpx.Response:
        request = self._http.build_request(call.method, call.path, **call.kwargs())
        try:
            resp = self._http.send(request, stream=stream)
        except httpx.TimeoutException as exc:
            raise Timeout(f"{call.method} {call.path}: no answer from {self.url} in time ({exc})") from exc
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"{self.url} cannot be reached: {exc}", retryable=True) from exc
        if resp.status_code >= 400:
            if stream:
                resp.read()
                resp.close()
            raise error_from_response(resp)
        return resp

    def _run(self, call: Call[T]) -> T:
        for attempt in Retrying(**self.retry.tenacity(call.retry)):
            with attempt:
                resp = self._send(call)
        return call.parse(resp.json())

    # --- collections -------------------------------------------------------------------------
    def list_collections(self) -> list[Collection]:
        """The collections the key may use."""
        return self._run(_core.list_collections())

    def create_collection(self, name: str, **options: Any) -> Collection:
        """Create a collection (``language``, ``chunk_size``, ``chunk_overlap``, ``fusion``, ``tenancy``).

        Raises:
            CollectionExists: The name is taken.
        """
        return self._run(_core.create_collection(name, **options))

    def ensure_collection(self, name: str, **options: Any) -> Collection:
        """The collection ``name``, created with ``options`` when it does not exist."""
        try:
            return self.create_collection(name, **options)
        except QuarryError as exc:
            if exc.type != "CollectionExists":
                raise
        return self.describe(name)

    def describe(self, name: str) -> Collection:
        """A collection's configuration and counts (``documents``, ``chunks``, ``vectors``)."""
        return self._run(_core.describe(name))

    def drop_collection(self, name: str) -> str:
        """Drop a collection and all its data; returns its name."""
        return self._run(_core.drop_collection(name))

    def recall(self, name: str) -> dict[str, Any]:
        """The recall monitor's figures of a collection (``GET /v1/collections/{name}/recall``)."""
        return self._run(_core.recall(name))

    # --- documents ---------------------------------------------------------------------------
    def upsert(self, name: str, documents: Iterable[Mapping[str, Any]], batch_size: int = 500) -> WriteReport:
        """Insert or replace documents (``{"id", "text", "title"?, "metadata"?}``), ``batch_size`` per request.

        Each request is atomic; the report sums them (``elapsed_s`` included).
        """
        total: WriteReport | None = None
        batch: list[Mapping[str, Any]] = []
        for doc in documents:
            batch.append(doc)
            if len(batch) >= batch_size:
                total = _sum(total, self._run(_core.upsert(name, batch)))
                batch = []
        if batch:
            total = _sum(total, self._run(_core.upsert(name, batch)))
        return total if total is not None else _core.EMPTY_REPORT

    def delete_documents(self, name: str, ids: list[str] | None = None, *,
                         filters: Mapping[str, Any] | None = None) -> WriteReport:
        """Delete documents by id, or those whose metadata matches ``filters``."""
        return self._run(_core.delete_documents(name, ids, filters))

    def list_documents(self, name: str, *, cursor: str | None = None, limit: int = 100) -> DocumentPage:
        """One page of documents in id order; pass ``next_cursor`` back for the next."""
        return self._run(_core.list_documents(name, cursor, limit))

    def iter_documents(self, name: str, *, page_size: int = 1000) -> Iterator[DocumentSummary]:
        """Every document of a collection, page after page."""
        cursor: str | None = None
        while True:
            page = self.list_documents(name, cursor=cursor, limit=page_size)
            yield from page.documents
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def get_document(self, name: str, document_id: str) -> Document:
        """A stored document with its chunks.

        Raises:
            NotFound: No such document.
        """
        return self._run(_core.get_document(name, document_id))

    # --- search and answers ------------------------------------------------------------------
    def search(self, name: str, query: str, *, top_k: int = 10, mode: str = "hybrid",
               filters: Mapping[str, Any] | None = None, **options: Any) -> SearchResult:
        """Search a collection (``offset``, ``rerank``, ``fusion``, ``min_score``, ``group_by_document``)."""
        return self._run(_core.search(name, query, top_k=top_k, mode=mode, filters=filters, **options))

    def answer(self, name: str, query: str, **options: Any) -> Answer:
        """An LLM's answer with citations (``top_k``, ``mode``, ``filters``, ``require_answer``, ...)."""
        return self._run(_core.answer(name, query, False, **options))

    def answer_stream(self, name: str, query: str, **options: Any) -> Iterator[AnswerEvent]:
        """The answer as it is generated: ``sources``, ``delta``..., then ``done`` or ``error``.

        An error before the stream starts (unknown collection, 429...) raises, after the retries;
        one during it is the last event (``event.error()`` is its typed error).
        """
        call = _core.answer(name, query, True, **options)
        for attempt in Retrying(**self.retry.tenacity()):
            with attempt:
                resp = self._send(call, stream=True)
        try:
            yield from _core.parse_sse(resp.iter_lines())
        except httpx.TimeoutException as exc:
            raise Timeout(f"the answer stream from {self.url} stalled ({exc})") from exc
        finally:
            resp.close()

    def feedback(self, name: str, request_id: str, *, rating: str | None = None,
                 clicked: list[str] | None = None) -> dict[str, Any]:
        """Rate a search or answer this key was served (``rating`` ``up``/``down``), or name the hits clicked.

        ``request_id``: the result's ``request_id``. Returns the request's feedback as recorded
        (``version``, ``rollout``: the version that served it). Sending it again changes nothing.

        Raises:
            NotFound: The request is unknown to the server, expired, or another key's.
            InvalidRequest: Neither a rating nor a click, or a click on a document it did not return.
        """
        return self._run(_core.feedback(name, request_id, rating, clicked))

    # --- jobs --------------------------------------------------------------------------------
    def submit_job(self, name: str, *, path: str | None = None, documents: Iterable[Mapping[str, Any]] | None = None,
                   on_error: str | None = None, prune: bool = False) -> Job:
        """Start an ingest job of a source on the server's disk (``path``) or of ``documents`` (uploaded as NDJSON).

        Raises:
            Forbidden: ``path`` is outside the server's ingest roots.
            Conflict: Another ingest job of the collection is unfinished.
        """
        if (path is None) == (documents is None):
            raise ValueError("give path or documents")
        if path is not None:
            return self._run(_core.submit_path(name, path, on_error, prune))
        assert documents is not None
        return self._run(_core.submit_upload(name, _core.ndjson(documents), on_error, prune))

    def get_job(self, job_id: str) -> Job:
        """A job's state, counters, rate and ETA."""
        return self._run(_core.get_job(job_id))

    def cancel_job(self, job_id: str) -> Job:
        """Ask an ingest job to stop after its batch in flight (``cancelling``, then ``cancelled``)."""
        return self._run(_core.cancel_job(job_id))

    def list_jobs(self, *, collection: str | None = None, state: str | None = None, limit: int = 100) -> list[Job]:
        """The tenant's jobs, newest first (optionally of one collection or state)."""
        return self._run(_core.list_jobs(collection, state, limit))

    def wait_job(self, job_id: str, *, timeout_s: float | None = None, poll_s: float = 1.0,
                 progress: Callable[[Job], None] | None = None) -> Job:
        """Poll a job until it finishes (done, partial, failed, cancelled); ``progress`` sees each poll.

        Raises:
            Timeout: It had not finished after ``timeout_s`` seconds (it goes on on the server).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.get_job(job_id)
            if progress is not None:
                progress(job)
            if job.finished:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise Timeout(f"job {job_id} is still {job.state} after {timeout_s:g} s")
            time.sleep(poll_s)


def _sum(total: WriteReport | None, part: WriteReport) -> WriteReport:
    if total is None:
        return part
    merged = {k: getattr(total, k) + getattr(part, k) for k in WriteReport.model_fields}
    return WriteReport.model_validate(merged)
