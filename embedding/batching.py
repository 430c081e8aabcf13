"""Dynamic batching in process: concurrent ``embed`` calls share one model call.

The REST API embeds one short query per request; under concurrency those single-text calls
queue behind one another on the model. :class:`BatchingEmbedder` runs one model call at a time
and gives it every text that queued up meanwhile (up to ``max_batch``), then hands each caller
its rows: Triton's ``dynamic_batching`` with a zero queue delay. A lone caller never waits for
company; under load, batches grow by themselves and throughput rises.

Like Triton's ``instance_group`` count, ``workers`` model calls may run at once. The default is
the wrapped backend's ``parallel_calls`` hint (1 when it has none): torch on CPU runs one call
per core (a call alone uses every core, beside another it takes one: 84-89 vs 72-78 req/s over
REST at 32 clients here), while ONNX Runtime parallelises inside one call and does best with one
worker (136 vs 125 req/s).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from embedding.base import Embedder, EmbedderWrapper, Embeddings
from quarry.microbatch import MicroBatcher


class BatchingEmbedder(EmbedderWrapper):
    """Wraps an :class:`Embedder` for queries: concurrent query calls share one ``embed_queries`` call.

    :meth:`embed_queries` and :meth:`submit` are batched across threads; :meth:`embed` (documents)
    goes straight to the wrapped model.

    Args:
        inner: The embedder doing the work.
        max_batch: Largest number of texts in one model call.
        workers: Model calls that may run at once (default: ``inner.parallel_calls`` after
            its warm-up, else 1).
    """

    def __init__(self, inner: Embedder, *, max_batch: int = 64, workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        super().__init__(inner)
        self._max_batch = max_batch
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._batcher: MicroBatcher[Sequence[str], Embeddings] = MicroBatcher(
            self._embed_batch, max_batch=max_batch, weight=len, name="quarry-embed-batcher"
        )

    @property
    def workers(self) -> int:
        """Model calls that may run at once (valid after :meth:`warm_up`)."""
        return self._workers or int(getattr(self.inner, "parallel_calls", 1))

    def warm_up(self) -> None:
        """Load the wrapped model and start the batching threads."""
        if self._batcher.started:  # fast path: never wait on the model's lock once running
            return
        self.inner.warm_up()
        self._batcher.start(self.workers)

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """Embed document ``texts`` with the wrapped model (not batched); see :meth:`Embedder.embed`."""
        return self.inner.embed(texts)

    def embed_queries(self, texts: Sequence[str]) -> Embeddings:
        """Embed queries as part of a shared batch; see :meth:`Embedder.embed_queries` for shapes/errors."""
        if len(texts) >= self._max_batch:
            return self.inner.embed_queries(texts)
        return self.submit(texts).result()

    def submit(self, texts: Sequence[str]) -> Future[Embeddings]:
        """Queue query ``texts`` for the next model call and return at once, never blocking.

        The caller can do other work (the query path scores BM25, or serves other requests on
        an event loop) while the model runs. Before the model is warm, the warm-up (loading, or
        reaching a Triton server with retries) runs on a warm-up thread, not the caller's.

        Returns:
            A future of the :class:`Embeddings` of ``texts``; ``result()`` raises what the
            model raised, e.g. ``EmbeddingUnavailable`` when it could not be loaded or reached.
        """
        if self._batcher.started:
            return self._batcher.submit(texts)
        return self._warm_up_pool().submit(lambda: self._batcher_after_warm_up().submit(texts).result())

    def _batcher_after_warm_up(self) -> MicroBatcher[Sequence[str], Embeddings]:
        self.warm_up()
        return self._batcher

    def _warm_up_pool(self) -> ThreadPoolExecutor:
        """One thread that warms up for callers that must not block (created once, on demand)."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quarry-embed-warm-up")
            return self._pool

    def _embed_batch(self, requests: list[Sequence[str]]) -> list[Embeddings]:
        """One model call over every request's texts, split back into per-request rows."""
        result = self.inner.embed_queries([t for texts in requests for t in texts])
        rows, start = [], 0
        for texts in requests:
            end = start + len(texts)
            rows.append(Embeddings(result.vectors[start:end], result.truncated[start:end]))
            start = end
        return rows
