"""The answer service's use of the semantic cache (:mod:`generation.cache`): lookup, replay, store.

A request's question is embedded with the service's query encoder (the search path's breaker
applies: while the model is skipped, the lookup is a miss at once; the vector asked for is
handed on to the search, so a miss embeds the query once), its :class:`CacheKey` built
from every parameter that changes the answer and the collection's write version read *before*
retrieval (a write landing while the LLM answers leaves the entry already stale). A hit replays
the stored events (``sources``, ``delta``, ``citation``, ``done``) with this request's timings;
a miss records the events as they pass and stores them when the answer is complete (``done``
with a non-blank answer and nothing degraded; an ``error`` or a client gone mid-stream stores
nothing).

The ``sources`` event (so the JSON answer, and the chat front door's ``quarry`` field) carries
``cache: "hit" | "miss" | "bypass"``; ``quarry_answer_cache_requests_total{result}`` counts them.
Bypass: the cache is disabled, no LLM is configured, or the caller asked not to read it
(:class:`CacheUse`; the HTTP adapter reads it from ``Cache-Control`` and ``X-Quarry-Cache``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from prometheus_client import Counter

from embedding.base import Embeddings
from generation.answer import Event
from generation.base import GenerationParams, Generator
from generation.cache import AnswerCache, CacheKey, Entry, Question
from generation.cache_guard import terms
from generation.prompt import SEPARATOR, messages_for, source_text
from indexing.collections import CollectionConfig
from quarry.errors import QuarryError
from quarry.services import rollout
from quarry.services.view import View

CACHE_REQUESTS = Counter(
    "quarry_answer_cache_requests_total", "Answer requests by semantic cache outcome", ["result"]
)
CACHE_MISSES = Counter(
    "quarry_answer_cache_misses_total", "Answer cache misses by reason (below_threshold, guard:<rule>, ...)",
    ["reason"],
)
PROMPT_VERSION = hashlib.sha256(
    orjson.dumps([messages_for("{query}", "{context}"), source_text(0, "{text}"), SEPARATOR])
).hexdigest()[:12]
"""The prompt template's fingerprint: a change to it makes every cached answer unusable."""

Result = Literal["hit", "miss", "bypass"]


@dataclass
class Plan:
    """One request's cache decision: its result, and where to store the answer (if at all)."""

    result: Result
    cache: AnswerCache | None = None
    key: CacheKey | None = None
    question: Question | None = None
    entry: Entry | None = None
    lookup_ms: float = 0.0
    embedded: Future[Embeddings] | None = None  # the query's vector, asked for by the lookup (for the search)
    version: int | None = None  # the collection version the key is for: an answer another one served is not stored
    reason: str | None = None  # a miss's reason (generation.cache.Lookup.reason, or "no_vector")
    similarity: float | None = None  # cosine of the closest stored question
    threshold: float | None = None  # the least cosine for a hit that this lookup used

    def count(self) -> None:
        """Count this request in ``quarry_answer_cache_requests_total`` (a miss also by its reason)."""
        CACHE_REQUESTS.labels(self.result).inc()
        if self.result == "miss":
            CACHE_MISSES.labels(self.reason or "unknown").inc()

    def describe(self) -> dict[str, Any]:
        """What the ``sources`` event says of the cache: ``cache``; on a miss ``cache_reason``.

        With the closest stored question's cosine ``cache_similarity`` and the ``cache_threshold``
        it was held to (entries of the caller's tenant and scope only: another tenant's are never
        compared, so never shown).
        """
        out: dict[str, Any] = {"cache": self.result}
        if self.result == "miss":
            out["cache_reason"] = self.reason
        if self.similarity is not None:
            out["cache_similarity"] = round(self.similarity, 4)
            out["cache_threshold"] = self.threshold
        return out


@dataclass(frozen=True)
class CacheUse:
    """What a request lets the cache do: ``read`` (look up a stored answer), ``store`` (keep this one)."""

    read: bool = True
    store: bool = True


def cache_key(
    q: View, cfg: CollectionConfig, body: Any, generator: Generator, params: GenerationParams, budget: int
) -> CacheKey:
    """The parameters that change an answer (``body``: an ``AnswerRequest``) and the collection's state."""
    return versioned_key(q, cfg, body, generator, params, budget)[0]


def versioned_key(
    q: View, cfg: CollectionConfig, body: Any, generator: Generator, params: GenerationParams, budget: int
) -> tuple[CacheKey, int | None]:
    """:func:`cache_key`, and the collection version it is for (``None``: the collection has none yet).

    Under a gray release the scope holds the version routing chooses for this request and its
    role (``candidate`` or ``live``): an answer computed on one version is never served for another.
    """
    llm = q.settings.llm
    scope = {
        "tenant": q.tenant_id, "collection": cfg.name, "filters": body.filters, "top_k": body.top_k, "mode": body.mode,
        "rerank": None if body.rerank is None else dataclasses.asdict(body.rerank),
        "reranker": q.settings.rerank.model if body.rerank is not None else None,
        "context_tokens": budget, "max_tokens": params.max_tokens, "temperature": params.temperature,
        "seed": params.seed, "llm": [llm.url, generator.model_id], "prompt": PROMPT_VERSION,
        "support_threshold": llm.support_threshold, "encoder": q.engines.query_embedder.model_id,
        "min_score": body.min_score,
    }
    chosen = rollout.route(q, cfg.name, body.query)  # under a gray release: the version routing chooses
    if chosen is not None:
        scope["version"] = chosen.version.version
        scope["rollout"] = "candidate" if chosen.candidate else "live"
    text = orjson.dumps(scope, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode()
    state = q.docstore.collection_state(cfg.name)
    live = state.live_version if state is not None else None  # a reindex's swap: another version answers
    serving = chosen.version.version if chosen is not None else live
    return CacheKey(text, f"{cfg.created_at!r}:{q.docstore.version(cfg.name)}:{live}"), serving


async def lookup(  # noqa: PLR0913
    q: View, cache: AnswerCache, key: CacheKey, query: str, collection: CollectionConfig, *, read: bool = True
) -> Plan:
    """Embed ``query`` and look it up (unless not ``read``: a bypass that stores its answer).

    The collection gives the guard's analysis (``language``) and the least cosine for a hit
    (``cache_threshold``, else ``QUARRY_CACHE__THRESHOLD``); the query encoder's model card, the
    languages whose synonyms the cosine may judge (:func:`generation.cache_guard.terms`). A miss
    or a bypass keeps what :func:`recording` needs to store the answer, and the query's vector
    (``embedded``) for the search to reuse.
    """
    started = time.perf_counter()
    result: Result = "miss" if read else "bypass"
    embedded = q.space.searcher.submit_query(query)
    vector = await _vector(q, embedded)
    if vector is None:  # no vector: an answer that cannot be stored (retrieval degrades anyway)
        return Plan(result, lookup_ms=_ms(started), embedded=embedded, reason="no_vector" if read else None)
    question = Question(query, vector, terms(query, collection.language, _encoder_languages(q)))
    if not read:
        return Plan(result, cache, key, question, lookup_ms=_ms(started), embedded=embedded)
    threshold = collection.cache_threshold if collection.cache_threshold is not None else q.settings.cache.threshold
    found = cache.get(key, question, threshold)
    if found.entry is not None:
        return Plan(
            "hit", cache, key, question, found.entry, _ms(started), similarity=found.similarity, threshold=threshold
        )
    return Plan(
        "miss", cache, key, question, lookup_ms=_ms(started), embedded=embedded, reason=found.reason,
        similarity=found.similarity, threshold=threshold,
    )


def _encoder_languages(q: View) -> frozenset[str]:
    """The languages the service's query encoder declares (its model card; none: compared strictly)."""
    card = getattr(q.engines.embedder, "card", None)
    languages = getattr(card, "languages", None)
    return languages if isinstance(languages, frozenset) else frozenset()


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


async def _vector(q: View, embedded: Future[Embeddings]) -> Any:
    """The query's vector within the dense deadline, or ``None`` (model down, late or failing)."""
    pending = asyncio.wrap_future(embedded)
    pending.add_done_callback(lambda f: f.cancelled() or f.exception())  # read even when late
    done, _ = await asyncio.wait({pending}, timeout=q.settings.search.dense_timeout_s)
    if not done:
        return None
    exc = pending.exception()
    if exc is None:
        return pending.result().vectors[0]
    if isinstance(exc, QuarryError):
        return None
    raise exc  # a bug, not an outage


async def replay(plan: Plan, started: float) -> AsyncIterator[Event]:
    """A hit's stored events again: ``cache: "hit"``, cosine and threshold on ``sources``; this request's timings."""
    assert plan.entry is not None
    timings: dict[str, float] = {"cache": plan.lookup_ms}
    for event in plan.entry.events:
        if event.kind == "sources":
            yield Event("sources", {**event.data, **plan.describe()})
        elif event.kind == "done":
            timings["total"] = (time.perf_counter() - started) * 1000
            yield Event("done", {**event.data, "timings_ms": timings})
        else:
            if event.kind == "delta" and "ttft" not in timings:
                timings["ttft"] = (time.perf_counter() - started) * 1000
            yield event


async def recording(events: AsyncIterator[Event], plan: Plan, store: bool) -> AsyncIterator[Event]:
    """Pass ``events`` on with ``cache`` on ``sources``; store them when the answer is complete.

    Nothing is stored when the ``sources`` event names another collection ``version`` than the
    key's (:attr:`Plan.version`: a step or a swap landed between the key and the search).
    """
    seen: list[Event] = []
    async for event in events:
        seen.append(event)
        if event.kind == "sources":
            served = event.data.get("version")
            if plan.version is not None and served is not None and served != plan.version:
                store = False
            event = Event("sources", {**event.data, **plan.describe()})
        elif event.kind == "done" and store and _complete(event) and plan.cache and plan.key and plan.question:
            plan.cache.put(plan.key, plan.question, seen)
        yield event


def _complete(done: Event) -> bool:
    """An answer worth serving again: some text, nothing degraded (an empty reply is a glitch)."""
    answer = done.data.get("answer")
    return isinstance(answer, str) and bool(answer.strip()) and not done.data.get("degraded")
