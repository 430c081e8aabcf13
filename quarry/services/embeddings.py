"""Texts embedded with a collection's model, as ``/v1/embeddings`` serves them.

The model is the collection's live version's (:meth:`~quarry.services.models.ModelRegistry.model_for`:
after a reindex to another model, that model), so a vector computed here is comparable with the
collection's stored vectors. ``document`` texts get the model's passage prefix, ``query`` texts
its query prefix (E5's ``passage: `` / ``query: ``; none for MiniLM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from embedding.base import Embeddings
from quarry.services.versions import live_version
from quarry.services.view import View

Kind = Literal["document", "query"]


@dataclass(frozen=True)
class Embedded:
    """Vectors of a batch and the model that made them.

    Attributes:
        embeddings: ``(n, dim) float32`` L2-normalised rows and their truncation flags.
        model_id: The model's friendly name.
    """

    embeddings: Embeddings
    model_id: str


def embed(v: View, name: str, texts: Sequence[str], kind: Kind = "document") -> Embedded:
    """Embed ``texts`` with collection ``name``'s model (blocking: call it off the event loop).

    Raises:
        CollectionNotFound: No such collection in ``v``.
        ModelMismatch: The collection's model cannot be opened.
        EmbeddingUnavailable, EmbeddingError: The model failed.
    """
    live = live_version(v, name)
    embedder, encoder = v.engines.models.model_for(live)
    embeddings = encoder.submit(texts).result() if kind == "query" else embedder.embed(texts)
    return Embedded(embeddings, embedder.model_id)
