"""The answer service: retrieve, build the prompt within the context budget, ask the LLM, check the citations.

One implementation, async, behind every front door: REST ``/answer`` (JSON and Server-Sent
Events), ``/v1/chat/completions``, ``quarry eval --answers``. It knows nothing of HTTP: the
adapters turn their bodies into an :class:`AnswerRequest`, their headers into a
:class:`~quarry.services.answer_cache.CacheUse`, and pass the key's token quota (a
:class:`TokenQuota`) and, for a request the saturated server sheds, a :class:`Refusal`.

Flow of :meth:`AnswerService.events`: the cache plan (the query is embedded once; on a miss the
search reuses that vector), a cache hit replayed (kept for feedback on its request id:
:func:`quarry.services.feedback.note_replayed`), else retrieval (hybrid by default; rerank in a
worker thread), the prompt (:mod:`generation.prompt`), the LLM's events
(:func:`generation.answer.answer_events`: ``sources``, ``delta``, ``citation``, then ``done`` or
``error``), recorded for the cache.

Degradation: with the LLM down, slow (a deadline missed) or refusing, the answer is ``None``, the
sources are still returned and ``degraded`` says ``llm: <why>``; with ``require_answer`` the
error is raised instead. Token quota: the prompt's tokens are reserved before the LLM is asked
(``RateLimited`` and no LLM call when the window has no room), the completion's charged when the
answer is done (at the end of a stream; a stream left early is charged what it streamed); a
cache hit costs nothing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from generation.answer import Event, answer_events, prompt_tokens
from generation.base import GenerationParams, Generator
from generation.cache import AnswerCache
from generation.prompt import SYSTEM, Candidate, Prompt, approx_tokens, build_prompt
from generation.structured import EXTRACTIVE_SYSTEM, answer_schema
from generation.structured import SYSTEM as STRUCTURED_SYSTEM
from indexing.collections import CollectionConfig
from indexing.docstore import off_loop
from indexing.document_rules import check_unicode, is_blank
from quarry import metrics
from quarry.errors import GenerationError, InvalidQuery, LLMNotConfigured, QuarryError
from quarry.services import abstention, answer_cache, collections, feedback, query
from quarry.services.answer_cache import CacheUse
from quarry.services.view import View
from retrieval.rerank_options import rerank_options

Mode = Literal["bm25", "dense", "hybrid"]


class TokenQuota(Protocol):
    """A key's token quota, as the answer spends it (the API passes the request key's)."""

    def reserve(self, tokens: int) -> None:
        """Spend ``tokens`` prompt tokens before the LLM is asked.

        Raises:
            RateLimited: The window has no room (the LLM is then not asked).
        """
        ...

    def charge(self, tokens: int) -> int:
        """Spend ``tokens`` completion tokens (as many as the window holds); the number spent."""
        ...


class Refusal(Protocol):
    """A request the saturated server sheds: served from the cache, or refused (an LLM call is not cheap)."""

    async def refused(self) -> QuarryError:
        """The error to raise (after whatever hold the policy asks)."""
        ...


@dataclass(frozen=True)
class RerankRequest:
    """Rerank the fused top ``top_n`` within ``budget_ms`` (``None``: the server's defaults)."""

    top_n: int | None = None
    budget_ms: float | None = None
    model: str | None = None


@dataclass(frozen=True)
class AnswerRequest:
    """One question to answer, as every front door asks it.

    Attributes:
        query: The question (the search's limits apply).
        top_k: Chunks retrieved for the prompt (best first).
        mode: Retrieval mode.
        filters: Metadata filter (the search's syntax).
        rerank: Rerank the fused candidates first.
        max_tokens: Completion cap; ``None``: ``QUARRY_LLM__MAX_TOKENS``.
        temperature: ``None``: ``QUARRY_LLM__TEMPERATURE``.
        seed: Sampling seed, where the LLM server honours one.
        context_tokens: Budget of the sources in tokens; ``None``: ``QUARRY_LLM__CONTEXT_TOKENS``.
        require_answer: Raise the LLM's error instead of answering ``None``.
        min_score: Abstain (answer :data:`ABSTAINED`, ``abstained: true``, the LLM not asked) when
            the evidence score (:func:`quarry.services.abstention.evidence_score`: the best dense
            similarity of the hits; bm25 mode: the best BM25 score) is below this. ``None``: the
            collection's calibrated threshold (``QUARRY_LLM__MIN_SCORES``), else always answer.
        stop: Stop sequences passed to the LLM (OpenAI's ``stop``).
        response_format: OpenAI's ``response_format``, passed to the LLM as given (the answer is
            then not asked as structured citations: free-text markers are read). With ``stop`` or
            this set, the answer cache is neither read nor written (its key does not hold them).
    """

    query: str
    top_k: int = 5
    mode: Mode = "hybrid"
    filters: Mapping[str, Any] | None = None
    rerank: RerankRequest | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    context_tokens: int | None = None
    require_answer: bool = False
    min_score: float | None = None
    stop: tuple[str, ...] = ()
    response_format: Mapping[str, Any] | None = None


ABSTAINED = "The sources do not answer this question."
"""The answer text of an abstention (``abstained: true``)."""


class AnswerService:
    """Answers over a collection with one LLM and one answer cache (either may be absent).

    Args:
        generator: The LLM (``None``: no LLM configured; the sources come back, ``answer: None``).
        cache: The semantic answer cache (``None``: disabled).
    """

    def __init__(self, generator: Generator | None, cache: AnswerCache | None = None) -> None:
        self.generator = generator
        self.cache = cache

    async def aclose(self) -> None:
        """Close the LLM client."""
        if self.generator is not None:
            await self.generator.aclose()

    def check_available(self) -> None:
        """Fail at once when an answer is required and the LLM is missing or being skipped.

        Raises:
            LLMNotConfigured: No LLM.
            GenerationUnavailable: The LLM is being skipped after an outage.
        """
        if self.generator is None:
            raise LLMNotConfigured("an answer was required but no LLM is configured (QUARRY_LLM__URL)")
        outage = getattr(self.generator, "outage", None)
        if outage is not None:
            raise type(outage)(outage.message, retry_after_s=outage.retry_after_s)

    async def events(  # noqa: PLR0913 - the request and what the caller lends it
        self,
        q: View,
        name: str,
        req: AnswerRequest,
        *,
        cache: CacheUse | None = None,
        shed: Refusal | None = None,
        quota: TokenQuota | None = None,
    ) -> AsyncIterator[Event]:
        """The answer's events: a cache hit's, or retrieve and build the prompt, then the LLM's.

        Args:
            q: The caller's view (its tenant's namespace over the shared engines: :class:`~quarry.services.view.View`).
            name: The collection.
            req: The question and its parameters.
            cache: What the caller lets the cache do (``None``: no cache at all).
            shed: Set when the saturated server sheds this request: a cache hit or its error.
            quota: The caller's token quota (``None``: unlimited).

        Raises:
            QuarryError: What retrieval raises (unknown collection, bad filter, ...), before any event.
            RateLimited: ``quota`` has no room for the prompt (the LLM is not asked).
        """
        started = time.perf_counter()
        cfg = q.settings.llm
        if req.require_answer:
            self.check_available()
        collection = await off_loop(collections.get, q, name)
        budget = req.context_tokens or cfg.context_tokens
        params = GenerationParams(
            max_tokens=req.max_tokens or cfg.max_tokens,
            temperature=cfg.temperature if req.temperature is None else req.temperature,
            seed=req.seed, stop=req.stop, response_format=req.response_format,
        )
        plan = await self._cache_plan(q, collection, req, params, budget, cache)
        plan.count()
        if plan.result == "hit":
            replayed = _replayed_sources(plan)
            feedback.note_replayed(q, name, replayed.get("version"), replayed.get("rollout"), [
                s["document_id"] for part in ("sources", "left_out") for s in replayed.get(part, ())])
            return answer_cache.replay(plan, started)
        if shed is not None:
            raise await shed.refused()
        candidates, degraded, timings, evidence, served = await self._retrieve(q, name, req, plan)
        if plan.lookup_ms:
            timings["cache"] = plan.lookup_ms
        floor = abstention.threshold(cfg.min_scores, name, req.min_score)
        if floor is not None and (not candidates or (evidence is not None and evidence < floor)):
            return answer_cache.recording(
                _stamped(_abstained(candidates, degraded, timings, started, evidence, floor), served), plan,
                cache is not None and cache.store,
            )
        generator = self.generator
        # a client's own response_format wins: then free-text markers are read
        structured = generator is not None and generator.structured != "off" and req.response_format is None
        extractive = structured and cfg.answer_style == "extractive"
        system = (EXTRACTIVE_SYSTEM if extractive else STRUCTURED_SYSTEM) if structured else SYSTEM
        t = time.perf_counter()
        prompt = await self._prompt(req.query, candidates, budget, system)
        timings["prompt"] = (time.perf_counter() - t) * 1000
        if structured and prompt.sent:
            extract = {s.number: s.text for s in prompt.sent} if extractive else None
            params = dataclasses.replace(params, schema=answer_schema([s.number for s in prompt.sent], extract))
        if quota is not None and generator is not None and prompt.sent:  # the LLM will be asked
            quota.reserve(prompt_tokens(prompt, generator))
        events = answer_events(
            generator, prompt, params, language=collection.language, threshold=cfg.support_threshold,
            started=started, timings_ms=timings, degraded=degraded, on_llm=_llm_metrics(q, name, req),
        )
        events = _stamped(events, served)
        if quota is not None and generator is not None:
            events = charged(events, quota, generator.estimate_tokens)
        return answer_cache.recording(events, plan, cache is not None and cache.store)

    async def collect(self, events: AsyncIterator[Event], require_answer: bool) -> dict[str, Any]:
        """The non-streaming answer: the ``sources`` event merged with ``done`` (or the degraded answer).

        Raises:
            GenerationError: The LLM failed and ``require_answer`` is set.
        """
        out: dict[str, Any] = {}
        async for event in events:
            if event.kind in ("sources", "done"):
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
        return out

    async def _cache_plan(  # noqa: PLR0913 - the request's parts
        self, q: View, collection: CollectionConfig, req: AnswerRequest, params: GenerationParams, budget: int,
        use: CacheUse | None,
    ) -> answer_cache.Plan:
        """Bypass (cache off, no LLM, asked by the caller, a query the search will refuse), or look it up."""
        cache, generator = self.cache, self.generator
        # a query the search refuses (blank, too long, a NUL or a lone surrogate) is refused there, uncached
        query_ok = not is_blank(req.query) and len(req.query) <= q.settings.search.max_query_chars
        query_ok = query_ok and _is_text(req.query)
        passed_through = bool(req.stop) or req.response_format is not None  # not in the cache key
        if cache is None or generator is None or use is None or not query_ok or not (use.read or use.store) \
                or passed_through:
            return answer_cache.Plan("bypass")
        key, version = await off_loop(answer_cache.versioned_key, q, collection, req, generator, params, budget)
        plan = await answer_cache.lookup(q, cache, key, req.query, collection, read=use.read)
        plan.version = version
        return plan

    async def _retrieve(
        self, q: View, name: str, req: AnswerRequest, plan: answer_cache.Plan
    ) -> tuple[list[Candidate], list[str], dict[str, float], float | None, dict[str, Any]]:
        """The search's hits as prompt candidates (the cache lookup's query vector reused), their evidence score.

        Each candidate carries its document's title (read from the state of record: hits hold
        chunk metadata only). Last, what :func:`served` says of the version that served the search.
        """
        loaded = q.engines.reranker.model_id if q.engines.reranker is not None else None
        rerank = rerank_options(q.settings.rerank, loaded, req.rerank)
        t = time.perf_counter()
        result = await query.search_async(
            q, name, req.query, top_k=req.top_k, mode=req.mode, filters=req.filters, rerank=rerank,
            embedded=plan.embedded,
        )
        titles = await off_loop(_titles, q, name, [h.document_id for h in result.hits]) if result.hits else {}
        timings = {"retrieve": (time.perf_counter() - t) * 1000}
        candidates = [
            Candidate(h.document_id, h.chunk_id, h.text, h.score, _title(h.metadata) or titles.get(h.document_id))
            for h in result.hits
        ]
        evidence = abstention.evidence_score(result.hits, req.mode)
        return candidates, list(result.degraded), timings, evidence, served(result.version, result.rollout)

    async def _prompt(self, query: str, candidates: list[Candidate], budget: int, system: str) -> Prompt:
        """The prompt, counted with the LLM's tokenizer (or the approximation when there is no LLM).

        Chunks are chosen with the generator's local estimate; the block is counted once by the
        server's tokenizer (one round trip; more only when the estimate fell short).
        """
        generator = self.generator
        if generator is None:

            async def approx(texts: Sequence[str]) -> list[int]:
                return [approx_tokens(t) for t in texts]

            return await build_prompt(query, candidates, budget, approx, "approx", system=system)
        await generator.count_tokens([])  # on first use: find the tokenizer, calibrate the estimate
        prompt = await build_prompt(
            query, candidates, budget, generator.count_tokens, "approx", estimate=generator.estimate_tokens,
            system=system,
        )
        prompt.tokenizer = generator.tokenizer  # known once the first count probed the server
        return prompt


async def charged(
    events: AsyncIterator[Event], quota: TokenQuota, estimate: Callable[[str], int]
) -> AsyncIterator[Event]:
    """``events``, the completion's tokens spent from ``quota`` when ``done`` comes (before it is sent).

    A stream that ends without ``done`` (the client left, the LLM failed mid-answer) is charged the
    tokens of the text streamed so far (``estimate``, the generator's local count): leaving just
    before the end must not make a long completion free.
    """
    streamed, was_charged = 0, False
    try:
        async for event in events:
            if event.kind == "delta":
                streamed += estimate(str(event.data.get("text", "")))
            elif event.kind == "done":
                used = (event.data.get("usage") or {}).get("completion_tokens")
                quota.charge(int(used) if used is not None else streamed)
                was_charged = True
            yield event
    finally:
        if not was_charged and streamed:
            quota.charge(streamed)


async def _abstained(  # noqa: PLR0913 - what the answer reports
    candidates: list[Candidate], degraded: list[str], timings: dict[str, float], started: float,
    best: float | None, min_score: float,
) -> AsyncIterator[Event]:
    """An abstention's events: no source sent, the retrieved chunks left out, ``done`` without an LLM call.

    ``best`` is the evidence score (:func:`quarry.services.abstention.evidence_score`; ``None``:
    nothing was retrieved), ``min_score`` the threshold it missed.
    """
    yield Event("sources", {
        "sources": [],
        "left_out": [{"document_id": c.document_id, "chunk_id": c.chunk_id, "score": c.score} for c in candidates],
        "context": {"budget": 0, "tokens": 0, "tokenizer": "none"}, "degraded": list(degraded),
    })
    timings["total"] = (time.perf_counter() - started) * 1000
    yield Event("done", {
        "answer": ABSTAINED, "abstained": True,
        "abstention": {"reason": "below_min_score", "best_score": best, "min_score": min_score},
        "citations": [], "dropped_citations": 0, "finish_reason": "stop",
        "usage": {"prompt_tokens": 0, "completion_tokens": 0}, "degraded": list(degraded), "timings_ms": dict(timings),
    })


def _replayed_sources(plan: answer_cache.Plan) -> Mapping[str, Any]:
    """A cache hit's stored ``sources`` event's data (``{}`` without one): its ``sources`` and ``left_out``."""
    events = plan.entry.events if plan.entry is not None else ()
    return next((e.data for e in events if e.kind == "sources"), {})


def served(version: int | None, role: str | None) -> dict[str, Any]:
    """The ``sources`` event's fields naming the collection version that served the search.

    ``version`` (the collection version's number), and ``rollout`` (``candidate`` or ``live``)
    only while a gray release routes the collection.
    """
    out: dict[str, Any] = {"version": version}
    if role is not None:
        out["rollout"] = role
    return out


async def _stamped(events: AsyncIterator[Event], fields: Mapping[str, Any]) -> AsyncIterator[Event]:
    """``events`` with ``fields`` (:func:`served`) on the ``sources`` event (so stored in the cache with it)."""
    async for event in events:
        yield Event("sources", {**event.data, **fields}) if event.kind == "sources" else event


def _titles(q: View, name: str, document_ids: Sequence[str]) -> dict[str, str]:
    """The non-empty titles of ``document_ids`` (the caller's names) from the state of record."""
    wanted = list(dict.fromkeys(document_ids))
    stored = q.docstore.get_documents(name, [q.ns.qualify(d) for d in wanted])
    out = {}
    for shown in wanted:
        doc = stored.get(q.ns.qualify(shown))
        if doc is not None and doc.title and doc.title.strip():
            out[shown] = doc.title
    return out


def _title(metadata: Mapping[str, Any]) -> str | None:
    """A hit's title (its document's ``title`` metadata), if it has one."""
    title = metadata.get("title")
    return title if isinstance(title, str) and title.strip() else None


def _is_text(value: str) -> bool:
    """Text the search accepts (no NUL, no lone surrogate)."""
    if "\x00" in value:
        return False
    try:
        check_unicode(value, "query", InvalidQuery)
    except InvalidQuery:
        return False
    return True


def _llm_metrics(
    q: View, name: str, req: AnswerRequest
) -> Callable[[float | None, float, GenerationError | None], None] | None:
    """What an answer's LLM call reports to :mod:`quarry.metrics` (``None`` with metrics off)."""
    if not q.settings.metrics.enabled:
        return None

    def observe(ttft_s: float | None, total_s: float, error: GenerationError | None) -> None:
        metrics.observe_llm(q.tenant_id, name, req.mode, ttft_s, total_s)
        if error is not None and not req.require_answer:  # answered without the LLM's text
            metrics.DEGRADED.labels("llm_failed").inc()

    return observe
