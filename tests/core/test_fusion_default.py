"""A new collection's default fusion follows its language and its model's card; the creator's fusion wins."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from embedding.card import ANY_LANGUAGE, ModelCard
from indexing.collections import FusionConfig
from indexing.fusion_default import UNCOVERED_FUSION, choose_fusion
from quarry.api import create_app
from quarry.service import Quarry

ENGLISH = ModelCard(languages=frozenset({"en"}))
EXPLICIT = FusionConfig(method="rrf", k=10)


@pytest.mark.parametrize(
    ("language", "card", "explicit", "fusion", "source"),
    [
        ("zh", ENGLISH, None, UNCOVERED_FUSION, "language"),
        ("zh", ENGLISH, EXPLICIT, EXPLICIT, "request"),  # the creator's always wins
        ("en", ENGLISH, None, None, "settings"),  # English on MiniLM: the server's RRF, unchanged
        ("en", ENGLISH, EXPLICIT, EXPLICIT, "request"),
        ("auto", ENGLISH, None, None, "settings"),  # mixed or unknown text
        ("zh", ModelCard(frozenset({ANY_LANGUAGE})), None, None, "settings"),  # multilingual-e5
        ("zh", ModelCard(frozenset({"en", "zh"})), None, None, "settings"),
        ("en", ModelCard(frozenset({"zh"})), None, UNCOVERED_FUSION, "language"),
        ("zh", ModelCard(), None, None, "settings"),  # declares nothing: nothing known against it
    ],
)
def test_the_choice(
    language: str, card: ModelCard, explicit: FusionConfig | None, fusion: FusionConfig | None, source: str
) -> None:
    got, origin = choose_fusion(language, card, "m", explicit)
    assert got == fusion and origin.source == source and origin.reason


def test_the_uncovered_default_is_a_copy_and_says_why() -> None:
    got, origin = choose_fusion("zh", ENGLISH, "all-MiniLM-L6-v2", None)
    assert got is not UNCOVERED_FUSION and got == FusionConfig(
        method="weighted", normalization="minmax", weights={"bm25": 0.7, "dense": 0.3})
    assert "all-MiniLM-L6-v2 declares languages [en], not 'zh'" in origin.reason


@pytest.fixture(scope="module")
def client(service: Quarry) -> Iterator[TestClient]:
    with TestClient(create_app(service)) as c:
        yield c


def test_create_describe_and_search_over_rest(client: TestClient, service: Quarry) -> None:
    """MiniLM declares ``en``: a ``zh`` collection leans on BM25, an ``en`` one keeps RRF, a given fusion wins."""
    assert service.embedder.card.languages == {"en"}
    made = {}
    try:
        for name, language, fusion in (("zh_default", "zh", None), ("zh_given", "zh", {"method": "rrf", "k": 10}),
                                       ("en_default", "en", None)):
            body = {"name": name, "language": language, **({"fusion": fusion} if fusion else {})}
            r = client.post("/v1/collections", json=body)
            assert r.status_code == 201, r.text
            made[name] = r.json()
            assert client.get(f"/v1/collections/{name}").json()["fusion_origin"] == made[name]["fusion_origin"]
        assert made["zh_default"]["fusion"] == {
            "method": "weighted", "k": None, "weights": {"bm25": 0.7, "dense": 0.3}, "normalization": "minmax"}
        assert made["zh_default"]["fusion_origin"]["source"] == "language"
        assert "not 'zh'" in made["zh_default"]["fusion_origin"]["reason"]
        assert made["zh_given"]["fusion"]["k"] == 10 and made["zh_given"]["fusion_origin"]["source"] == "request"
        assert made["en_default"]["fusion"] is None and made["en_default"]["fusion_origin"]["source"] == "settings"

        docs = [{"id": "protein", "text": "蛋白质是由氨基酸组成的大分子，是生命活动的主要承担者。"},
                {"id": "everest", "text": "珠穆朗玛峰是世界上海拔最高的山峰，位于中国和尼泊尔边界。"}]
        r = client.post("/v1/collections/zh_default/documents", json={"documents": docs})
        assert r.status_code == 200, r.text
        hit = client.post("/v1/collections/zh_default/search", json={"query": "世界最高的山峰"}).json()["hits"][0]
        assert hit["document_id"] == "everest"
        assert hit["explain"]["fusion"] | {"score": 0} == {
            "method": "weighted", "weights": {"bm25": 0.7, "dense": 0.3}, "normalization": "minmax", "score": 0}
        over = client.post("/v1/collections/zh_default/search", json={"query": "山峰", "fusion": {"method": "rrf"}})
        assert over.json()["hits"][0]["explain"]["fusion"]["method"] == "rrf"  # a request's fusion still wins
    finally:
        for name in made:
            client.delete(f"/v1/collections/{name}")
