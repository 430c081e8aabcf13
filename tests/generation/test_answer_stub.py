"""The answer path against a scripted OpenAI-compatible stub: replies a real model won't give on demand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from embedding.sentence_transformers import SentenceTransformerEmbedder
from generation.base import GenerationParams
from generation.openai_compat import OpenAICompatGenerator
from indexing.document_rules import SourceDocument
from quarry.api import create_app
from quarry.errors import GenerationUnavailable
from quarry.service import Quarry
from quarry.settings import CacheSettings, LLMSettings, Settings
from tests.generation.conftest import Served, sse_events
from tests.generation.stub import Reply, StubLLM

FIRST_TOKEN_S, STALL_S = 1.5, 1.0
COLLECTION = "stubbed"


@pytest.fixture(scope="module")
def stub() -> Iterator[StubLLM]:
    server = StubLLM().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, minilm: SentenceTransformerEmbedder, stub: StubLLM,
    scifact_sample: list[SourceDocument],
) -> Iterator[Served]:
    # free text: these scripts test marker parsing and deadlines (structured replies: test_structured.py)
    llm = LLMSettings(url=stub.url, first_token_timeout_s=FIRST_TOKEN_S, stall_timeout_s=STALL_S, retry_after_s=0,
                      structured="off")
    settings = Settings(data_dir=tmp_path_factory.mktemp("stub-data"), llm=llm, cache=CacheSettings(enabled=False))
    quarry = Quarry(settings, embedder=minilm)  # scripted replies differ per request: no answer cache
    quarry.create_collection(COLLECTION, language="en")
    quarry.upsert(COLLECTION, scifact_sample[:10])
    with Served(create_app(quarry)) as s:
        yield s
    quarry.close()


@pytest.fixture()
def client(served: Served, stub: StubLLM) -> Iterator[httpx.Client]:
    stub.replies.clear()
    with httpx.Client(base_url=served.url, timeout=30) as c:
        yield c
    assert not stub.replies, "a scripted reply was not used"


URL = f"/v1/collections/{COLLECTION}/answer"
QUERY = {"query": "vitamin D and bone density", "top_k": 2, "max_tokens": 32, "seed": 7}
MARKERS = "Claim one [3]. Both [1-3] and [1, 2] and 【2】."


def test_out_of_range_markers_are_dropped_and_counted(client: httpx.Client, stub: StubLLM) -> None:
    stub.replies.append(Reply(pieces=["Claim one [3", "]. Both [1-", "3] and [1, 2] and 【2】."]))
    r = client.post(URL, json=QUERY)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] == MARKERS and len(body["sources"]) == 2
    assert body["dropped_citations"] == 2  # [3], and the 3 of [1-3]
    sources = {s["number"]: s["chunk_id"] for s in body["sources"]}
    assert [(c["marker"], c["chunk_id"]) for c in body["citations"]] == [
        (n, sources[n]) for n in (1, 2, 1, 2, 2)
    ]
    sent = stub.requests[-1]
    assert sent["max_tokens"] == 32 and sent["seed"] == 7 and sent["stream"] is True
    assert "[1] " in sent["messages"][1]["content"] and "[3] " not in sent["messages"][1]["content"]


def test_streamed_citations_arrive_as_markers_complete(client: httpx.Client, stub: StubLLM) -> None:
    stub.replies.append(Reply(pieces=["Claim one [3", "]. Both [1-", "3] and [1, 2] and 【2】."]))
    with client.stream("POST", URL, json={**QUERY, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [(kind, data) for kind, data, _ in sse_events(r)]
    kinds = [k for k, _ in events]
    assert kinds[0] == "sources" and kinds[-1] == "done"
    assert kinds[1:-1] == ["delta", "delta", "delta"] + ["citation"] * 5  # [3] resolves to nothing
    done = events[-1][1]
    assert done["answer"] == MARKERS and done["dropped_citations"] == 2
    assert [d for k, d in events if k == "citation"] == done["citations"]


def test_a_reply_that_never_starts_ends_the_stream_with_an_error_within_the_deadline(
    client: httpx.Client, stub: StubLLM
) -> None:
    stub.replies.append(Reply(hold_before_headers=True))
    started = time.monotonic()
    with client.stream("POST", URL, json={**QUERY, "stream": True}) as r:
        events = list(sse_events(r))
    assert [k for k, _, _ in events] == ["sources", "error"]
    kind, data, at = events[-1]
    assert data["error"]["type"] == "GenerationTimeout" and data["error"]["retryable"] is True
    assert "first token" in data["error"]["message"]
    assert at - started <= FIRST_TOKEN_S + 1.0
    _wait_for(lambda: len(stub.closed) >= 1)  # the upstream request was closed, not left hanging


def test_a_stall_after_a_token_ends_the_stream_with_an_error_within_the_deadline(
    client: httpx.Client, stub: StubLLM
) -> None:
    stub.replies.append(Reply(pieces=["Vitamin D", " helps"], stall_after=1))
    closed = len(stub.closed)
    with client.stream("POST", URL, json={**QUERY, "stream": True}) as r:
        events = list(sse_events(r))
    assert [k for k, _, _ in events] == ["sources", "delta", "error"]
    assert "stall" in events[-1][1]["error"]["message"]
    assert events[-1][2] - events[1][2] <= STALL_S + 1.0
    _wait_for(lambda: len(stub.closed) > closed)


def test_a_client_disconnect_closes_the_upstream_request(client: httpx.Client, stub: StubLLM) -> None:
    stub.replies.append(Reply(pieces=["tok "] * 100, gap_s=0.2))  # 20 s of text, no deadline missed
    closed = len(stub.closed)
    with client.stream("POST", URL, json={**QUERY, "stream": True}) as r:
        for kind, _, _ in sse_events(r):
            if kind == "delta":
                break
    left = time.monotonic()
    _wait_for(lambda: len(stub.closed) > closed)
    assert stub.closed[-1] - left < 2.0


def test_a_client_disconnect_ends_the_llm_span_as_cancelled(client: httpx.Client, stub: StubLLM) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from quarry import tracing
    from quarry.settings import TracingSettings

    exporter = InMemorySpanExporter()
    assert tracing.configure(TracingSettings(enabled=True), exporter=exporter)
    try:
        stub.replies.append(Reply(pieces=["tok "] * 100, gap_s=0.2))
        with client.stream("POST", URL, json={**QUERY, "stream": True}) as r:
            for kind, _, _ in sse_events(r):
                if kind == "delta":
                    break
        _wait_for(lambda: any(s.name.startswith("chat") for s in exporter.get_finished_spans()))
    finally:
        tracing.shutdown()
    (chat,) = [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]
    assert chat.attributes["gen_ai.response.finish_reasons"] == ("cancelled",)
    assert chat.attributes["gen_ai.operation.name"] == "chat"


def test_non_streaming_degrades_to_sources_or_fails_typed_when_required(client: httpx.Client, stub: StubLLM) -> None:
    stub.replies.append(Reply(hold_before_headers=True))
    started = time.monotonic()
    r = client.post(URL, json=QUERY)
    assert time.monotonic() - started <= FIRST_TOKEN_S + 1.0
    body = r.json()
    assert r.status_code == 200 and body["answer"] is None and len(body["sources"]) == 2
    assert body["degraded"][-1].startswith("llm: ") and "first token" in body["degraded"][-1]
    stub.replies.append(Reply(status=503))
    r = client.post(URL, json={**QUERY, "require_answer": True})
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert r.json()["error"]["type"] == "GenerationUnavailable" and r.json()["error"]["retryable"] is True
    stub.replies.append(Reply(status=400))
    r = client.post(URL, json={**QUERY, "require_answer": True})
    assert r.status_code == 502 and r.json()["error"]["type"] == "GenerationError"


def test_a_malformed_frame_is_a_typed_error_event(client: httpx.Client, stub: StubLLM) -> None:
    stub.replies.append(Reply(raw=[b"data: {not json\n\n"]))
    with client.stream("POST", URL, json={**QUERY, "stream": True}) as r:
        events = [(k, d) for k, d, _ in sse_events(r)]
    assert [k for k, _ in events] == ["sources", "error"]
    assert events[-1][1]["error"]["type"] == "GenerationError"


def test_retrieval_errors_come_before_any_event(client: httpx.Client) -> None:
    r = client.post("/v1/collections/nope/answer", json={**QUERY, "stream": True})
    assert r.status_code == 404 and r.json()["error"]["type"] == "CollectionNotFound"


def test_the_breaker_skips_the_server_after_an_outage(stub: StubLLM) -> None:
    stub.replies.clear()
    stub.replies.append(Reply(status=503))
    gen = OpenAICompatGenerator(stub.url, LLMSettings(url=stub.url, retry_after_s=60))

    async def ask() -> str:
        return "".join([p.text async for p in gen.stream([{"role": "user", "content": "hi"}], GenerationParams(8))])

    async def run() -> None:
        with pytest.raises(GenerationUnavailable, match="503"):
            await ask()
        asked = len(stub.requests)
        with pytest.raises(GenerationUnavailable, match="retried in") as skipped:
            await ask()
        assert len(stub.requests) == asked and skipped.value.retry_after_s is not None
        assert skipped.value.retry_after_s > 50
        await gen.aclose()

    asyncio.run(run())


def test_token_counts_fall_back_to_the_stated_approximation(stub: StubLLM) -> None:
    gen = OpenAICompatGenerator(stub.url, LLMSettings(url=stub.url))

    async def run() -> list[int]:
        try:
            return await gen.count_tokens(["abcdef", "一二三"])
        finally:
            await gen.aclose()

    assert asyncio.run(run()) == [2, 3] and gen.tokenizer == "approx"


def _wait_for(condition: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_a_stall_in_a_chat_completion_stream_raises_in_the_openai_client(served: Served, stub: StubLLM) -> None:
    import openai

    stub.replies.clear()
    stub.replies.append(Reply(pieces=["Vitamin D", " helps"], stall_after=1))
    oa = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
    text = ""
    with pytest.raises(openai.APIError, match="stall"):
        for chunk in oa.chat.completions.create(
            model=f"quarry/{COLLECTION}", messages=[{"role": "user", "content": "vitamin D"}], stream=True
        ):
            text += chunk.choices[0].delta.content or "" if chunk.choices else ""
    assert text == "Vitamin D"
    with pytest.raises(openai.BadRequestError, match="quarry/<collection>"):
        oa.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])


def test_weak_evidence_abstains_without_an_llm_call(client: httpx.Client, stub: StubLLM) -> None:
    """Below ``min_score`` the answer abstains and the LLM server sees no request; above it, it is asked."""
    asked = len(stub.requests)
    out_of_corpus = {**QUERY, "query": "What is the capital of Mongolia?", "mode": "dense", "min_score": 0.5}
    r = client.post(URL, json=out_of_corpus)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["abstained"] is True and body["abstention"]["reason"] == "below_min_score", body
    assert body["abstention"]["best_score"] < 0.5 and body["sources"] == [] and body["citations"] == []
    assert len(stub.requests) == asked  # no chat completion was asked for
    chat = client.post("/v1/chat/completions", json={
        "model": f"quarry/{COLLECTION}", "messages": [{"role": "user", "content": out_of_corpus["query"]}],
        "quarry": {"mode": "dense", "min_score": 0.5},
    })
    assert chat.status_code == 200 and chat.json()["quarry"]["abstained"] is True, chat.text
    assert len(stub.requests) == asked
    stub.replies.append(Reply(pieces=["Vitamin D matters [1]."]))
    answered = client.post(URL, json={**QUERY, "mode": "dense", "min_score": -1.0}).json()
    assert "abstained" not in answered and len(stub.requests) == asked + 1


@pytest.mark.parametrize(("extra", "param"), [({"n": 2}, "n"), ({"logprobs": True}, "logprobs"),
                                              ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools")])
def test_unsupported_openai_parameters_are_a_400_in_openai_shape(
    served: Served, stub: StubLLM, extra: dict[str, object], param: str
) -> None:
    """The official client gets BadRequestError with error.param and error.code; the LLM is not asked."""
    import openai

    asked = len(stub.requests)
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(  # type: ignore[call-overload]
            model=f"quarry/{COLLECTION}", messages=[{"role": "user", "content": "vitamin D"}], **extra,
        )
    error = caught.value.body
    assert isinstance(error, dict), error
    assert error["param"] == param and error["code"] == "unsupported_parameter" and error["type"], error
    assert caught.value.status_code == 400 and len(stub.requests) == asked


def test_sources_and_citations_carry_their_documents_titles(
    client: httpx.Client, stub: StubLLM, scifact_sample: list[SourceDocument]
) -> None:
    """Hits hold chunk metadata only; the answer reads each document's title from the state of record."""
    stub.replies.append(Reply(pieces=["Vitamin D matters [1]. So does bone [2]."]))
    body = client.post(URL, json=QUERY).json()
    titles = {d.id: d.title for d in scifact_sample[:10]}
    assert body["sources"] and all(s["title"] == titles[s["document_id"]] for s in body["sources"]), body["sources"]
    assert [c["title"] for c in body["citations"]] == [titles[c["document_id"]] for c in body["citations"]]
    assert body["citations"] and all(c["title"] for c in body["citations"])


def test_a_collections_calibrated_threshold_abstains_without_an_llm_call(
    tmp_path: Path, minilm: SentenceTransformerEmbedder, stub: StubLLM, scifact_sample: list[SourceDocument]
) -> None:
    """``QUARRY_LLM__MIN_SCORES`` applies per collection when the request names no ``min_score``."""
    llm = LLMSettings(url=stub.url, structured="off", min_scores={"strict": 0.99})
    quarry = Quarry(Settings(data_dir=tmp_path, llm=llm, cache=CacheSettings(enabled=False)), embedder=minilm)
    for name in ("strict", "open"):
        quarry.create_collection(name, language="en")
        quarry.upsert(name, scifact_sample[:5])
    stub.replies.clear()
    asked = len(stub.requests)
    try:
        with Served(create_app(quarry)) as served, httpx.Client(base_url=served.url, timeout=30) as c:
            r = c.post("/v1/collections/strict/answer", json={"query": "What is the capital of Mongolia?"})
            body = r.json()
            assert body["abstained"] is True and body["abstention"]["min_score"] == 0.99, body
            assert body["abstention"]["best_score"] < 0.99 and len(stub.requests) == asked
            chat = c.post("/v1/chat/completions", json={
                "model": "quarry/strict", "messages": [{"role": "user", "content": "What is the capital of Mongolia?"}],
            }).json()
            assert chat["choices"][0]["finish_reason"] == "stop" and chat["quarry"]["abstained"] is True, chat
            assert chat["choices"][0]["message"]["content"] == body["answer"] and len(stub.requests) == asked
            stub.replies.append(Reply(pieces=["An answer [1]."]))
            other = c.post("/v1/collections/open/answer", json={"query": "What is the capital of Mongolia?"}).json()
            assert "abstained" not in other and len(stub.requests) == asked + 1  # no threshold there: asked
    finally:
        quarry.close()
