"""A key's LLM token quota on the answer path (issue 27: tokens per minute, 429 with Retry-After).

The LLM is the scripted OpenAI-wire stub (:mod:`tests.generation.stub`): it records every chat
request, so a refused answer is seen to reach no LLM. Its stream reports no ``usage``, so the
completion is charged as the answer path counts it (the answer's ``usage.completion_tokens``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from indexing.docstore import StateStore
from quarry.api import create_app
from quarry.api.keys import new_key, parse_rate
from quarry.service import Quarry
from quarry.settings import CacheSettings, LLMSettings, Settings
from tests.core.conftest import CountingEmbedder
from tests.generation.stub import Reply, StubLLM
from tests.llama import llama_settings

ANSWER = "/v1/collections/quota/answer"
REPLY = ["Apples ripen ", "in autumn [1]."]


@pytest.fixture()
def stub() -> Iterator[StubLLM]:
    llm = StubLLM().start()
    yield llm
    llm.stop()


@pytest.fixture()
def served(tmp_path: Path, counting: CountingEmbedder, stub: StubLLM) -> Iterator[tuple[TestClient, Quarry]]:
    quarry = Quarry(Settings(data_dir=tmp_path, llm=LLMSettings(url=stub.url)), embedder=counting)
    try:
        with TestClient(create_app(quarry)) as c:
            yield c, quarry
    finally:
        quarry.close()


def _key(state: StateStore, **kw: object) -> tuple[str, str]:
    key, record = new_key("default", ["read", "write", "admin"], **kw)  # type: ignore[arg-type]
    state.insert_api_key(record)
    return key, record.id


def _bearer(key: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **extra}


def _used(client: TestClient, key_id: str, per_min: int) -> int:
    """Tokens in the key's 60 s window now."""
    quota = client.app.state.access.tokens  # type: ignore[attr-defined]
    item = quota._item(per_min / 60)
    return per_min - int(quota.limiter.get_window_stats(item, "quarry-tokens", key_id).remaining)


def _limited() -> float:
    return REGISTRY.get_sample_value("quarry_token_limited_total") or 0.0


def test_parse_token_rate() -> None:
    assert parse_rate("20000/min", "token rate") == pytest.approx(20000 / 60)
    with pytest.raises(Exception, match="token rate"):
        parse_rate("0/min", "token rate")


def test_token_quota_refuses_before_the_llm_and_spares_other_keys_and_cache_hits(
    served: tuple[TestClient, Quarry], stub: StubLLM
) -> None:
    client, q = served
    admin, _ = _key(q.docstore)
    docs = [{"id": "a", "text": "Orchard apples ripen in autumn."}, {"id": "b", "text": "Harbour boats sail at dawn."}]
    assert client.post("/v1/collections", json={"name": "quota"}, headers=_bearer(admin)).status_code == 201
    assert client.post(f"{ANSWER.rsplit('/', 1)[0]}/documents", json={"documents": docs},
                       headers=_bearer(admin)).status_code == 200

    # a roomy quota measures what one answer costs: its prompt, then its completion
    roomy, roomy_id = _key(q.docstore, token_rate=parse_rate("100000/min"))
    stub.replies.append(Reply(pieces=list(REPLY)))
    fresh = {"Cache-Control": "no-cache"}
    resp = client.post(ANSWER, json={"query": "when do apples ripen"}, headers=_bearer(roomy, **fresh))
    assert resp.status_code == 200, resp.text
    completion = resp.json()["usage"]["completion_tokens"]
    cost = _used(client, roomy_id, 100_000)
    assert completion > 0 and cost > completion + resp.json()["context"]["tokens"]  # + question, instructions
    # streaming: the completion is charged at the end of the stream, the same answer costs the same
    stub.replies.append(Reply(pieces=list(REPLY)))
    with client.stream("POST", ANSWER, json={"query": "when do apples ripen", "stream": True},
                       headers=_bearer(roomy, **fresh)) as streamed:
        assert streamed.status_code == 200 and "event: done" in streamed.read().decode()
    assert _used(client, roomy_id, 100_000) == 2 * cost

    # a quota of 1.5 answers: the first is served (and cached), the next one's prompt has no room
    budget = cost * 3 // 2
    small, small_id = _key(q.docstore, token_rate=parse_rate(f"{budget}/min"))
    other, _ = _key(q.docstore, token_rate=parse_rate("100000/min"))
    stub.replies.append(Reply(pieces=list(REPLY)))
    first = client.post(ANSWER, json={"query": "apples in autumn"}, headers=_bearer(small))
    assert first.status_code == 200 and first.json()["answer"], first.text
    spent = _used(client, small_id, budget)
    assert abs(spent - cost) <= 3  # another question: a token or two more or less
    asked, limited = len(stub.requests), _limited()
    refused = client.post(ANSWER, json={"query": "boats at dawn"}, headers=_bearer(small))
    assert refused.status_code == 429, refused.text
    err = refused.json()["error"]
    assert err["type"] == "RateLimited" and err["retryable"]
    assert f"token quota of {budget} LLM tokens/min" in err["message"]
    assert int(refused.headers["retry-after"]) >= 1
    assert len(stub.requests) == asked  # the LLM saw no request for the refused answer
    assert _limited() == limited + 1
    # the chat-completions door shares the quota
    chat = {"model": "quarry/quota", "messages": [{"role": "user", "content": "boats at dawn"}]}
    assert client.post("/v1/chat/completions", json=chat, headers=_bearer(small)).status_code == 429
    assert len(stub.requests) == asked

    # another key at the same time is unaffected; a key without a quota too
    stub.replies.append(Reply(pieces=list(REPLY)))
    assert client.post(ANSWER, json={"query": "boats at dawn"}, headers=_bearer(other)).status_code == 200
    stub.replies.append(Reply(pieces=list(REPLY)))
    assert client.post(ANSWER, json={"query": "sail boats"}, headers=_bearer(admin)).status_code == 200
    assert len(stub.requests) == asked + 2

    # a semantic-cache hit costs no tokens: the limited key still gets its cached answer
    hit = client.post(ANSWER, json={"query": "apples in autumn"}, headers=_bearer(small))
    assert hit.status_code == 200 and hit.json()["cache"] == "hit", hit.text
    assert _used(client, small_id, budget) == spent and len(stub.requests) == asked + 2




@pytest.mark.integration
def test_token_quota_with_the_real_llama_server(tmp_path: Path, counting: CountingEmbedder) -> None:
    """SmolLM2 behind llama.cpp: the key is charged the prompt and the completion as the answer reports it.

    (This llama.cpp stream reports no ``usage``; the path counts the completion with the server's tokenizer.)
    """
    llm = llama_settings(max_tokens=8)
    quarry = Quarry(Settings(data_dir=tmp_path, llm=llm, cache=CacheSettings(enabled=False)), embedder=counting)
    try:
        with TestClient(create_app(quarry)) as client:
            admin, _ = _key(quarry.docstore)
            assert client.post("/v1/collections", json={"name": "quota"}, headers=_bearer(admin)).status_code == 201
            docs = [{"id": "a", "text": "Orchard apples ripen in autumn."}]
            assert client.post("/v1/collections/quota/documents", json={"documents": docs},
                               headers=_bearer(admin)).status_code == 200
            roomy, roomy_id = _key(quarry.docstore, token_rate=parse_rate("100000/min"))
            out = client.post(ANSWER, json={"query": "when do apples ripen"}, headers=_bearer(roomy)).json()
            usage = out["usage"]
            assert out["answer"] and usage["completion_tokens"] and out["context"]["tokenizer"] == "server", out
            used = _used(client, roomy_id, 100_000)
            reserved = used - usage["completion_tokens"]  # the prompt: its sources block, instructions, question
            assert reserved > out["context"]["tokens"] + 10, (reserved, out["context"])
            small, _ = _key(quarry.docstore, token_rate=parse_rate(f"{used * 3 // 2}/min"))
            first = client.post(ANSWER, json={"query": "when do apples ripen"}, headers=_bearer(small))
            assert first.status_code == 200, first.text
            refused = client.post(ANSWER, json={"query": "apples in autumn"}, headers=_bearer(small))
            assert refused.status_code == 429 and "token quota" in refused.json()["error"]["message"], refused.text
            assert int(refused.headers["retry-after"]) >= 1
    finally:
        quarry.close()


def test_a_stream_left_before_done_is_charged_what_it_streamed() -> None:
    """A client that leaves just before ``done`` was charged its prompt only: the completion was free."""
    import asyncio
    from typing import Any, cast

    from generation.answer import Event
    from quarry.services.answer import charged as _charged

    class Recording:
        def __init__(self) -> None:
            self.charged: list[int] = []

        def charge(self, tokens: int) -> int:
            self.charged.append(tokens)
            return tokens

    async def answer(done: bool) -> Any:
        yield Event("sources", {})
        for piece in ("one two three ", "four five ", "six"):
            yield Event("delta", {"text": piece})
        if done:
            yield Event("done", {"usage": {"completion_tokens": 7}})

    def words(text: str) -> int:
        return len(text.split())

    async def run(done: bool, leave_after: int | None) -> list[int]:
        quota = Recording()
        events = _charged(answer(done), cast(Any, quota), words)
        seen = 0
        async for _ in events:
            seen += 1
            if leave_after is not None and seen == leave_after:
                await events.aclose()  # the client left: the response stops iterating
                break
        return quota.charged

    assert asyncio.run(run(True, None)) == [7]  # the LLM's count at done
    assert asyncio.run(run(True, 3)) == [5]  # left after two deltas: charged what was streamed
    assert asyncio.run(run(False, None)) == [6]  # the LLM failed before done
