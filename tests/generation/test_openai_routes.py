"""OpenAI compatibility through the official ``openai`` client: models, embeddings, usage, parameters, errors,
multi-turn rewrites, and two tenants' keys on every new route.

The LLM is the scripted stub (``tests/generation/stub.py``): it records each chat request, so a
test sees what reached the LLM (a passed-through ``stop``, the rewrite's prompt) and scripts
replies a real model will not give on demand (junk rewrites, an outage). The real llama.cpp
two-turn conversation is ``tests/generation/test_chat_llama.py``.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from embedding.sentence_transformers import SentenceTransformerEmbedder
from indexing.document_rules import SourceDocument
from quarry.api import create_app
from quarry.api.keys import new_key
from quarry.service import Quarry
from quarry.settings import CacheSettings, LLMSettings, OpenAISettings, Settings
from tests.generation.conftest import Served
from tests.generation.stub import Reply, StubLLM

COLLECTION = "oa_docs"
MODEL = f"quarry/{COLLECTION}"
OTHER = "oa_beta"  # tenant beta's own collection
MAX_INPUTS, MAX_CHARS, MAX_MESSAGES = 8, 400, 6


@pytest.fixture(scope="module")
def stub() -> Iterator[StubLLM]:
    server = StubLLM().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory, minilm: SentenceTransformerEmbedder, stub: StubLLM,
    scifact_sample: list[SourceDocument],
) -> Iterator[tuple[Served, dict[str, str], Quarry]]:
    # free text: the stub scripts plain replies and failures (structured replies: test_structured.py)
    llm = LLMSettings(url=stub.url, first_token_timeout_s=2, stall_timeout_s=2, retry_after_s=0, structured="off")
    limits = OpenAISettings(max_embedding_inputs=MAX_INPUTS, max_embedding_chars=MAX_CHARS, max_messages=MAX_MESSAGES)
    settings = Settings(data_dir=tmp_path_factory.mktemp("oa-data"), llm=llm, cache=CacheSettings(enabled=False),
                        openai=limits)
    quarry = Quarry(settings, embedder=minilm)
    keys: dict[str, str] = {}
    for tenant in ("alpha", "beta"):
        quarry.docstore.create_tenant(tenant, tenant)
        keys[tenant] = _insert(quarry, tenant, ["read", "write", "admin"])
    keys["alpha_one"] = _insert(quarry, "alpha", ["read"], collections=[COLLECTION])
    alpha, beta = quarry.for_tenant("alpha"), quarry.for_tenant("beta")
    alpha.create_collection(COLLECTION, language="en")
    alpha.upsert(COLLECTION, scifact_sample[:12])
    alpha.create_collection("oa_second", language="en")
    beta.create_collection(OTHER, language="en")
    beta.upsert(OTHER, scifact_sample[12:16])
    with Served(create_app(quarry)) as served:
        yield served, keys, quarry
    quarry.close()


def _insert(quarry: Quarry, tenant: str, scopes: list[str], collections: list[str] | None = None) -> str:
    key, record = new_key(tenant, scopes, collections=collections)
    quarry.docstore.insert_api_key(record)
    return key


@pytest.fixture()
def oa(setup: tuple[Served, dict[str, str], Quarry], stub: StubLLM) -> Iterator[Any]:
    import openai

    served, keys, _ = setup
    stub.replies.clear()
    yield openai.OpenAI(base_url=f"{served.url}/v1", api_key=keys["alpha"], max_retries=0)
    assert not stub.replies, "a scripted reply was not used"


def _client(setup: tuple[Served, dict[str, str], Quarry], who: str) -> Any:
    import openai

    served, keys, _ = setup
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=keys[who], max_retries=0)


# --- /v1/models ----------------------------------------------------------------------------
def test_models_list_and_retrieve_with_the_official_client(oa: Any) -> None:
    models = oa.models.list()
    ids = [m.id for m in models.data]
    assert ids == [MODEL, "quarry/oa_second"], ids
    assert all(m.object == "model" and m.owned_by == "quarry" and m.created > 0 for m in models.data)
    got = oa.models.retrieve(MODEL)
    assert got.id == MODEL and got.created == models.data[0].created


# --- /v1/embeddings --------------------------------------------------------------------------
def test_embeddings_are_the_collections_model_in_float_and_base64(oa: Any, minilm: SentenceTransformerEmbedder) -> None:
    texts = ["vitamin D and bone density", "白细胞的功能"]
    expected = minilm.embed(texts).vectors
    default = oa.embeddings.create(model=MODEL, input=texts)  # the client asks for base64 and decodes it
    assert [d.index for d in default.data] == [0, 1] and default.model == MODEL
    assert np.allclose(np.array([d.embedding for d in default.data], dtype=np.float32), expected, atol=1e-6)
    floats = oa.embeddings.create(model=MODEL, input=texts[0], encoding_format="float")
    assert len(floats.data) == 1 and np.allclose(floats.data[0].embedding, expected[0], atol=1e-6)
    assert default.usage.prompt_tokens > 0 and default.usage.total_tokens == default.usage.prompt_tokens
    raw = oa.embeddings.with_raw_response.create(model=COLLECTION, input=texts, encoding_format="base64").http_response
    body = raw.json()
    decoded = np.frombuffer(base64.b64decode(body["data"][1]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, expected[1], atol=1e-6)
    assert body["quarry"] == {"embedding_model": minilm.model_id, "input_type": "document", "truncated": []}


@pytest.mark.parametrize(("body", "said"), [
    ({"input": ["x"] * (MAX_INPUTS + 1)}, f"{MAX_INPUTS + 1} texts, at most {MAX_INPUTS}"),
    ({"input": ["ok", "y" * (MAX_CHARS + 1)]}, f"input[1]: {MAX_CHARS + 1} characters, at most {MAX_CHARS}"),
    ({"input": [[1, 2, 3]]}, "token arrays are not supported"),
    ({"input": ["ok", "  "]}, "input[1]: blank"),
    ({"input": []}, "no text to embed"),
    ({"input": "ok", "model": "gpt-4o"}, "collection name of the model"),
])
def test_embeddings_refuse_what_they_cannot_take_with_a_400_that_says_why(
    setup: tuple[Served, dict[str, str], Quarry], body: dict[str, Any], said: str
) -> None:
    served, keys, _ = setup
    r = httpx.post(f"{served.url}/v1/embeddings", json={"model": MODEL, **body},
                   headers={"Authorization": f"Bearer {keys['alpha']}"})
    assert r.status_code == 400 and said in r.json()["error"]["message"], r.text


def test_embeddings_refuse_other_dimensions_in_openai_shape(oa: Any) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as caught:
        oa.embeddings.create(model=MODEL, input="x", dimensions=64)
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "dimensions"


# --- chat: usage, parameters, errors ------------------------------------------------------------
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "vitamin D and bone density"}]}


def test_usage_is_real_streamed_and_not(oa: Any, stub: StubLLM) -> None:
    stub.replies.extend([Reply(pieces=["Vitamin D", " helps [1]."]), Reply(pieces=["Vitamin D", " helps [1]."])])
    reply = oa.chat.completions.create(**ASK, max_tokens=16)
    usage = reply.usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    chunks = list(oa.chat.completions.create(**ASK, max_tokens=16, stream=True, stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None, last
    assert last.usage.model_dump() == usage.model_dump()  # the same prompt, the same counts
    assert all(c.usage is None for c in chunks[:-1])
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Vitamin D helps [1]."


def test_supported_parameters_reach_the_llm(oa: Any, stub: StubLLM) -> None:
    stub.replies.append(Reply(pieces=['{"a": 1}']))
    asked = len(stub.requests)
    oa.chat.completions.create(**ASK, max_tokens=9, temperature=0.5, seed=11, stop=["END", "\n\n"],
                               response_format={"type": "json_object"})
    sent = stub.requests[asked]
    assert sent["max_tokens"] == 9 and sent["temperature"] == 0.5 and sent["seed"] == 11
    assert sent["stop"] == ["END", "\n\n"] and sent["response_format"] == {"type": "json_object"}
    stub.replies.append(Reply())
    oa.chat.completions.create(**ASK, max_completion_tokens=5, stop="END")
    assert stub.requests[-1]["max_tokens"] == 5 and stub.requests[-1]["stop"] == ["END"]


def test_n_2_is_a_400_in_openai_shape_streaming_and_not(oa: Any, stub: StubLLM) -> None:
    import openai

    asked = len(stub.requests)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            oa.chat.completions.create(**ASK, n=2, stream=stream)
        assert caught.value.body["param"] == "n" and caught.value.body["code"] == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError, match="stop"):
        oa.chat.completions.create(**ASK, stop=["a", "b", "c", "d", "e"])
    assert len(stub.requests) == asked


def test_an_llm_that_is_down_is_an_openai_error_streaming_and_not(oa: Any, stub: StubLLM) -> None:
    import openai

    stub.replies.extend([Reply(status=500), Reply(status=500)])
    for stream in (False, True):
        with pytest.raises(openai.InternalServerError) as caught:
            out = oa.chat.completions.create(**ASK, stream=stream)
            list(out) if stream else None
        assert caught.value.status_code == 503 and caught.value.body["type"] == "GenerationUnavailable"
    stub.replies.append(Reply(status=500))  # opted out: the sources, no content, finish_reason "error"
    reply = oa.chat.completions.create(**ASK, extra_body={"quarry": {"require_answer": False}})
    assert reply.choices[0].message.content is None and reply.choices[0].finish_reason == "error"
    extension = reply.model_extra["quarry"]
    assert extension["sources"] and extension["degraded"][-1].startswith("llm: ")


def test_no_llm_configured_is_a_503_in_openai_shape(
    tmp_path_factory: pytest.TempPathFactory, minilm: SentenceTransformerEmbedder,
    scifact_sample: list[SourceDocument],
) -> None:
    import openai

    quarry = Quarry(Settings(data_dir=tmp_path_factory.mktemp("no-llm")), embedder=minilm)
    quarry.create_collection(COLLECTION, language="en")
    quarry.upsert(COLLECTION, scifact_sample[:4])
    try:
        with Served(create_app(quarry)) as served:
            oa = openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0)
            with pytest.raises(openai.InternalServerError) as caught:
                oa.chat.completions.create(**ASK)
            assert caught.value.status_code == 503 and caught.value.body["type"] == "LLMNotConfigured"
            reply = oa.chat.completions.create(**ASK, extra_body={"quarry": {"require_answer": False}})
            assert reply.choices[0].finish_reason == "error" and reply.model_extra["quarry"]["sources"]
            assert oa.embeddings.create(model=MODEL, input="no LLM needed").data[0].embedding
    finally:
        quarry.close()


# --- multi-turn -----------------------------------------------------------------------------
FIRST = "Does vitamin D deficiency increase the risk of cancer?"
TURNS = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": "Some studies link them [1]."},
         {"role": "user", "content": "and in children?"}]


def test_a_follow_up_is_rewritten_by_the_llm_before_retrieval(oa: Any, stub: StubLLM) -> None:
    standalone = "Does vitamin D deficiency increase the risk of cancer in children?"
    stub.replies.extend([Reply(pieces=[standalone]), Reply(pieces=["Yes [1]."])])
    asked = len(stub.requests)
    reply = oa.chat.completions.create(model=MODEL, messages=TURNS, max_tokens=8)
    rewrite = reply.model_extra["quarry"]["rewrite"]
    assert rewrite["method"] == "llm" and rewrite["query"] == standalone and rewrite["original"] == "and in children?"
    prompt = stub.requests[asked]["messages"][-1]["content"]
    assert FIRST in prompt and "and in children?" in prompt  # the rewrite asked about this conversation
    assert standalone in stub.requests[asked + 1]["messages"][-1]["content"]  # the answer's question
    assert reply.usage.prompt_tokens > rewrite["usage"]["prompt_tokens"] > 0  # both calls counted


@pytest.mark.parametrize("junk", [FIRST, "Children are lovely.", "", "x" * 600])
def test_a_junk_rewrite_falls_back_on_the_rules(oa: Any, stub: StubLLM, junk: str) -> None:
    stub.replies.extend([Reply(pieces=[junk] if junk else []), Reply(pieces=["Yes."])])
    reply = oa.chat.completions.create(model=MODEL, messages=TURNS, max_tokens=8)
    rewrite = reply.model_extra["quarry"]["rewrite"]
    assert rewrite["method"] == "rules" and rewrite["reason"].startswith("llm_reply: "), rewrite
    assert rewrite["query"] == "Does vitamin D deficiency increase the risk of cancer in children?"


def test_an_llm_down_rewrite_falls_back_on_the_rules_and_streams(oa: Any, stub: StubLLM) -> None:
    from quarry.metrics import CHAT_REWRITES

    before = CHAT_REWRITES.labels("rules", "llm_error")._value.get()
    stub.replies.extend([Reply(status=500), Reply(pieces=["Yes", "."])])
    chunks = list(oa.chat.completions.create(model=MODEL, messages=TURNS, stream=True))
    first = chunks[0].model_extra["quarry"]["rewrite"]
    assert first["method"] == "rules" and first["reason"].startswith("llm: "), first
    assert "children" in first["query"] and "vitamin D" in first["query"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Yes."
    assert CHAT_REWRITES.labels("rules", "llm_error")._value.get() == before + 1


def test_a_first_question_costs_no_rewrite_and_rewriting_can_be_turned_off(oa: Any, stub: StubLLM) -> None:
    stub.replies.extend([Reply(), Reply()])
    asked = len(stub.requests)
    one = oa.chat.completions.create(**ASK)
    assert one.model_extra["quarry"]["rewrite"]["method"] == "none" and len(stub.requests) == asked + 1
    off = oa.chat.completions.create(model=MODEL, messages=TURNS, extra_body={"quarry": {"rewrite": False}})
    assert off.model_extra["quarry"]["rewrite"] == {**off.model_extra["quarry"]["rewrite"], "method": "none",
                                                    "reason": "off", "query": "and in children?"}
    assert len(stub.requests) == asked + 2


def test_a_conversation_is_bounded(oa: Any, stub: StubLLM) -> None:
    import openai

    asked = len(stub.requests)
    long = [{"role": "user", "content": "q"}] * (MAX_MESSAGES + 1)
    with pytest.raises(openai.BadRequestError, match=f"at most {MAX_MESSAGES}"):
        oa.chat.completions.create(model=MODEL, messages=long)
    huge = [{"role": "user", "content": "word " * 20_000}]
    with pytest.raises(openai.BadRequestError, match="characters in all"):
        oa.chat.completions.create(model=MODEL, messages=huge)
    assert len(stub.requests) == asked


# --- two tenants ----------------------------------------------------------------------------
def test_each_tenants_key_sees_and_uses_its_own_models_only(
    setup: tuple[Served, dict[str, str], Quarry], stub: StubLLM, scifact_sample: list[SourceDocument]
) -> None:
    import openai

    stub.replies.clear()
    alpha, beta, one = _client(setup, "alpha"), _client(setup, "beta"), _client(setup, "alpha_one")
    assert [m.id for m in beta.models.list().data] == [f"quarry/{OTHER}"]
    assert [m.id for m in one.models.list().data] == [MODEL]  # a key limited to one collection
    asked = len(stub.requests)
    for client, foreign in ((alpha, f"quarry/{OTHER}"), (beta, MODEL)):
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve(foreign)
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model=foreign, input="x")
        with pytest.raises(openai.NotFoundError):  # a follow-up: no rewrite is asked for a foreign collection
            client.chat.completions.create(model=foreign, messages=TURNS)
    for call in (lambda: one.models.retrieve("quarry/oa_second"),
                 lambda: one.embeddings.create(model="quarry/oa_second", input="x"),
                 lambda: one.chat.completions.create(model="quarry/oa_second", messages=TURNS)):
        with pytest.raises(openai.PermissionDeniedError):
            call()
    assert len(stub.requests) == asked
    stub.replies.extend([Reply(pieces=["Is vitamin D linked to cancer in children?"]), Reply(pieces=["ok"])])
    reply = beta.chat.completions.create(model=f"quarry/{OTHER}", messages=TURNS)
    sources = reply.model_extra["quarry"]["sources"]
    assert sources and {s["document_id"] for s in sources} <= {d.id for d in scifact_sample[12:16]}
