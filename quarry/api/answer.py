"""``POST /v1/collections/{name}/answer`` and ``POST /v1/chat/completions``: the answer service over HTTP.

The answer itself (cache, retrieval, prompt, LLM, citations, token quota) is
:class:`quarry.services.answer.AnswerService`'s, opened at startup by this router's lifespan with
the configured LLM (``QUARRY_LLM__URL``) and answer cache. These routes map bodies to an
:class:`~quarry.services.answer.AnswerRequest`, the cache headers to a
:class:`~quarry.services.answer_cache.CacheUse` (:mod:`quarry.api.cache`), the key's token quota
and the shed policy to the service's protocols, and the events to JSON, Server-Sent Events or
OpenAI's chat-completion frames. ``stream: true`` answers with Server-Sent Events
(sse-starlette's response, which listens for the client's disconnect and then cancels the stream,
so the upstream LLM request is closed with it; nothing in the app buffers the body: the metrics
middleware is pure ASGI).

Degradation: with the LLM down, slow (a deadline missed) or refusing, the answer is ``null``,
the sources are still returned and ``degraded`` says ``llm: <why>``; with ``require_answer`` the
error is returned instead (503 with ``Retry-After``, or 502 for a refusal). In a stream, a
failure after the ``sources`` event ends it with an ``error`` event.

Token quota: for a key with one (``quarry keys create --tokens``, :class:`quarry.api.quotas.TokenQuota`),
the prompt's tokens are spent before the LLM is asked (429 ``RateLimited`` with ``Retry-After``
and the LLM not asked when the key's window has no room), the completion's when the answer is
done (at the end of a stream); a semantic-cache hit costs nothing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse, ServerSentEvent

from generation.answer import Event
from generation.cache import open_cache
from generation.factory import open_generator
from indexing.collections import check_name_length
from indexing.docstore import off_loop
from indexing.document_rules import is_blank
from quarry import errors as e
from quarry import metrics
from quarry.api import access, edge, shedding
from quarry.api.cache import directives
from quarry.api.deps import SERVED_HEADERS, version_headers
from quarry.api.edge import Checked, Identifier
from quarry.api.errors import error_responses
from quarry.api.models import RerankIn, _Body
from quarry.errors import InvalidRequest, clip
from quarry.service import Quarry
from quarry.services import collections
from quarry.services.answer import AnswerRequest, AnswerService, RerankRequest
from quarry.services.conversation import Rewrite, standalone_query


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open the LLM client on the server's event loop; close it at shutdown."""
    service: Quarry = app.state.quarry
    app.state.generator = open_generator(service.settings.llm)
    app.state.answer_cache = open_cache(service.settings.cache)
    app.state.answers = AnswerService(app.state.generator, app.state.answer_cache)
    try:
        yield
    finally:
        await app.state.answers.aclose()


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
    min_score: float | None = Field(
        None, allow_inf_nan=False,
        description="Abstain without asking the LLM (`abstained: true`) when the evidence score is below this "
        "(the best dense similarity of the hits; BM25 in bm25 mode). Default: the collection's QUARRY_LLM__MIN_SCORES.",
    )

    def request(self) -> AnswerRequest:
        """The service's request."""
        rerank = None if self.rerank is None else RerankRequest(**self.rerank.model_dump())
        return AnswerRequest(
            query=self.query, top_k=self.top_k, mode=self.mode, filters=self.filters, rerank=rerank,
            max_tokens=self.max_tokens, temperature=self.temperature, seed=self.seed,
            context_tokens=self.context_tokens, require_answer=self.require_answer, min_score=self.min_score,
        )


async def _answers(request: Request) -> AnswerService:
    found: AnswerService | None = getattr(request.app.state, "answers", None)
    return found if found is not None else AnswerService(None, None)


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
        "headers": SERVED_HEADERS,
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
    answers: Annotated[AnswerService, Depends(_answers)],
) -> Response:
    """Retrieve, build the prompt within the context budget, ask the LLM, check the citations.

    Returns ``{answer, citations, dropped_citations, sources, left_out, context, degraded, usage,
    finish_reason, timings_ms, cache, version}`` (or, with ``stream``, the events ``sources``, ``delta``,
    ``citation``, ``done`` / ``error``). ``version`` (also on ``sources``, and in the header
    ``X-Quarry-Collection-Version``) is the collection version that served the retrieval; while a
    gray release routes the collection, ``rollout`` (and ``X-Quarry-Rollout``) says whether it is the
    ``candidate`` or the ``live`` one. Errors of retrieval (unknown collection, bad filter) are
    plain error responses, before any event. ``cache`` is ``hit``, ``miss`` or ``bypass``
    (:mod:`quarry.services.answer_cache`; ``Cache-Control: no-cache`` or ``X-Quarry-Cache: bypass``
    skip it), ``cache_reason`` a miss's reason.
    """
    events = await answers.events(
        q.view, name, body.request(), cache=directives(request.headers), shed=shedding.shed(request),
        quota=access.tokens(request),
    )
    if body.stream:
        first, events = await _peeked(events)
        return EventSourceResponse(_sse(events), ping=15, headers=version_headers(first.data if first else {}))
    out = await answers.collect(events, body.require_answer)
    return Response(orjson.dumps(out), media_type="application/json", headers=version_headers(out))


async def _peeked(events: AsyncIterator[Event]) -> tuple[Event | None, AsyncIterator[Event]]:
    """The first event (``sources``: it comes before the LLM is asked) and all of ``events`` again."""
    first = await anext(events, None)

    async def replay() -> AsyncIterator[Event]:
        if first is not None:
            yield first
        async for event in events:
            yield event

    return first, replay()


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
    require_answer: bool = Field(
        True, description="With the LLM missing, down or late: an error in OpenAI's shape (503 / 504 / 502). "
        'False: a 200 with the sources, `content: null` and `finish_reason: "error"`.',
    )
    min_score: float | None = Field(None, allow_inf_nan=False)
    rewrite: bool = Field(True, description="Rewrite a follow-up into a standalone query before retrieval.")


class StreamOptionsIn(BaseModel):
    """OpenAI's ``stream_options``."""

    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatIn(Checked):
    """``POST /v1/chat/completions`` with ``model: "quarry/<collection>"``: RAG through an OpenAI client.

    The last user message is the question; with earlier user messages it is a follow-up,
    rewritten into a standalone query before retrieval (``quarry.rewrite`` in the reply).
    Parameters Quarry cannot honour are refused (:data:`UNSUPPORTED`); others OpenAI defines
    (``user``, ``metadata``, ``store``...) are accepted and have no effect.
    """

    parsed_later = frozenset({"messages"})  # the query: the search's own checks (InvalidQuery)

    model_config = ConfigDict(extra="allow")

    model: Identifier = Field(description='"quarry/<collection>"')
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=10_000)
    stream: bool = False
    stream_options: StreamOptionsIn | None = None
    max_tokens: int | None = Field(None, ge=1, le=32_768)
    max_completion_tokens: int | None = Field(None, ge=1, le=32_768)
    temperature: float | None = Field(None, ge=0, le=2)
    seed: int | None = None
    stop: str | list[str] | None = Field(None, description="Up to 4 stop sequences, passed to the LLM.")
    response_format: dict[str, Any] | None = Field(None, description="Passed to the LLM as given.")
    quarry: QuarryOptions = QuarryOptions()

    def stops(self) -> tuple[str, ...]:
        """The stop sequences (OpenAI: at most 4, none empty).

        Raises:
            InvalidRequest: More than 4, an empty one, or one over 256 characters.
        """
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOPS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise InvalidRequest(
                f"stop: at most {MAX_STOPS} sequences of 1 to {MAX_STOP_CHARS} characters, got {len(stops)}"
            )
        return tuple(stops)


MAX_STOPS, MAX_STOP_CHARS = 4, 256


@router.post(
    "/v1/chat/completions", tags=["answer"], responses={**error_responses(*_ANSWER_ERRORS, body=True), **_ANSWERED}
)
async def chat_completions(
    body: ChatIn,
    request: Request,
    q: Annotated[Quarry, Depends(_quarry)],
    answers: Annotated[AnswerService, Depends(_answers)],
) -> Response:
    """The answer path behind OpenAI's chat-completions API: change an OpenAI client's ``base_url``.

    The reply is a ``chat.completion`` (or ``chat.completion.chunk`` frames ending ``[DONE]``)
    with an extension field ``quarry``: on the first chunk the ``sources`` and the ``rewrite``
    (the query searched, how it was made) and the ``version`` (and ``rollout``) that served it,
    as on ``/answer`` (also in the headers ``X-Quarry-Collection-Version``, ``X-Quarry-Rollout``);
    on a chunk with no choices each ``citations`` entry
    as soon as it resolves; on the last chunk (and on the non-streamed reply) ``citations``,
    ``dropped_citations``, ``sources``, ``degraded``, ``rewrite`` and ``timings_ms``. ``usage``
    counts every LLM token the request spent (the rewrite's and the answer's); streamed, it comes
    in a last chunk with no choices when ``stream_options.include_usage`` is set. With the LLM
    missing, down or late, the reply is an error in OpenAI's shape (503 / 504 / 502, before any
    chunk when the LLM fails before its first token), unless ``quarry.require_answer`` is false:
    then the sources with ``content: null`` and ``finish_reason: "error"``. A failure after text
    was streamed is an ``{"error": {...}}`` frame, which OpenAI's clients raise as ``APIError``.

    Raises:
        InvalidRequest: ``model`` is not ``quarry/<collection>``, no user message, a conversation
            over ``QUARRY_OPENAI__MAX_MESSAGES`` messages or ``__MAX_CONVERSATION_CHARS`` characters,
            bad ``stop``.
        UnsupportedParameter: ``n`` other than 1, or one of :data:`UNSUPPORTED`.
        LLMNotConfigured, GenerationUnavailable, GenerationTimeout, GenerationError: The LLM
            failed and ``quarry.require_answer`` is true (the default).
    """
    _refuse_unsupported(body)
    collection = body.model.removeprefix("quarry/")
    if collection == body.model or not collection:
        raise InvalidRequest(f'model must be "quarry/<collection>", got {clip(body.model)}')
    edge.name(collection, "collection name of the model")
    access.check_collection(request, collection)
    q = await off_loop(q.for_collection, collection)  # a shared collection: scoped to the key's tenant
    limits = q.settings.openai
    _check_conversation(body.messages, limits.max_messages, limits.max_conversation_chars)
    users = [m.text() for m in body.messages if m.role == "user"]
    if not users or is_blank(users[-1]):
        raise InvalidRequest("no user message to answer")
    opts = body.quarry
    stops = body.stops()
    config = await off_loop(collections.get, q.view, collection)  # 404 before any LLM call
    if opts.require_answer:
        answers.check_available()
    quota, shed = access.tokens(request), shedding.shed(request)
    rewrite = await standalone_query(
        answers.generator, users[:-1], users[-1], settings=limits, language=config.language, quota=quota,
        enabled=limits.rewrite and opts.rewrite, shed=shed is not None,
    )
    if rewrite.method != "none" and q.settings.metrics.enabled:
        metrics.CHAT_REWRITES.labels(rewrite.method, rewrite.outcome).inc()
    answer_in = AnswerIn(
        query=rewrite.query, top_k=opts.top_k, mode=opts.mode, filters=opts.filters, rerank=opts.rerank,
        stream=body.stream, max_tokens=body.max_completion_tokens or body.max_tokens,
        temperature=body.temperature, seed=body.seed, context_tokens=opts.context_tokens,
        require_answer=opts.require_answer, min_score=opts.min_score,
    )
    req = replace(answer_in.request(), stop=stops, response_format=body.response_format)
    events = await answers.events(
        q.view, collection, req, cache=directives(request.headers), shed=shed, quota=quota,
    )
    ident, created = f"chatcmpl-quarry-{uuid.uuid4().hex}", int(time.time())
    if body.stream:
        first, events = await _started(events, opts.require_answer)
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return EventSourceResponse(
            _chat_sse(events, ident, created, body.model, rewrite, include_usage=include_usage,
                      require_answer=opts.require_answer),
            ping=15, headers=version_headers(first.data if first else {}),
        )
    out = await answers.collect(events, opts.require_answer)
    usage = out.pop("usage")
    answered = out.pop("answer")
    finish = out.pop("finish_reason") or ("stop" if answered is not None or out.get("abstained") else "error")
    completion = {
        "id": ident, "object": "chat.completion", "created": created, "model": body.model,
        "choices": [{
            "index": 0, "message": {"role": "assistant", "content": answered}, "finish_reason": finish,
        }],
        "usage": _usage(usage, rewrite),
        "quarry": {**out, "rewrite": rewrite.to_json()},
    }
    return Response(orjson.dumps(completion), media_type="application/json", headers=version_headers(out))


def _check_conversation(messages: list[ChatMessageIn], max_messages: int, max_chars: int) -> None:
    """Refuse a conversation over the bounds (its rewrite and its body would grow without one).

    Raises:
        InvalidRequest: More than ``max_messages`` messages or ``max_chars`` characters in all.
    """
    if len(messages) > max_messages:
        raise InvalidRequest(
            f"messages: {len(messages)} messages, at most {max_messages} (QUARRY_OPENAI__MAX_MESSAGES)"
        )
    chars = sum(len(m.text()) for m in messages)
    if chars > max_chars:
        raise InvalidRequest(
            f"messages: {chars} characters in all, at most {max_chars} (QUARRY_OPENAI__MAX_CONVERSATION_CHARS)"
        )


async def _started(
    events: AsyncIterator[Event], require_answer: bool
) -> tuple[Event | None, AsyncIterator[Event]]:
    """``events``, read up to the LLM's first text (or its end) before the response starts.

    So an LLM that fails before its first token is an HTTP error in OpenAI's shape (with
    ``require_answer``), not a stream that starts and then breaks. Returned with the first event
    (``sources``: the response's version headers are read from it).

    Raises:
        GenerationError: The LLM failed before its first token and ``require_answer`` is set.
    """
    held: list[Event] = []
    async for event in events:
        held.append(event)
        if event.kind == "error" and require_answer:
            await events.aclose()  # type: ignore[attr-defined]
            assert event.error is not None
            raise event.error
        if event.kind in ("delta", "done", "error"):
            break

    async def replay() -> AsyncIterator[Event]:
        for event in held:
            yield event
        async for event in events:
            yield event

    return (held[0] if held else None), replay()


UNSUPPORTED = ("tools", "tool_choice", "functions", "function_call", "logprobs", "top_logprobs", "logit_bias",
               "audio", "modalities", "prediction", "parallel_tool_calls")
"""OpenAI chat parameters refused with a 400 rather than silently ignored."""


def _refuse_unsupported(body: ChatIn) -> None:
    """Refuse what the answer path would otherwise ignore: ``n > 1`` and :data:`UNSUPPORTED` fields.

    Raises:
        UnsupportedParameter: The first such field (``error.param`` names it).
    """
    extra = body.model_extra or {}
    n = extra.get("n")
    if n is not None and n != 1:
        raise e.UnsupportedParameter(f"n={clip(str(n))} is not supported: Quarry answers with one choice", param="n")
    for name in UNSUPPORTED:
        if extra.get(name) not in (None, False, [], {}):
            raise e.UnsupportedParameter(f"{name} is not supported by Quarry's chat completions", param=name)

def _usage(usage: dict[str, Any], rewrite: Rewrite) -> dict[str, int]:
    """OpenAI's ``usage``: the answer's tokens plus the rewrite's (every LLM token the request spent)."""
    spent = rewrite.usage
    prompt = (usage.get("prompt_tokens") or 0) + (spent.prompt_tokens or 0 if spent else 0)
    completion = (usage.get("completion_tokens") or 0) + (spent.completion_tokens or 0 if spent else 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _chat_sse(  # noqa: PLR0913 - the frames' common fields
    events: AsyncIterator[Event], ident: str, created: int, model: str, rewrite: Rewrite, *,
    include_usage: bool, require_answer: bool,
) -> AsyncIterator[ServerSentEvent]:
    """Answer events as ``chat.completion.chunk`` frames (see :func:`chat_completions`)."""

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> ServerSentEvent:
        frame = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                 "choices": choices, **extra}
        if include_usage:
            frame.setdefault("usage", None)
        return ServerSentEvent(data=orjson.dumps(frame).decode())

    sent_degraded: list[str] = []
    async for event in events:
        if event.kind == "sources":
            sent_degraded = list(event.data.get("degraded", []))
            yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                        quarry={**event.data, "rewrite": rewrite.to_json()})
        elif event.kind == "delta":
            yield chunk([{"index": 0, "delta": {"content": event.data["text"]}, "finish_reason": None}])
        elif event.kind == "citation":
            yield chunk([], quarry={"citations": [event.data]})
        elif event.kind == "done":
            done = dict(event.data)
            answered = done.pop("answer")
            finish = done.pop("finish_reason") or ("stop" if answered is not None or done.get("abstained") else "error")
            usage = _usage(done.pop("usage"), rewrite)
            extension = {**done, "rewrite": rewrite.to_json()}
            yield chunk([{"index": 0, "delta": {}, "finish_reason": finish}], quarry=extension)
            if include_usage:
                yield chunk([], usage=usage)
            yield ServerSentEvent(data="[DONE]")
        elif event.kind == "error" and not require_answer and event.error is not None:
            degraded = [*sent_degraded, f"llm: {event.error.message}"]
            extension = {"degraded": degraded, "timings_ms": event.data.get("timings_ms"), "rewrite": rewrite.to_json()}
            yield chunk([{"index": 0, "delta": {}, "finish_reason": "error"}], quarry=extension)
            if include_usage:
                yield chunk([], usage=_usage({}, rewrite))
            yield ServerSentEvent(data="[DONE]")
        elif event.kind == "error":
            yield ServerSentEvent(data=orjson.dumps(event.data).decode())
