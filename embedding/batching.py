"""Dynamic batching in process: concurrent ``embed`` calls share one model call.

The REST API embeds one short query per request; under concurrency those single-text calls
queue behind one another on the model. :class:`BatchingEmbedder` runs one model call at a time
and gives it every text that queued up meanwhile (up to ``max_batch``), then hands each caller
its rows: Triton's ``dynamic_batching`` with a zero queue delay. A lone caller never waits for
company; under load, batches grow by themselves and throughput rises.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from embedding.base import Embedder, Embeddings


@dataclass
class _Request:
    texts: Sequence[str]
    future: Future[Embeddings] = field(default_factory=Future)


class BatchingEmbedder:
    """Wraps an :class:`Embedder`; same contract, batched across threads.

    Args:
        inner: The embedder doing the work.
        max_batch: Largest number of texts in one model call.
    """

    def __init__(self, inner: Embedder, *, max_batch: int = 64) -> None:
        self.inner = inner
        self._max_batch = max_batch
        self._queue: list[_Request] = []
        self._cond = threading.Condition()
        self._worker: threading.Thread | None = None

    @property
    def model_id(self) -> str:
        """The wrapped model's id."""
        return self.inner.model_id

    @property
    def dim(self) -> int:
        """The wrapped model's output dimension."""
        return self.inner.dim

    @property
    def max_seq_length(self) -> int:
        """The wrapped model's token limit."""
        return self.inner.max_seq_length

    def warm_up(self) -> None:
        """Load the wrapped model and start the batching thread."""
        if self._worker is not None:  # fast path: never wait on the model's lock once running
            return
        self.inner.warm_up()
        with self._cond:
            if self._worker is None:
                self._worker = threading.Thread(target=self._run, name="quarry-embed-batcher", daemon=True)
                self._worker.start()

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """Embed ``texts`` as part of a shared batch; see :meth:`Embedder.embed` for shapes/errors."""
        if len(texts) >= self._max_batch:
            return self.inner.embed(texts)
        return self.submit(texts).result()

    def submit(self, texts: Sequence[str]) -> Future[Embeddings]:
        """Queue ``texts`` for the next model call and return at once.

        The caller can do other work (the query path scores BM25) while the model runs.

        Returns:
            A future of the :class:`Embeddings` of ``texts``; ``result()`` raises what the
            model raised (e.g. ``EmbeddingUnavailable``).

        Raises:
            EmbeddingUnavailable: The model could not be loaded or reached at warm-up.
        """
        self.warm_up()
        request = _Request(texts)
        with self._cond:
            self._queue.append(request)
            self._cond.notify()
        return request.future

    def _run(self) -> None:
        while True:
            batch = self._take()
            texts = [t for r in batch for t in r.texts]
            try:
                result = self.inner.embed(texts)
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting caller
                for r in batch:
                    r.future.set_exception(exc)
                continue
            start = 0
            for r in batch:
                end = start + len(r.texts)
                r.future.set_result(Embeddings(result.vectors[start:end], result.truncated[start:end]))
                start = end

    def _take(self) -> list[_Request]:
        with self._cond:
            while not self._queue:
                self._cond.wait()
            batch, size = [], 0
            while self._queue and size + len(self._queue[0].texts) <= self._max_batch:
                request = self._queue.pop(0)
                batch.append(request)
                size += len(request.texts)
            return batch or [self._queue.pop(0)]
