"""The embedder contract every backend passes (``embedding.base.Embedder``), as Haystack's store test mixins.

A backend's test class derives from :class:`EmbedderContract` and provides two fixtures:
``embedder`` (the backend, warmed up) and ``reopen`` (a callable that opens the same URL again,
not warmed up). ``QUERIES_DIFFER`` says whether the model embeds a query unlike the same text as a
document (E5's prefixes: yes; MiniLM: no). ``MIN_BATCH_COSINE`` is how close a text's row in a
batch is to its row alone (1.0 minus a backend's batch dependence: ONNX int8 scales activations
per batch).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from embedding.base import Embedder
from embedding.card import ModelCard

DOCUMENTS = [
    "The recommended protein intake for adult women is about 46 grams per day.",
    "Mount Everest is the highest mountain above sea level, 8,849 metres.",
    "蛋白质是由氨基酸组成的大分子，是生命活动的主要承担者。",
    "",
]
QUERY = "how much protein should a woman eat every day"


class EmbedderContract:
    """The shared tests; see the module doc for what a subclass provides."""

    QUERIES_DIFFER = False
    MIN_BATCH_COSINE = 0.999

    def test_is_an_embedder_with_a_dimension_a_fingerprint_and_a_card(self, embedder: Embedder) -> None:
        assert isinstance(embedder, Embedder)
        assert embedder.dim > 0 and embedder.model_id
        assert embedder.fingerprint and ":" in embedder.fingerprint
        assert isinstance(embedder.card, ModelCard)
        before = (embedder.fingerprint, embedder.dim, embedder.card)
        embedder.warm_up()  # idempotent: nothing changes
        assert (embedder.fingerprint, embedder.dim, embedder.card) == before

    def test_the_same_url_opened_again_is_the_same_model(
        self, embedder: Embedder, reopen: Callable[[], Embedder]
    ) -> None:
        again = reopen()
        again.warm_up()
        assert (again.fingerprint, again.dim, again.card) == (embedder.fingerprint, embedder.dim, embedder.card)

    def test_rows_are_unit_float32_in_input_order_whatever_the_batch(self, embedder: Embedder) -> None:
        got = embedder.embed(DOCUMENTS)
        assert got.vectors.shape == (len(DOCUMENTS), embedder.dim) and got.vectors.dtype == np.float32
        assert got.truncated.shape == (len(DOCUMENTS),) and got.truncated.dtype == np.bool_
        np.testing.assert_allclose(np.linalg.norm(got.vectors, axis=1), 1.0, atol=1e-4)
        for i, text in enumerate(DOCUMENTS[:3]):
            alone = embedder.embed([text]).vectors[0]
            assert float(alone @ got.vectors[i]) >= self.MIN_BATCH_COSINE, f"row {i} depends on its batch"
        reversed_rows = embedder.embed(DOCUMENTS[::-1]).vectors[::-1]
        assert np.einsum("ij,ij->i", reversed_rows, got.vectors).min() >= self.MIN_BATCH_COSINE

    def test_empty_input_gives_no_rows(self, embedder: Embedder) -> None:
        for result in (embedder.embed([]), embedder.embed_queries([])):
            assert result.vectors.shape == (0, embedder.dim) and result.truncated.shape == (0,)

    def test_a_query_finds_its_passage(self, embedder: Embedder) -> None:
        documents = embedder.embed(DOCUMENTS[:2]).vectors
        query = embedder.embed_queries([QUERY])
        assert query.vectors.shape == (1, embedder.dim)
        scores = documents @ query.vectors[0]
        assert scores[0] > scores[1], f"protein passage {scores[0]:.3f} vs Everest {scores[1]:.3f}"

    def test_queries_embed_as_the_card_says(self, embedder: Embedder) -> None:
        as_query = embedder.embed_queries([QUERY]).vectors[0]
        as_document = embedder.embed([QUERY]).vectors[0]
        same = float(as_query @ as_document) >= self.MIN_BATCH_COSINE
        assert same is not self.QUERIES_DIFFER, f"cosine of query and document rows {float(as_query @ as_document):.4f}"
