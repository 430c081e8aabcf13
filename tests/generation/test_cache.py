"""The semantic answer cache: the lexical guard, the in-process backend, and /answer against the real llama.cpp.

Unit tests use hand-made vectors (so the guard, not the cosine, is what decides) and an
injected clock; the MiniLM cosines of the API test's pairs are checked to be above the
threshold, so its misses are the guard's. The API test answers with ``max_tokens`` 8 over a
20-document SciFact collection (7 LLM calls).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from embedding.sentence_transformers import SentenceTransformerEmbedder
from generation.answer import Event
from generation.cache import CacheKey, MemoryCache, Question, open_cache
from generation.cache_guard import contradiction, terms
from indexing.document_rules import SourceDocument
from quarry.api import create_app
from quarry.api.cache import directives
from quarry.errors import InvalidRequest
from quarry.service import Quarry
from quarry.services import answer_cache
from quarry.services.answer_cache import CacheUse
from quarry.settings import CacheSettings, Settings
from tests.generation.conftest import Served, sse_events
from tests.llama import llama_settings, require_llama

KEY = CacheKey('{"collection":"c"}', "1.0:3")


# --- the guard ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a", "b", "why"),
    [
        ("How do I enable dark mode?", "How do I disable dark mode?", "antonym"),
        ("Is aspirin safe at 5 mg per day?", "Is aspirin safe at 50 mg per day?", "number"),
        ("Is aspirin safe at 5 mg per day?", "Is aspirin safe at 5 g per day?", "unit"),
        ("Does vitamin D affect bone density?", "Does vitamin D not affect bone density?", "negation"),
        ("Does vitamin D affect bone density?", "Vitamin D doesn't affect bone density?", "negation"),
        ("Can I install it with Docker?", "Can I install it without Docker?", "negation"),
        ("Does smoking cause cancer?", "Does cancer cause smoking?", "order"),
        ("How do I install Quarry on Ubuntu?", "How do I install Quarry on Fedora?", "entity"),
        ("如何开启深色模式", "如何不开启深色模式", "negation"),
        ("如何开启深色模式", "如何关闭深色模式", "antonym"),
        ("How do I enable dark mode?", "How can I enable dark mode?", None),
        ("How do I enable dark mode?", "how do i enable the dark mode", None),
        ("What is the effect of vitamin D on bone density?", "What effect does vitamin D have on bone density?", None),
        ("Take 2 doses?", "Take two doses?", None),
        ("Why doesn't vitamin D affect bone density?", "Why does vitamin D not affect bone density?", None),
        ("Is vitamin D safe?", "Is vitamin K safe?", "entity"),
        ("What's the dose of vitamin D?", "What is the dose of vitamin D?", None),
        ("Is 1,000 mg too much?", "Is 1000 mg too much?", None),
        ("Is 5 mg enough?", "Is 5.0 mg enough?", None),
        # synonyms pass (the cosine threshold decides); the negation guard keeps what it must
        ("Does a lack of vitamin D raise cancer risk?", "Does vitamin D deficiency raise the risk of cancer?", None),
        ("How do I enable dark mode?", "How do I turn on dark mode?", None),
        ("Is aspirin safe for kids?", "Is aspirin safe for children?", None),
        ("Does exercise lower blood pressure?", "Does exercise reduce blood pressure?", None),
        ("Is CPU usage above 90 percent bad?", "Is CPU usage over 90 percent bad?", None),
        ("What are the symptoms of the flu?", "What are flu symptoms?", None),
        ("Does a lack of exercise cause obesity?", "Does exercise cause obesity?", "negation"),
        ("Is it safe to take aspirin with alcohol?", "Is it unsafe to take aspirin with alcohol?", "antonym"),
        ("How do I turn on notifications?", "How do I turn off notifications?", "antonym"),
        ("Does exercise lower blood pressure?", "Does exercise raise blood pressure?", "antonym"),
        ("Is aspirin safe for kids?", "Is aspirin safe for adults?", "antonym"),
        ("Why does the request time out after 30 seconds?", "Why does the request time out after 30 minutes?", "unit"),
        ("What events are scheduled for next week?", "What events are scheduled for last week?", "date"),
        ("How do I migrate from Milvus to Qdrant?", "How do I migrate from Qdrant to Milvus?", "order"),
        ("北京的人口是多少？", "上海的人口是多少？", "entity"),
        ("维生素D缺乏会增加患癌风险吗？", "缺少维生素D会提高癌症风险吗？", None),
        ("为什么测试通过了？", "为什么测试失败了？", "antonym"),
    ],
)
def test_the_guard_tells_contradictions_from_paraphrases(a: str, b: str, why: str | None) -> None:
    language = "zh" if not a.isascii() else "en"
    assert contradiction(terms(a, language), terms(b, language)) == why
    assert contradiction(terms(b, language), terms(a, language)) == why


def test_an_encoder_that_does_not_declare_the_language_leaves_no_room_for_synonyms() -> None:
    """all-MiniLM-L6-v2 declares ``en``: its cosine of two Chinese questions says nothing, so their words must agree."""
    a, b = "吸烟会导致肺癌吗？", "抽烟会引起肺癌吗？"
    assert contradiction(terms(a, "zh"), terms(b, "zh")) is None
    english_only = frozenset({"en"})
    assert contradiction(terms(a, "zh", english_only), terms(b, "zh", english_only)) == "content"
    assert contradiction(terms(a, "zh", frozenset({"*"})), terms(b, "zh", frozenset({"*"}))) is None
    kids = ("Is aspirin safe for kids?", "Is aspirin safe for children?")
    assert contradiction(*(terms(t, "en", english_only) for t in kids)) is None


# --- the in-process backend --------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _unit(*xs: float) -> np.ndarray:
    v = np.asarray(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def _question(text: str, vector: np.ndarray) -> Question:
    return Question(text, vector, terms(text, "en"))


def _events(answer: str) -> list[Event]:
    return [Event("sources", {"sources": []}), Event("delta", {"text": answer}), Event("done", {"answer": answer})]


V = _unit(1, 0, 0, 0)


def test_a_repeat_and_a_close_paraphrase_hit_a_far_one_and_a_contradiction_miss() -> None:
    cache = MemoryCache(threshold=0.95, ttl_s=60, max_entries=10)
    assert cache.get(KEY, _question("How do I enable dark mode?", V)).reason == "empty"
    cache.put(KEY, _question("How do I enable dark mode?", V), _events("Settings > Display."))
    hit = cache.get(KEY, _question("How do I enable dark mode?", V))
    assert hit.entry is not None and hit.entry.events[-1].data["answer"] == "Settings > Display."
    close = _unit(1, 0.2, 0, 0)  # cosine 0.98
    assert cache.get(KEY, _question("How can I enable the dark mode", close)).entry is not None
    far = _unit(1, 0.5, 0, 0)  # cosine 0.89
    assert cache.get(KEY, _question("How can I enable the dark mode", far)).reason == "below_threshold"
    # same vector, so only the guard stands between these and a wrong answer
    assert cache.get(KEY, _question("How do I disable dark mode?", V)).reason == "guard:antonym"
    assert cache.get(KEY, _question("How do I not enable dark mode?", V)).reason == "guard:negation"
    other_scope = CacheKey('{"collection":"d"}', KEY.version)
    assert cache.get(other_scope, _question("How do I enable dark mode?", V)).reason == "empty"
    stats = cache.stats()
    assert stats["hits"] == 2 and stats["misses"] == 5 and stats["entries"] == 1
    assert stats["miss_reasons"] == {"empty": 2, "below_threshold": 1, "guard:antonym": 1, "guard:negation": 1}


def test_numbers_make_a_miss_even_on_the_same_vector() -> None:
    cache = MemoryCache(threshold=0.95, ttl_s=60, max_entries=10)
    cache.put(KEY, _question("Is aspirin safe at 5 mg per day?", V), _events("yes"))
    assert cache.get(KEY, _question("Is aspirin safe at 50 mg per day?", V)).reason == "guard:number"
    assert cache.get(KEY, _question("is aspirin safe at 5 mg per day", V)).entry is not None


def test_a_write_to_the_collection_makes_every_older_entry_unusable() -> None:
    cache = MemoryCache(threshold=0.95, ttl_s=60, max_entries=10)
    cache.put(KEY, _question("How do I enable dark mode?", V), _events("a"))
    after = CacheKey(KEY.scope, "1.0:4")
    assert cache.get(after, _question("How do I enable dark mode?", V)).reason == "invalidated"
    assert cache.stats()["invalidated"] == 1 and cache.stats()["entries"] == 0
    # a collection dropped and created again starts its write counter again: its creation time differs
    cache.put(KEY, _question("How do I enable dark mode?", V), _events("a"))
    assert cache.get(CacheKey(KEY.scope, "2.0:3"), _question("How do I enable dark mode?", V)).entry is None


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    cache = MemoryCache(threshold=0.95, ttl_s=30, max_entries=10, clock=clock)
    cache.put(KEY, _question("How do I enable dark mode?", V), _events("a"))
    clock.now += 29.9
    assert cache.get(KEY, _question("How do I enable dark mode?", V)).entry is not None
    clock.now += 0.2
    assert cache.get(KEY, _question("How do I enable dark mode?", V)).reason == "empty"
    assert cache.stats()["expired"] == 1


def test_the_size_bound_drops_the_least_recently_used() -> None:
    cache = MemoryCache(threshold=0.95, ttl_s=60, max_entries=2)
    qs = [_question(f"What is topic {w}?", _unit(*row)) for w, row in
          zip(("alpha", "beta", "gamma"), np.eye(4)[:3], strict=True)]
    cache.put(KEY, qs[0], _events("0"))
    cache.put(KEY, qs[1], _events("1"))
    assert cache.get(KEY, qs[0]).entry is not None  # alpha is now the most recently used
    cache.put(KEY, qs[2], _events("2"))
    assert cache.get(KEY, qs[1]).entry is None and cache.get(KEY, qs[0]).entry is not None
    assert cache.get(KEY, qs[2]).entry is not None
    assert cache.stats()["evicted"] == 1 and cache.stats()["entries"] == 2


def test_storing_the_same_question_again_replaces_its_entry() -> None:
    cache = MemoryCache(threshold=0.95, ttl_s=60, max_entries=10)
    cache.put(KEY, _question("How do I enable dark mode?", V), _events("old"))
    cache.put(KEY, _question("how do I enable  dark mode?", V), _events("new"))
    found = cache.get(KEY, _question("How do I enable dark mode?", V)).entry
    assert found is not None and found.events[-1].data["answer"] == "new" and cache.stats()["entries"] == 1


def test_the_factory_returns_none_when_disabled() -> None:
    assert open_cache(CacheSettings(enabled=False)) is None
    assert isinstance(open_cache(CacheSettings(threshold=0.9, ttl_s=5, max_entries=3)), MemoryCache)


@pytest.mark.parametrize(
    ("headers", "read", "store"),
    [
        ({}, True, True),
        ({"cache-control": "no-cache"}, False, True),
        ({"cache-control": "max-age=0, no-store"}, False, False),
        # HTTP's request no-store forbids storing, not reading (RFC 9111, 5.2.1.5): the lookup stays
        ({"cache-control": "no-store"}, True, False),
        ({"cache-control": "No-Store, max-age=60"}, True, False),
        ({"x-quarry-cache": "Bypass"}, False, True),
    ],
)
def test_request_headers_bypass(headers: dict[str, str], read: bool, store: bool) -> None:
    assert directives(headers) == CacheUse(read, store)


@pytest.mark.parametrize(
    ("last", "stored"),
    [
        (Event("done", {"answer": "ok", "degraded": []}), True),
        (Event("done", {"answer": None, "degraded": ["llm: no LLM"]}), False),
        (Event("done", {"answer": " ", "degraded": []}), False),
        (Event("done", {"answer": "ok", "degraded": ["dense: embedder down"]}), False),
        (Event("error", {"error": {}}), False),
    ],
)
def test_only_complete_undegraded_answers_are_stored(last: Event, stored: bool) -> None:
    cache = MemoryCache(threshold=0.95, ttl_s=60, max_entries=10)
    question = _question("How do I enable dark mode?", V)

    async def events() -> AsyncIterator[Event]:
        yield Event("sources", {"sources": []})
        yield Event("delta", {"text": "ok"})
        yield last

    async def run() -> list[Event]:
        plan = answer_cache.Plan("miss", cache, KEY, question)
        return [e async for e in answer_cache.recording(events(), plan, store=True)]

    passed = asyncio.run(run())
    assert passed[0].data["cache"] == "miss" and passed[-1] is last
    assert (cache.get(KEY, question).entry is not None) is stored


# --- /answer with the real llama.cpp server ----------------------------------------------------
COLLECTION = "scifact_cache"
URL = f"/v1/collections/{COLLECTION}/answer"
ASK = {"top_k": 2, "max_tokens": 8, "temperature": 0, "seed": 3, "context_tokens": 200}
Q = "What is the effect of vitamin D on bone density?"
PARAPHRASE = "What is the effect of vitamin D on the bone density"
NEGATED = "What is not the effect of vitamin D on bone density?"
Q5, Q50 = (f"What is the effect of {n} mg of vitamin D on bone density?" for n in (5, 50))


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, minilm: SentenceTransformerEmbedder,
    scifact_sample: list[SourceDocument],
) -> Iterator[tuple[Served, Quarry]]:
    require_llama()
    llm = llama_settings()
    settings = Settings(data_dir=tmp_path_factory.mktemp("cache-data"), llm=llm)
    q = Quarry(settings, embedder=minilm)
    q.create_collection(COLLECTION, language="en")
    q.upsert(COLLECTION, scifact_sample[:20])
    with Served(create_app(q)) as s:
        yield s, q
    q.close()


def _counted(result: str) -> float:
    return REGISTRY.get_sample_value("quarry_answer_cache_requests_total", {"result": result}) or 0.0


@pytest.mark.integration
def test_answer_cache_against_the_real_llm(  # noqa: PLR0915 - one scenario, in order
    served: tuple[Served, Quarry], minilm: SentenceTransformerEmbedder, scifact_sample: list[SourceDocument],
) -> None:
    server, q = served
    vectors = minilm.embed([Q, PARAPHRASE, NEGATED, Q5, Q50]).vectors
    cosines = vectors @ vectors.T
    threshold = q.settings.cache.threshold
    assert min(cosines[0, 1], cosines[0, 2], cosines[3, 4]) >= threshold, cosines  # the guard decides those
    before = {r: _counted(r) for r in ("hit", "miss", "bypass")}

    def ask(query: str, **headers: str) -> dict[str, Any]:
        r = c.post(URL, json={"query": query, **ASK}, headers=headers)
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    with httpx.Client(base_url=server.url, timeout=120) as c:
        first = ask(Q)
        assert first["cache"] == "miss" and first["answer"] and first["degraded"] == []
        again = ask(Q)
        assert again["cache"] == "hit"
        for field in ("answer", "citations", "sources", "dropped_citations", "usage", "context"):
            assert again[field] == first[field], field
        assert "retrieve" not in again["timings_ms"] and again["timings_ms"]["total"] < first["timings_ms"]["total"]
        assert ask(PARAPHRASE)["cache"] == "hit"
        negated = ask(NEGATED)
        assert negated["cache"] == "miss" and negated["cache_reason"] == "guard:negation", negated
        assert negated["cache_similarity"] >= threshold
        assert ask(Q5)["cache"] == "miss"
        assert ask(Q50)["cache"] == "miss"
        assert ask(Q, **{"X-Quarry-Cache": "bypass"})["cache"] == "bypass"
        assert ask(Q, **{"Cache-Control": "no-cache"})["cache"] == "bypass"

        with c.stream("POST", URL, json={"query": Q, "stream": True, **ASK}) as r:
            events = [(k, d) for k, d, _ in sse_events(r)]
        assert events[0][0] == "sources" and events[0][1]["cache"] == "hit" and events[-1][0] == "done"
        assert "".join(d["text"] for k, d in events if k == "delta") == first["answer"]
        assert events[-1][1]["citations"] == first["citations"]

        chat = c.post("/v1/chat/completions", json={
            "model": f"quarry/{COLLECTION}", "messages": [{"role": "user", "content": Q}], "max_tokens": 8,
            "temperature": 0, "seed": 3, "quarry": {"top_k": 2, "context_tokens": 200},
        }).json()
        assert chat["quarry"]["cache"] == "hit" and chat["choices"][0]["message"]["content"] == first["answer"]

        other = ask(Q, **{"X-Quarry-Cache": "bypass"})  # a different top_k is another scope
        r = c.post(URL, json={"query": Q, **{**ASK, "top_k": 3}})
        assert r.json()["cache"] == "miss" and other["cache"] == "bypass"

        q.upsert(COLLECTION, scifact_sample[20:21])  # any write to the collection
        stale = ask(Q)
        assert stale["cache"] == "miss" and stale["cache_reason"] == "invalidated", stale
        assert ask(PARAPHRASE)["cache"] == "hit"  # the answer stored after the write serves again

    after = {r: _counted(r) - before[r] for r in before}
    assert after == {"hit": 5, "miss": 6, "bypass": 3}, after
    stats = server.server.config.app.state.answer_cache.stats()
    assert stats["miss_reasons"]["guard:negation"] == 1 and stats["miss_reasons"]["guard:number"] >= 1
    assert stats["invalidated"] >= 4  # Q, the negated and the two numbered questions, after the upsert



@pytest.mark.integration
def test_a_cache_miss_embeds_the_query_once(served: tuple[Served, Quarry], monkeypatch: pytest.MonkeyPatch) -> None:
    """The lookup's vector is the search's: one query-encoder call per /answer miss (and per bypass)."""
    server, q = served
    asked: list[list[str]] = []
    submit = q.query_embedder.submit

    def counting(texts: list[str]) -> Any:
        asked.append(list(texts))
        return submit(texts)

    monkeypatch.setattr(q.query_embedder, "submit", counting)
    question = "Which cells does interleukin signalling act on in this cohort?"
    with httpx.Client(base_url=server.url, timeout=120) as c:
        r = c.post(URL, json={"query": question, **ASK})
        assert r.status_code == 200 and r.json()["cache"] == "miss", r.text
        assert r.json()["sources"], r.text  # the dense channel ran (hybrid, nothing degraded)
        assert r.json()["degraded"] == [], r.text
        assert asked == [[question]]
        stored = c.post(URL, json={"query": question, **ASK}, headers={"X-Quarry-Cache": "bypass"})
        assert stored.json()["cache"] == "bypass" and asked == [[question]] * 2


@pytest.mark.integration
def test_an_answer_never_comes_from_another_collection_version(served: tuple[Served, Quarry]) -> None:
    """A reindex (or a rollback) swaps the live version: what the older version answered is not served."""
    server, q = served
    question = "Which cells does the immune response to vitamin D involve?"

    def ask() -> dict[str, Any]:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            r = c.post(URL, json={"query": question, **ASK})
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out

    ask()
    assert ask()["cache"] == "hit"
    before = q.docstore.version(COLLECTION)
    q.reindex(COLLECTION)
    after_reindex = ask()
    assert after_reindex["cache"] == "miss" and after_reindex["cache_reason"] == "invalidated", after_reindex
    assert ask()["cache"] == "hit"
    q.rollback(COLLECTION)
    rolled_back = ask()
    assert rolled_back["cache"] == "miss" and rolled_back["cache_reason"] == "invalidated", (
        rolled_back, before, q.docstore.version(COLLECTION),
    )


def test_a_collection_sets_its_own_cache_threshold(tmp_path: Path, minilm: SentenceTransformerEmbedder) -> None:
    """``cache_threshold`` at creation: kept, shown by describe, used by the lookup; a non-cosine is refused."""
    q = Quarry(Settings(data_dir=tmp_path), embedder=minilm)
    try:
        with TestClient(create_app(q)) as c:
            for bad in (0, 1.5, "0.9"):
                r = c.post("/v1/collections", json={"name": "strict", "cache_threshold": bad})
                assert r.status_code == 422 and r.json()["error"]["type"] == "InvalidRequest", r.text
            assert c.post("/v1/collections", json={"name": "strict", "cache_threshold": 0.97}).status_code == 201
            assert c.post("/v1/collections", json={"name": "plain"}).status_code == 201
            assert c.get("/v1/collections/strict").json()["cache_threshold"] == 0.97
            assert c.get("/v1/collections/plain").json()["cache_threshold"] is None
        with pytest.raises(InvalidRequest, match="cache_threshold"):
            q.create_collection("other", cache_threshold=1.2)
        assert q.get_collection("strict").cache_threshold == 0.97
    finally:
        q.close()

    cache = MemoryCache(0.9, 60, 10)
    cache.put(KEY, _question("How do I enable dark mode?", _unit(1, 0, 0, 0)), _events("x"))
    close = _question("How can I enable the dark mode", _unit(1, 0.4, 0, 0))  # cosine 0.93
    assert cache.get(KEY, close).entry is not None
    assert cache.get(KEY, close, threshold=0.97).reason == "below_threshold"
