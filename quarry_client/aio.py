"""The asynchronous client: :class:`AsyncQuarry` (``httpx.AsyncClient``), the calls of :class:`Quarry`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import httpx
from tenacity import AsyncRetrying

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
from quarry_client.sync import _sum

T = TypeVar("T")


class AsyncQuarry:
    """A Quarry server's API on asyncio; arguments, methods and errors as :class:`~quarry_client.Quarry`'s."""

    def __init__(  # noqa: PLR0913 - the client's options
        self, url: str | None = None, api_key: str | None = None, *, timeout: float | httpx.Timeout = 60.0,
        max_retries: int = 3, max_retry_wait_s: float = 30.0, transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url, api_key = _core.resolve(url, api_key)
        self.retry = RetryPolicy(max_retries, max_retry_wait_s)
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=_core.headers_for(api_key), timeout=timeout,
            transport=transport or httpx.AsyncHTTPTransport(retries=max_retries),
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncQuarry:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def _send(self, call: Call[Any], stream: bool = False) -> httpx.Response:
        request = self._http.build_request(call.method, call.path, **call.kwargs())
        try:
            resp = await self._http.send(request, stream=stream)
        except httpx.TimeoutException as exc:
            raise Timeout(f"{call.method} {call.path}: no answer from {self.url} in time ({exc})") from exc
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"{self.url} cannot be reached: {exc}", retryable=True) from exc
        if resp.status_code >= 400:
            if stream:
                await resp.aread()
                await resp.aclose()
            raise error_from_response(resp)
        return resp

    async def _run(self, call: Call[T]) -> T:
        async for attempt in AsyncRetrying(**self.retry.tenacity(call.retry)):
            with attempt:
                resp = await self._send(call)
        return call.parse(resp.json())

    # --- collections -------------------------------------------------------------------------
    async def list_collections(self) -> list[Collection]:
        """The collections the key may use."""
        return await self._run(_core.list_collections())

    async def create_collection(self, name: str, **options: Any) -> Collection:
        """Create a collection (409 ``CollectionExists`` if the name is taken)."""
        return await self._run(_core.create_collection(name, **options))

    async def ensure_collection(self, name: str, **options: Any) -> Collection:
        """The collection ``name``, created with ``options`` when it does not exist."""
        try:
            return await self.create_collection(name, **options)
        except QuarryError as exc:
            if exc.type != "CollectionExists":
                raise
        return await self.describe(name)

    async def describe(self, name: str) -> Collection:
        """A collection's configuration and counts."""
        return await self._run(_core.describe(name))

    async def drop_collection(self, name: str) -> str:
        """Drop a collection and all its data; returns its name."""
        return await self._run(_core.drop_collection(name))

    async def recall(self, name: str) -> dict[str, Any]:
        """The recall monitor's figures of a collection."""
        return await self._run(_core.recall(name))

    # --- documents ---------------------------------------------------------------------------
    async def upsert(self, name: str, documents: Iterable[Mapping[str, Any]], batch_size: int = 500) -> WriteReport:
        """Insert or replace documents, ``batch_size`` per (atomic) request; the summed report."""
        total: WriteReport | None = None
        batch: list[Mapping[str, Any]] = []
        for doc in documents:
            batch.append(doc)
            if len(batch) >= batch_size:
                total = _sum(total, await self._run(_core.upsert(name, batch)))
                batch = []
        if batch:
            total = _sum(total, await self._run(_core.upsert(name, batch)))
        return total if total is not None else _core.EMPTY_REPORT

    async def delete_documents(self, name: str, ids: list[str] | None = None, *,
                               filters: Mapping[str, Any] | None = None) -> WriteReport:
        """Delete documents by id, or those whose metadata matches ``filters``."""
        return await self._run(_core.delete_documents(name, ids, filters))

    async def list_documents(self, name: str, *, cursor: str | None = None, limit: int = 100) -> DocumentPage:
        """One page of documents in id order."""
        return await self._run(_core.list_documents(name, cursor, limit))

    async def iter_documents(self, name: str, *, page_size: int = 1000) -> AsyncIterator[DocumentSummary]:
        """Every document of a collection, page after page."""
        cursor: str | None = None
        while True:
            page = await self.list_documents(name, cursor=cursor, limit=page_size)
            for doc in page.documents:
                yield doc
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def get_document(self, name: str, document_id: str) -> Document:
        """A stored document with its chunks (``NotFound`` if none)."""
        return await self._run(_core.get_document(name, document_id))

    # --- search and answers ------------------------------------------------------------------
    async def search(self, name: str, query: str, *, top_k: int = 10, mode: str = "hybrid",
                     filters: Mapping[str, Any] | None = None, **options: Any) -> SearchResult:
        """Search a collection."""
        return await self._run(_core.search(name, query, top_k=top_k, mode=mode, filters=filters, **options))

    async def answer(self, name: str, query: str, **options: Any) -> Answer:
        """An LLM's answer with citations."""
        return await self._run(_core.answer(name, query, False, **options))

    async def answer_stream(self, name: str, query: str, **options: Any) -> AsyncIterator[AnswerEvent]:
        """The answer's events as they come (see :meth:`Quarry.answer_stream <quarry_client.Quarry.answer_stream>`)."""
        call = _core.answer(name, query, True, **options)
        async for attempt in AsyncRetrying(**self.retry.tenacity()):
            with attempt:
                resp = await self._send(call, stream=True)
        try:
            buffered: list[str] = []
            async for line in resp.aiter_lines():
                buffered.append(line)
                if not line:  # an event is complete: hand it on at once
                    for event in _core.parse_sse(buffered):
                        yield event
                    buffered = []
            for event in _core.parse_sse(buffered):
                yield event
        except httpx.TimeoutException as exc:
            raise Timeout(f"the answer stream from {self.url} stalled ({exc})") from exc
        finally:
            await resp.aclose()

    async def feedback(self, name: str, request_id: str, *, rating: str | None = None,
                 clicked: list[str] | None = None) -> dict[str, Any]:
        """Rate a search or answer this key was served (``rating`` ``up``/``down``), or name the hits clicked.

        ``request_id``: the result's ``request_id``. Returns the request's feedback as recorded
        (``version``, ``rollout``: the version that served it). Sending it again changes nothing.

        Raises:
            NotFound: The request is unknown to the server, expired, or another key's.
            InvalidRequest: Neither a rating nor a click, or a click on a document it did not return.
        """
        return await self._run(_core.feedback(name, request_id, rating, clicked))

    # --- jobs --------------------------------------------------------------------------------
    async def submit_job(self, name: str, *, path: str | None = None,
                         documents: Iterable[Mapping[str, Any]] | None = None, on_error: str | None = None,
                         prune: bool = False) -> Job:
        """Start an ingest job of a server-side ``path`` or of uploaded ``documents``."""
        if (path is None) == (documents is None):
            raise ValueError("give path or documents")
        if path is not None:
            return await self._run(_core.submit_path(name, path, on_error, prune))
        assert documents is not None
        body = b"".join(_core.ndjson(documents))  # the async transport takes bytes or an async iterator
        return await self._run(_core.submit_upload(name, body, on_error, prune))

    async def get_job(self, job_id: str) -> Job:
        """A job's state, counters, rate and ETA."""
        return await self._run(_core.get_job(job_id))

    async def cancel_job(self, job_id: str) -> Job:
        """Ask an ingest job to stop after its batch in flight."""
        return await self._run(_core.cancel_job(job_id))

    async def list_jobs(self, *, collection: str | None = None, state: str | None = None,
                        limit: int = 100) -> list[Job]:
        """The tenant's jobs, newest first."""
        return await self._run(_core.list_jobs(collection, state, limit))

    async def wait_job(self, job_id: str, *, timeout_s: float | None = None, poll_s: float = 1.0,
                       progress: Callable[[Job], None] | None = None) -> Job:
        """Poll a job until it finishes; ``Timeout`` after ``timeout_s`` seconds."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = await self.get_job(job_id)
            if progress is not None:
                progress(job)
            if job.finished:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise Timeout(f"job {job_id} is still {job.state} after {timeout_s:g} s")
            await asyncio.sleep(poll_s)
