"""Model cards: languages and query/passage prefixes, declared by the model or the URL, applied by the backend."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from embedding.batching import BatchingEmbedder
from embedding.card import ANY_LANGUAGE, CardOverrides, ModelCard, folder_card, split_card_options
from embedding.factory import open_embedder
from embedding.onnx import OnnxEmbedder
from embedding.sentence_transformers import resolve_model_path
from quarry.errors import ConfigError
from quarry.settings import Settings


def test_the_packaged_minilm_declares_english_and_no_prefixes() -> None:
    card = folder_card(resolve_model_path("all-MiniLM-L6-v2"))
    assert card == ModelCard(languages=frozenset({"en"}))
    assert card.covers("en") and card.covers("EN-us") and not card.covers("zh")


def test_a_folder_declares_its_prompts_and_languages(tmp_path: Path) -> None:
    folder = tmp_path / "e5"
    folder.mkdir()
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "query: ", "document": "passage: "}}))
    (folder / "README.md").write_text("---\nlanguage:\n- multilingual\n---\n# e5\n")
    assert folder_card(folder) == ModelCard(frozenset({ANY_LANGUAGE}), "query: ", "passage: ")
    (folder / "README.md").write_text("---\nlanguage: [en, ZH]\n---\n")
    assert folder_card(folder).languages == {"en", "zh"}
    (folder / "README.md").write_text("---\nlanguage: [english]\n---\n")  # not a code: declares nothing
    assert folder_card(folder).languages == frozenset()
    assert folder_card(tmp_path / "missing") == ModelCard()


def test_card_options_leave_the_backends_own_and_are_checked() -> None:
    url, card = split_card_options("onnx://m?quantize=int8&languages=en,zh&query_prefix=query%3A%20&threads=1")
    assert url == "onnx://m?quantize=int8&threads=1"
    assert card == CardOverrides(frozenset({"en", "zh"}), "query: ", None)
    assert card.over(ModelCard(frozenset({"en"}), "", "passage: ")) == ModelCard(
        frozenset({"en", "zh"}), "query: ", "passage: ")
    assert split_card_options("onnx://m?quantize=int8") == ("onnx://m?quantize=int8", CardOverrides())
    for bad in ("onnx://m?languages=english", "onnx://m?languages=en&languages=zh", "onnx://m?query_prefix=%00"):
        with pytest.raises(ConfigError):
            split_card_options(bad)


def test_prefixes_are_part_of_the_fingerprint_and_none_keeps_it() -> None:
    assert ModelCard(frozenset({"en"})).fold("sha256:ab") == "sha256:ab"
    folded = ModelCard(query_prefix="query: ", passage_prefix="passage: ").fold("sha256:ab")
    assert folded.startswith("prompted:sha256:") and folded != ModelCard(query_prefix="query: ").fold("sha256:ab")
    assert ModelCard(query_prefix="q").fold("") == ""


@pytest.fixture(scope="module")
def prefixed(onnx_cache: Path) -> OnnxEmbedder:
    url = "onnx://all-MiniLM-L6-v2?quantize=none&query_prefix=query%3A%20&passage_prefix=passage%3A%20&languages=en"
    model = open_embedder(url, Settings(embedding={"cache_dir": onnx_cache, "batch_size": 32}))
    assert isinstance(model, OnnxEmbedder)
    model.warm_up()
    return model


def test_the_backend_applies_the_prefixes_queries_and_documents_apart(
    prefixed: OnnxEmbedder, fp32: OnnxEmbedder
) -> None:
    texts = ["vitamin D and bone density", "ant colonies dig tunnels"]
    np.testing.assert_allclose(prefixed.embed(texts).vectors, fp32.embed([f"passage: {t}" for t in texts]).vectors,
                               atol=1e-6)
    np.testing.assert_allclose(prefixed.embed_queries(texts).vectors,
                               fp32.embed([f"query: {t}" for t in texts]).vectors, atol=1e-6)
    assert prefixed.fingerprint != fp32.fingerprint and prefixed.fingerprint.startswith("prompted:")


def test_the_query_path_embeds_queries(prefixed: OnnxEmbedder, fp32: OnnxEmbedder) -> None:
    batcher = BatchingEmbedder(prefixed)
    got = batcher.submit(["vitamin D"]).result().vectors
    np.testing.assert_allclose(got, fp32.embed(["query: vitamin D"]).vectors, atol=1e-6)
    assert batcher.card == prefixed.card


def test_a_folder_that_declares_a_query_prompt_gets_it_on_its_card(tmp_path: Path, onnx_cache: Path) -> None:
    folder = shutil.copytree(resolve_model_path("all-MiniLM-L6-v2"), tmp_path / "minilm-prompted")
    config = folder / "config_sentence_transformers.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "prompts": {"query": "query: "}}))
    declared = OnnxEmbedder(str(folder), cache_dir=onnx_cache, quantize="none")
    assert declared.card.query_prefix == "query: " and declared.card.languages == {"en"}
