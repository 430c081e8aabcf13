"""``POST /v1/collections/{name}/answer``: an LLM's answer over the hybrid search, with citations.

Retrieval is the search endpoint's (hybrid by default, rerank when asked); the prompt holds the
best chunks within the context budget (:mod:`generation.prompt`); the LLM is the configured
:class:`~generation.base.Generator` (``QUARRY_LLM__URL``), opened at startup by this router's
lifespan. ``stream: true`` answers with Server-Sent Events (sse-starlette's response, which
listens for the client's disconnect and then cancels the stream, so the upstream LLM request is
closed with it; nothing in the app buffers the body: the metrics middleware is pure ASGI).

Degradation: with the LLM down, slow (a deadline missed) or refusing, the answer is ``null``,
the sources are still returned and ``degraded`` says ``llm: <why>``; with ``require_answer`` the
error is returned instead (503 with ``Retry-After``, or 502 for a refusal). In a stream, a
failure after the ``sources`` event ends it with an ``error`` event.

Token quota: for a key with one (``quarry keys create --tokens``, :class:`quarry.api.access.TokenQuota`),
the prompt's tokens are spent before the LLM is asked (429 ``RateLimited`` with ``Retry-After``
and the LLM not asked when the key's window has no room), the completion's when the answer is
done (at the end of a stream); a semantic-cache hit costs nothing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse, ServerSentEvent

from generation.answer import Event, answer_events
from generation.base import GenerationParams, Generator
from generation.cache import AnswerCache, open_cache
from generation.factory import open_generator
from generation.prompt import Candidate, Prompt, approx_tokens, build_prompt
from indexing.collections import CollectionConfig, check_name_length
from indexing.docstore import off_loop
from indexing.sources import is_blank
from quarry import errors as e
from quarry import metrics
from quarry.api import access, edge
from quarry.api import cache as answer_cache
from quarry.api.edge import Checked, Identifier
from quarry.api.errors import error_responses
from quarry.api.models import RerankIn, SearchIn, _Body
from quarry.errors import GenerationError, InvalidRequest, LLMNotConfigured, clip
from quarry.service import Quarry
from quarry.settings import LLMSettings


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open the LLM client on the server's event loop; close it at shutdown."""
    service: Quarry = app.state.quarry
    app.state.generator = open_generator(service.settings.llm)
    app.state.answer_cache = open_cache(service.settings.cache)
    try:
        yield
    finally:
        if app.state.generator is not None:
            await app.state.generator.aclose()


router = APIRouter(lifespan=_lifespan)


class AnswerIn(_Body):
    """``POST /v1/collections/{name}/answer``."""

    parsed_later = frozenset({"query", "filters"})  # the search's own checks (InvalidQuery, InvalidFilter)

    query: str = Field(description="The question (same limits as a search query).")
    top_k: int = Field(5, ge=1, le=50, description="Chunks retrieved for the prompt (best first).")
    mode: Literal["bm25", "dense", "hybrid"] = "hybrid"
    filters: dict[str, Any] | None = None
    rerank: RerankIn | None = None
    stream: bool = Field(False, description="Answer with Server-Sent Events.")
    max_tokens: int | None = Field(None, ge=1, le=32_768, description="Default: QUARRY_LLM__MAX_TOKENS.")
    temperature: float | None = Field(None, ge=0, le=2, description="Default: QUARRY_LLM__TEMPERATURE.")
    seed: int | None = Field(None, description="Sampling seed, where the LLM server honours one.")
    context_tokens: int | None = Field(
        None, ge=16, le=1_000_000, description="Budget of the sources in tokens. Default: QUARRY_LLM__CONTEXT_TOKENS."
    )
    require_answer: bool = Field(False, description="Fail (503/502) instead of answering null when the LLM fails.")


async def _generator(request: Request) -> Generator | None:
    gen: Generator | None = getattr(request.app.state, "generator", None)
    return gen


def _cache(request: Request) -> AnswerCache | None:
    cache: AnswerCache | None = getattr(request.app.state, "answer_cache", None)
    return cache


async def _quarry(request: Request) -> Quarry:
    check_name_length(request.path_params.get("name", ""))  # 400 before any store is asked about it
    return await off_loop(access.service, request)  # the key's tenant's view (state reads off the loop)


# What retrieval can raise (as search) and what the LLM can (with ``require_answer``).
_ANSWER_ERRORS = (
    e.InvalidQuery, e.InvalidFilter, e.InvalidRequest, e.CollectionNotFound, e.ModelMismatch,
    e.StoreError, e.StoreUnavailable, e.EmbeddingUnavailable, e.EmbeddingError, e.RerankError,
    e.GenerationError, e.GenerationUnavailable, e.LLMNotConfigured,
)


# 200: JSON, or Server-Sent Events with "stream": true (both documented, so clients and checkers know)
_ANSWERED: dict[int | str, Any] = {
    200: {
        "description": 'The answer as JSON; with `"stream": true`, Server-Sent Events (`sources`, `delta`, '
        "`citation`, then `done` or `error`).",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {"schema": {}},  # each event's data: a JSON object (see the description)
        },
    }
}


@router.post(
    "/v1/collections/{name}/answer", tags=["answer"],
    responses={**error_responses(*_ANSWER_ERRORS, body=True), **_ANSWERED},
)
async def answer(
    name: str,
    body: AnswerIn,
    request: Request,
    q: Annotated[Quarry, Depends(_quarry)],
    generator: Annotated[Generator | None, Depends(_generator)],
) -> Response:
    """Retrieve, build the prompt within the context budget, ask the LLM, check the citations.

    Returns ``{answer, citations, dropped_citations, sources, left_out, context, degraded, usage,
    finish_reason, timings_ms, cache}`` (or, with ``stream``, the events ``sources``, ``delta``,
    ``citation``, ``done`` / ``error``). Errors of retrieval (unknown collection, bad filter) are
    plain error responses, before any event. ``cache`` is ``hit``, ``miss`` or ``bypass``
    (:mod:`quarry.api.cache`; ``Cache-Control: no-cache`` or ``X-Quarry-Cache: bypass`` skip it).
    """
    events = await _events(
        name, body, q, generator, _cache(request), request.headers, access.shed(request), access.tokens(request)
    )
    if body.stream:
        return EventSourceResponse(_sse(events), ping=15)
    return await _collect(events, body.require_answer)


async def _events(  # noqa: PLR0913 - the request and its dependencies
    name: str, body: AnswerIn, q: Quarry, generator: Generator | None, cache: AnswerCache | None,
    headers: Mapping[str, str], shed: access.Shed | None = None, quota: access.KeyTokens | None = None,
) -> AsyncIterator[Event]:
    """The events to come: a cache hit's, or retrieve and build the prompt, then the LLM's.

    Errors raised here (unknown collection, bad filter) are plain error responses. A request
    the saturated server sheds (``shed``) gets a cache hit or the 503 (an LLM call is not cheap).
    A key's token ``quota`` is spent by the prompt here and by the completion at ``done``.

    Raises:
        RateLimited: The key's token quota has no room for the prompt (the LLM is not asked).
    """
    started = time.perf_counter()
    cfg: LLMSettings = q.settings.llm
    if body.require_answer:
        _check_available(generator)
    collection = await off_loop(q.get_collection, name)
    budget = body.context_tokens or cfg.context_tokens
    params = GenerationParams(
        max_tokens=body.max_tokens or cfg.max_tokens,
        temperature=cfg.temperature if body.temperature is None else body.temperature,
        seed=body.seed,
    )
    plan = await _cache_plan(q, collection, body, generator, cache, params, budget, headers)
    plan.count()
    if plan.result == "hit":
        return answer_cache.replay(plan, started)
    if shed is not None:
        raise await shed.refused()
    candidates, degraded, timings = await _retrieve(q, name, body)
    if plan.lookup_ms:
        timings["cache"] = plan.lookup_ms
    t = time.perf_counter()
    prompt = await _prompt(generator, body.query, candidates, budget)
    timings["prompt"] = (time.perf_counter() - t) * 1000
    if quota is not None and generator is not None and prompt.sent:  # the LLM will be asked
        quota.reserve(prompt_tokens(prompt, generator))
    events = answer_events(
        generator, prompt, params, language=collection.language, threshold=cfg.support_threshold,
        started=started, timings_ms=timings, degraded=degraded, on_llm=_llm_metrics(q, name, body),
    )
    if quota is not None and generator is not None:
        events = _charged(events, quota, generator.estimate_tokens)
    return answer_cache.recording(events, plan, answer_cache.directives(headers)[1])


def prompt_tokens(prompt: Prompt, generator: Generator) -> int:
    """Tokens of the prompt sent to the LLM: the sources block's exact count, the rest estimated locally."""
    rest = sum(generator.estimate_tokens(m["content"].replace(prompt.context, "")) for m in prompt.messages)
    return prompt.context_tokens + rest


async def _charged(
    events: AsyncIterator[Event], quota: access.KeyTokens, estimate: Callable[[str], int]
) -> AsyncIterator[Event]:
    """``events``, the completion's tokens spent from ``quota`` when ``done`` comes (before it is sent).

    A stream that ends without ``done`` (the client left, the LLM failed mid-answer) is charged the
    tokens of the text streamed so far (``estimate``, the generator's local count): leaving just
    before the end must not make a long completion free.
    """
    streamed, charged = 0, False
    try:
        async for event in events:
            if event.kind == "delta":
                streamed += estimate(str(event.data.get("text", "")))
            elif event.kind == "done":
                used = (event.data.get("usage") or {}).get("completion_tokens")
                quota.charge(int(used) if used is not None else streamed)
                charged = True
            yield event
    finally:
        if not charged and streamed:
            quota.charge(streamed)


async def _cache_plan(  # noqa: PLR0913 - the request's parts
    q: Quarry, collection: CollectionConfig, body: AnswerIn, generator: Generator | None, cache: AnswerCache | None,
    params: GenerationParams, budget: int, headers: Mapping[str, str],
) -> answer_cache.Plan:
    """Bypass (cache off, no LLM, asked by a header, a query search will refuse), or look it up."""
    read, store = answer_cache.directives(headers)
    # a query the search refuses (blank, too long, a NUL or a lone surrogate) is refused there, uncached
    query_ok = not is_blank(body.query) and len(body.query) <= q.settings.search.max_query_chars
    query_ok = query_ok and edge.is_text(body.query)
    if cache is None or generator is None or not query_ok or not (read or store):
        return answer_cache.Plan("bypass")
    key = await off_loop(answer_cache.cache_key, q, collection, body, generator, params, budget)
    return await answer_cache.lookup(q, cache, key, body.query, collection.language, read=read)


async def prepare_answer(name: str, body: AnswerIn, q: Quarry, generator: Generator | None) -> AsyncIterator[Event]:
    """The ``/answer`` path outside HTTP (``quarry eval --answers``): retrieve, build the prompt; the events.

    Raises:
        QuarryError: What retrieval raises (unknown collection, bad filter, ...), before any event.
    """
    return await _events(name, body, q, generator, None, {})  # no cache: eval measures the LLM


def _llm_metrics(
    q: Quarry, name: str, body: AnswerIn
) -> Callable[[float | None, float, GenerationError | None], None] | None:
    """What an answer's LLM call reports to :mod:`quarry.metrics` (``None`` with metrics off)."""
    if not q.settings.metrics.enabled:
        return None

    def observe(ttft_s: float | None, total_s: float, error: GenerationError | None) -> None:
        metrics.observe_llm(q.tenant_id, name, body.mode, ttft_s, total_s)
        if error is not None and not body.require_answer:  # answered without the LLM's text
            metrics.DEGRADED.labels("llm_failed").inc()

    return observe


def _check_available(generator: Generator | None) -> None:
    """Fail at once when an answer is required and the LLM is missing or being skipped."""
    if generator is None:
        raise LLMNotConfigured("an answer was required but no LLM is configured (QUARRY_LLM__URL)")
    outage = getattr(generator, "outage", None)
    if outage is not None:
        raise type(outage)(outage.message, retry_after_s=outage.retry_after_s)


async def _retrieve(q: Quarry, name: str, body: AnswerIn) -> tuple[list[Candidate], list[str], dict[str, float]]:
    from quarry.api.app import _rerank_options

    search = SearchIn(query=body.query, top_k=body.top_k, mode=body.mode, filters=body.filters, rerank=body.rerank)
    rerank = _rerank_options(q, search)
    t = time.perf_counter()
    if rerank is None:
        result = await q.search_async(name, body.query, top_k=body.top_k, mode=body.mode, filters=body.filters)
    else:
        result = await run_in_threadpool(
            partial(
                q.search, name, body.query, top_k=body.top_k, mode=body.mode, filters=body.filters,
                rerank=rerank, dense_timeout_s=q.settings.search.dense_timeout_s,
            )
        )
    timings = {"retrieve": (time.perf_counter() - t) * 1000}
    candidates = [Candidate(h.document_id, h.chunk_id, h.text, h.score) for h in result.hits]
    return candidates, list(result.degraded), timings


async def _prompt(generator: Generator | None, query: str, candidates: list[Candidate], budget: int) -> Prompt:
    """The prompt, counted with the LLM's tokenizer (or the approximation when there is no LLM).

    Chunks are chosen with the generator's local estimate; the block is counted once by the
    server's tokenizer (one round trip; more only when the estimate fell short).
    """
    if generator is None:

        async def approx(texts: Sequence[str]) -> list[int]:
            return [approx_tokens(t) for t in texts]

        return await build_prompt(query, candidates, budget, approx, "approx")
    await generator.count_tokens([])  # on first use: find the tokenizer, calibrate the estimate
    prompt = await build_prompt(
        query, candidates, budget, generator.count_tokens, "approx", estimate=generator.estimate_tokens
    )
    prompt.tokenizer = generator.tokenizer  # known once the first count probed the server
    return prompt


async def _collect(events: AsyncIterator[Event], require_answer: bool) -> Response:
    """The non-streaming answer: the ``sources`` event merged with ``done`` (or the degraded answer)."""
    out: dict[str, Any] = {}
    async for event in events:
        if event.kind == "sources":
            out.update(event.data)
        elif event.kind == "done":
            out.update(event.data)
        elif event.kind == "error":
            assert isinstance(event.error, GenerationError)
            if require_answer:
                raise event.error
            out.update(
                answer=None, citations=[], dropped_citations=0, finish_reason=None,
                usage={"prompt_tokens": None, "completion_tokens": None},
                degraded=[*out.get("degraded", []), f"llm: {event.error.message}"],
                timings_ms=event.data["timings_ms"],
            )
    return Response(orjson.dumps(out), media_type="application/json")


async def _sse(events: AsyncIterator[Event]) -> AsyncIterator[ServerSentEvent]:
    async for event in events:
        yield ServerSentEvent(data=orjson.dumps(event.data).decode(), event=event.kind)


# --- OpenAI-compatible front door -----------------------------------------------------------
class ChatMessageIn(BaseModel):
    """A chat message; ``content`` a string or OpenAI's list of parts (text parts are joined)."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message's text."""
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")
        return self.content or ""


class QuarryOptions(_Body):
    """Quarry's own knobs of a chat completion (send them in the body's ``quarry`` field)."""

    parsed_later = frozenset({"filters"})  # parse_filter names the field at fault

    top_k: int = Field(5, ge=1, le=50)
    mode: Literal["bm25", "dense", "hybrid"] = "hybrid"
    filters: dict[str, Any] | None = None
    rerank: RerankIn | None = None
    context_tokens: int | None = Field(None, ge=16, le=1_000_000)
    require_answer: bool = False


class ChatIn(Checked):
    """``POST /v1/chat/completions`` with ``model: "quarry/<collection>"``: RAG through an OpenAI client.

    The last user message is the query. Other OpenAI fields are accepted and ignored.
    """

    parsed_later = frozenset({"messages"})  # the query: the search's own checks (InvalidQuery)

    model_config = ConfigDict(extra="allow")

    model: Identifier = Field(description='"quarry/<collection>"')
    messages: list[ChatMessageIn] = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1, le=32_768)
    max_completion_tokens: int | None = Field(None, ge=1, le=32_768)
    temperature: float | None = Field(None, ge=0, le=2)
    seed: int | None = None
    quarry: QuarryOptions = QuarryOptions()


@router.post(
    "/v1/chat/completions", tags=["answer"], responses={**error_responses(*_ANSWER_ERRORS, body=True), **_ANSWERED}
)
async def chat_completions(
    body: ChatIn,
    request: Request,
    q: Annotated[Quarry, Depends(_quarry)],
    generator: Annotated[Generator | None, Depends(_generator)],
) -> Response:
    """The answer path behind OpenAI's chat-completions API: change an OpenAI client's ``base_url``.

    The reply is a ``chat.completion`` (or ``chat.completion.chunk`` frames ending ``[DONE]``)
    with an extension field ``quarry``: on the first chunk the ``sources``; on a chunk with no
    choices each ``citations`` entry as soon as it resolves; on the last chunk (and on the
    non-streamed reply) ``citations``, ``dropped_citations``, ``sources``, ``degraded`` and
    ``timings_ms``. A failure after the stream started is an ``{"error": {...}}`` frame, which
    OpenAI's clients raise as ``APIError``.

    Raises:
        InvalidRequest: ``model`` is not ``quarry/<collection>``, or no user message.
    """
    collection = body.model.removeprefix("quarry/")
    if collection == body.model or not collection:
        raise InvalidRequest(f'model must be "quarry/<collection>", got {clip(body.model)}')
    edge.name(collection, "collection name of the model")
    access.check_collection(request, collection)
    q = await off_loop(q.for_collection, collection)  # a shared collection: scoped to the key's tenant
    users = [m.text() for m in body.messages if m.role == "user"]
    if not users or is_blank(users[-1]):
        raise InvalidRequest("no user message to answer")
    opts = body.quarry
    answer_in = AnswerIn(
        query=users[-1], top_k=opts.top_k, mode=opts.mode, filters=opts.filters, rerank=opts.rerank,
        stream=body.stream, max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature, seed=body.seed, context_tokens=opts.context_tokens,
        require_answer=opts.require_answer,
    )
    events = await _events(
        collection, answer_in, q, generator, _cache(request), request.headers, access.shed(request),
        access.tokens(request),
    )
    ident, created = f"chatcmpl-quarry-{uuid.uuid4().hex}", int(time.time())
    if body.stream:
        return EventSourceResponse(_chat_sse(events, ident, created, body.model), ping=15)
    out = orjson.loads((await _collect(events, answer_in.require_answer)).body)
    usage = out.pop("usage")
    completion = {
        "id": ident, "object": "chat.completion", "created": created, "model": body.model,
        "choices": [{
            "index": 0, "message": {"role": "assistant", "content": out.pop("answer")},
            "finish_reason": out.pop("finish_reason") or "stop",
        }],
        "usage": _usage(usage),
        "quarry": out,
    }
    return Response(orjson.dumps(completion), media_type="application/json")


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _chat_sse(
    events: AsyncIterator[Event], ident: str, created: int, model: str
) -> AsyncIterator[ServerSentEvent]:
    """Answer events as ``chat.completion.chunk`` frames (see :func:`chat_completions`)."""

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> ServerSentEvent:
        frame = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                 "choices": choices, **extra}
        return ServerSentEvent(data=orjson.dumps(frame).decode())

    async for event in events:
        if event.kind == "sources":
            yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                        quarry=event.data)
        elif event.kind == "delta":
            yield chunk([{"index": 0, "delta": {"content": event.data["text"]}, "finish_reason": None}])
        elif event.kind == "citation":
            yield chunk([], quarry={"citations": [event.data]})
        elif event.kind == "done":
            done = dict(event.data)
            done.pop("answer")
            finish = done.pop("finish_reason") or "stop"
            usage = _usage(done.pop("usage"))
            yield chunk([{"index": 0, "delta": {}, "finish_reason": finish}], usage=usage, quarry=done)
            yield ServerSentEvent(data="[DONE]")
        elif event.kind == "error":
            yield ServerSentEvent(data=orjson.dumps(event.data).decode())
