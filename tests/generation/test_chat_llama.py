"""A two-turn conversation through the official ``openai`` client against the REAL llama.cpp server (SmolLM2-135M).

The collection mixes SciFact documents on vitamin D (with cancer, with children), documents on
children that say nothing of vitamin D, and the first 40 of the corpus. Asked "and in children?"
after a question on vitamin D deficiency and cancer, the chat searches a standalone question
(the LLM's rewrite when it passes the check, else the rules'): its sources differ from those of
the follow-up searched as it stands, and they are about vitamin D.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from embedding.sentence_transformers import SentenceTransformerEmbedder
from indexing.document_rules import SourceDocument
from indexing.sources import iter_jsonl
from quarry.api import create_app
from quarry.service import Quarry
from quarry.settings import CacheSettings, OpenAISettings, Settings
from tests.generation.conftest import Served
from tests.llama import llama_settings, require_llama

pytestmark = pytest.mark.integration
COLLECTION = "scifact_chat"
FIRST = "Does vitamin D deficiency increase the risk of cancer?"
FOLLOW_UP = "and in children?"


def _corpus(shared_data: Path) -> list[SourceDocument]:
    """Vitamin D documents (cancer, children), 15 on children without vitamin D, and the corpus' first 40."""
    docs = list(iter_jsonl(shared_data / "scifact" / "corpus.jsonl"))

    def text(d: SourceDocument) -> str:
        return f"{d.title} {d.text}".lower()

    vitamin = [d for d in docs if "vitamin d" in text(d) and ("cancer" in text(d) or "child" in text(d))]
    children = list(itertools.islice((d for d in docs if "children" in text(d) and "vitamin" not in text(d)), 15))
    picked = {d.id: d for d in [*vitamin, *children, *docs[:40]]}
    return list(picked.values())


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, minilm: SentenceTransformerEmbedder, shared_data: Path,
) -> Iterator[tuple[Served, list[SourceDocument]]]:
    require_llama()
    # the llama.cpp server is shared by parallel test runs on 2 cores: a generous rewrite deadline, so the
    # LLM's rewrite (not the rules' fallback for a late one) is what is tested
    settings = Settings(data_dir=tmp_path_factory.mktemp("chat-llama"), llm=llama_settings(),
                        cache=CacheSettings(enabled=False), openai=OpenAISettings(rewrite_timeout_s=60))
    quarry = Quarry(settings, embedder=minilm)
    corpus = _corpus(shared_data)
    quarry.create_collection(COLLECTION, language="en")
    quarry.upsert(COLLECTION, corpus)
    with Served(create_app(quarry)) as s:
        yield s, corpus
    quarry.close()


def test_a_follow_up_is_searched_as_a_standalone_question(served: tuple[Served, list[SourceDocument]]) -> None:
    import openai

    server, corpus = served
    oa = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    args: dict[str, Any] = {"model": f"quarry/{COLLECTION}", "max_tokens": 24, "temperature": 0, "seed": 7}
    knobs = {"top_k": 5, "context_tokens": 600}
    first = oa.chat.completions.create(**args, messages=[{"role": "user", "content": FIRST}],
                                       extra_body={"quarry": knobs})
    assert first.choices[0].message.content and first.model_extra["quarry"]["rewrite"]["method"] == "none"
    turns = [{"role": "user", "content": FIRST},
             {"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": FOLLOW_UP}]
    follow = oa.chat.completions.create(**args, messages=turns, extra_body={"quarry": knobs})
    raw = oa.chat.completions.create(**args, messages=turns, extra_body={"quarry": {**knobs, "rewrite": False}})

    rewrite = follow.model_extra["quarry"]["rewrite"]
    print("rewrite:", rewrite)
    assert rewrite["method"] in ("llm", "rules") and rewrite["usage"]["completion_tokens"] > 0  # the LLM was asked
    query = rewrite["query"].lower()
    assert query != FOLLOW_UP and "vitamin d" in query and "child" in query, rewrite
    assert raw.model_extra["quarry"]["rewrite"]["query"] == FOLLOW_UP

    about = {d.id: f"{d.title} {d.text}".lower() for d in corpus}
    hits = [s["document_id"] for s in follow.model_extra["quarry"]["sources"]]
    raw_hits = [s["document_id"] for s in raw.model_extra["quarry"]["sources"]]
    print("rewritten hits:", hits, "raw hits:", raw_hits)
    assert hits and hits != raw_hits
    on_topic = sum("vitamin d" in about[h] for h in hits)
    assert "vitamin d" in about[hits[0]] and on_topic > sum("vitamin d" in about[h] for h in raw_hits), (hits, raw_hits)
    assert follow.choices[0].message.content and follow.usage is not None
    assert follow.usage.prompt_tokens > rewrite["usage"]["prompt_tokens"] > 0  # the answer's and the rewrite's
