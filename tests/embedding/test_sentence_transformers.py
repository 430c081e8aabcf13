"""The in-process torch embedder: its length-grouped query path agrees with sentence-transformers' encode."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from embedding.sentence_transformers import _DIRECT_MAX, SentenceTransformerEmbedder, model_id_for, resolve_model_path

from .contract import EmbedderContract


def test_short_inputs_match_encode(minilm: SentenceTransformerEmbedder, scifact_subset: list[str]) -> None:
    texts = ["vitamin D and bone density", "0-dimensional biomaterials show inductive properties.", *scifact_subset[:5]]
    assert len(texts) <= _DIRECT_MAX
    direct = minilm.embed(texts)
    encoded = minilm._model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    assert direct.vectors.shape == (len(texts), 384)
    assert direct.vectors.dtype == np.float32
    np.testing.assert_allclose(direct.vectors, encoded, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(direct.vectors, axis=1), 1.0, atol=1e-5)
    # SciFact abstracts exceed 256 word-pieces: flagged as truncated on both paths.
    assert direct.truncated[:2].tolist() == [False, False]
    assert direct.truncated[2:].any()


def test_one_query_equals_its_row_in_a_large_batch(
    minilm: SentenceTransformerEmbedder, scifact_subset: list[str]
) -> None:
    assert len(scifact_subset) > _DIRECT_MAX
    batch = minilm.embed(scifact_subset)  # encode(): sorted, batched
    one = minilm.embed(scifact_subset[3:4])  # one forward pass
    np.testing.assert_allclose(one.vectors[0], batch.vectors[3], atol=2e-6)
    assert one.truncated[0] == batch.truncated[3]


def test_mixed_length_queries_are_grouped_and_come_back_in_order(
    minilm: SentenceTransformerEmbedder, scifact_subset: list[str]
) -> None:
    # What the query batcher hands over under load: short and long texts in arrival order.
    texts = [t if i % 3 else t[:40] for i, t in enumerate(scifact_subset[:24])]
    grouped = minilm.embed(texts)
    encoded = minilm._model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    np.testing.assert_allclose(grouped.vectors, encoded, atol=2e-6)


def test_concurrent_callers_get_the_sequential_result(
    minilm: SentenceTransformerEmbedder, scifact_subset: list[str]
) -> None:
    # Forward passes run in parallel (only tokenisation is serialised), beside a long encode().
    chunks = [scifact_subset[i : i + 3] for i in range(0, 24, 3)] + [scifact_subset]
    sequential = [minilm.embed(c).vectors for c in chunks]
    with ThreadPoolExecutor(6) as pool:
        concurrent = list(pool.map(lambda c: minilm.embed(c).vectors, chunks))
    for a, b in zip(sequential, concurrent, strict=True):
        np.testing.assert_allclose(a, b, atol=2e-6)


@pytest.mark.parametrize(
    "name", ["all-MiniLM-L6-v2", "ALL-MINILM-L6-V2", "sentence-transformers/all-MiniLM-L6-v2"]
)
def test_a_packaged_model_has_one_id_however_it_is_spelled(name: str) -> None:
    assert model_id_for(name) == SentenceTransformerEmbedder(name).model_id == "all-MiniLM-L6-v2"
    assert resolve_model_path(name) == resolve_model_path("all-MiniLM-L6-v2")


def test_a_folder_is_recorded_under_its_name_and_other_names_as_given(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert model_id_for(str(folder)) == "my-model"
    assert model_id_for("org/other-model") == "org/other-model"


class TestTorchContract(EmbedderContract):
    """The packaged MiniLM in torch: no prefixes, so a query embeds as a document."""

    MIN_BATCH_COSINE = 0.9999

    @pytest.fixture()
    def embedder(self, minilm: SentenceTransformerEmbedder) -> SentenceTransformerEmbedder:
        return minilm

    @pytest.fixture()
    def reopen(self) -> Callable[[], SentenceTransformerEmbedder]:
        return lambda: SentenceTransformerEmbedder("all-MiniLM-L6-v2", device="cpu")
