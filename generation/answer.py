"""One answer as a sequence of events: the sources, text deltas, citations, then done or error.

Both the streaming and the non-streaming answer run :func:`answer_events`; the stream sends
each event as it comes (Server-Sent Events), the plain answer waits for ``done`` (or ``error``).
So the two give the same text and the same citations for the same generation.

Events, in order: ``sources`` (before the LLM is asked), ``delta`` (text) and ``citation`` (as
soon as a marker is complete and resolves to a source that was sent), then ``done`` (the answer,
all citations, dropped markers, usage, timings) or ``error`` (the error envelope; the LLM failed
or missed a deadline).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from generation.base import GenerationParams, Generator, Usage
from generation.citations import SourceRef
from generation.prompt import Prompt
from generation.structured import StructuredScanner
from indexing.text import Language
from quarry import tracing
from quarry.errors import GenerationError, QuarryError


@dataclass(frozen=True)
class Event:
    """One answer event: its name, its JSON payload, and for ``error`` the exception."""

    kind: str
    data: dict[str, Any]
    error: QuarryError | None = None


def error_envelope(exc: QuarryError) -> dict[str, Any]:
    """The REST error body for ``exc``: ``{"error": {"type", "message", "retryable"}}``."""
    return {"error": {"type": type(exc).__name__, "message": exc.message, "retryable": exc.retryable}}


def sources_payload(prompt: Prompt) -> dict[str, Any]:
    """What the ``sources`` event (and the answer's ``sources`` and ``left_out``) lists."""
    return {
        "sources": [
            {
                "number": s.number, "document_id": s.candidate.document_id, "chunk_id": s.candidate.chunk_id,
                "title": s.candidate.title, "text": s.text, "score": s.candidate.score, "status": s.status,
                "tokens": s.tokens,
            }
            for s in prompt.sent
        ],
        "left_out": [
            {"document_id": c.document_id, "chunk_id": c.chunk_id, "score": c.score} for c in prompt.left_out
        ],
        "context": {"budget": prompt.budget, "tokens": prompt.context_tokens, "tokenizer": prompt.tokenizer},
    }


async def answer_events(  # noqa: C901 - one linear pipeline, easiest read in one piece
    generator: Generator | None,
    prompt: Prompt,
    params: GenerationParams,
    *,
    language: Language,
    threshold: float,
    started: float,
    timings_ms: dict[str, float],
    degraded: list[str],
    on_llm: Callable[[float | None, float, GenerationError | None], None] | None = None,
) -> AsyncIterator[Event]:
    """Ask the LLM and turn its stream into answer events.

    Args:
        generator: The LLM, or ``None`` (no LLM configured: sources, then ``done`` with no answer).
        prompt: The built prompt and what it holds.
        params: Length, temperature, seed; with a ``schema``, the reply is JSON
            (:mod:`generation.structured`) and is sent as text with ``[n]`` markers.
        language: The collection's analysis language (for citations' ``supported``).
        threshold: Lexical support threshold.
        started: ``time.perf_counter()`` when the request arrived (for ``ttft`` and ``total``).
        timings_ms: Timings so far (``retrieve``, ``prompt``), completed here.
        degraded: What retrieval degraded; ``llm: ...`` is added when the LLM is skipped.
        on_llm: Called once the LLM was asked, with the seconds to its first text token
            (``None`` if none came), to its end, and its error (``None`` on success); metrics.

    Yields:
        ``sources``, then ``delta``/``citation`` events, then one ``done`` or ``error``.
    """
    yield Event("sources", {**sources_payload(prompt), "degraded": list(degraded)})
    refs = [
        SourceRef(s.number, s.candidate.document_id, s.candidate.chunk_id, s.text, s.candidate.title)
        for s in prompt.sent
    ]
    scanner = StructuredScanner(refs, language, threshold, json=params.schema is not None)
    if generator is None or not refs:
        why = "no LLM is configured (QUARRY_LLM__URL)" if generator is None else "not asked: no source was retrieved"
        timings_ms["total"] = (time.perf_counter() - started) * 1000
        yield Event("done", _done(None, scanner, None, None, [*degraded, f"llm: {why}"], timings_ms))
        return
    asked = time.perf_counter()
    usage: Usage | None = None
    finish: str | None = None
    first: float | None = None
    span = tracing.llm_span(generator.model_id, params)
    try:
        async with aclosing(generator.stream(prompt.messages, params)) as pieces:
            async for piece in pieces:
                usage = piece.usage or usage
                finish = piece.finish_reason or finish
                if not piece.text:
                    continue
                text, citations = scanner.feed(piece.text)
                if text:
                    if first is None:  # the first text the client reads (a JSON reply: its first words)
                        first = time.perf_counter()
                        timings_ms["ttft"] = (first - started) * 1000
                    yield Event("delta", {"text": text})
                for citation in citations:
                    yield Event("citation", citation.to_json())
            text, citations = scanner.finish()
            if text:
                if first is None:
                    first = time.perf_counter()
                    timings_ms["ttft"] = (first - started) * 1000
                yield Event("delta", {"text": text})
            for citation in citations:
                yield Event("citation", citation.to_json())
    except (GeneratorExit, asyncio.CancelledError):  # the client left: the span ends, unfinished
        tracing.end_llm_span(span, ttft_s=None, usage=usage, finish="cancelled", error=None)
        raise
    except GenerationError as exc:
        now = time.perf_counter()
        timings_ms["generate"] = (now - asked) * 1000
        timings_ms["total"] = (now - started) * 1000
        _llm_ended(on_llm, span, asked, first, now, None, None, exc)
        yield Event("error", {**error_envelope(exc), "timings_ms": dict(timings_ms)}, exc)
        return
    now = time.perf_counter()
    timings_ms["generate"] = (now - asked) * 1000
    if usage is None or usage.completion_tokens is None:  # llama-cpp-python's stream reports none
        try:
            counted = (await generator.count_tokens([scanner.raw]))[0] if scanner.raw else 0
        except GenerationError:
            counted = None
        usage = Usage(usage.prompt_tokens if usage else None, counted)
    if usage.prompt_tokens is None:  # the server did not say: the prompt's count (sources exact, the rest estimated)
        usage = Usage(prompt_tokens(prompt, generator), usage.completion_tokens)
    _llm_ended(on_llm, span, asked, first, now, usage, finish, None)
    timings_ms["total"] = (time.perf_counter() - started) * 1000
    yield Event("done", _done(scanner.text, scanner, usage, finish, list(degraded), timings_ms))


def prompt_tokens(prompt: Prompt, generator: Generator) -> int:
    """Tokens of the prompt sent to the LLM: the sources block's exact count, the rest estimated locally."""
    rest = sum(generator.estimate_tokens(m["content"].replace(prompt.context, "")) for m in prompt.messages)
    return prompt.context_tokens + rest


def _llm_ended(  # noqa: PLR0913 - what one LLM call reports
    on_llm: Callable[[float | None, float, GenerationError | None], None] | None,
    span: Any,
    asked: float,
    first: float | None,
    ended: float,
    usage: Usage | None,
    finish: str | None,
    error: GenerationError | None,
) -> None:
    ttft_s = None if first is None else first - asked
    tracing.end_llm_span(span, ttft_s=ttft_s, usage=usage, finish=finish, error=error)
    if on_llm is not None:
        on_llm(ttft_s, ended - asked, error)


def _done(
    answer: str | None,
    scanner: StructuredScanner,
    usage: Usage | None,
    finish: str | None,
    degraded: list[str],
    timings_ms: dict[str, float],
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "answer": answer,
        "citations": [c.to_json() for c in scanner.citations],
        "dropped_citations": scanner.dropped,
        "finish_reason": finish,
        "usage": {
            "prompt_tokens": usage.prompt_tokens if usage else None,
            "completion_tokens": usage.completion_tokens if usage else None,
        },
        "degraded": degraded,
        "timings_ms": dict(timings_ms),
    }
    if answer is not None:
        out["format"] = scanner.format or "text"
    if scanner.abstained:  # the LLM said the sources do not answer
        out["abstained"] = True
        out["abstention"] = {"reason": "llm_not_answerable"}
    return out
