"""The on-demand recall check (``quarry recall NAME --queries N``): the monitor's comparison, now.

It measures what serves: the live version's store collection (after a reindex, not the
collection's first one), searched as the live dense channel searches it (the ANN at the
searcher's depth, the first ``top_k`` kept), against the exact answer of the same store
collection (:meth:`monitoring.monitor.RecallMonitor.measure_many` without recording: one exact
search for every query without a filter).

Queries come from the collection's recorded recent searches (:mod:`monitoring.recent`) when
there are any of the live version's dimension, else from its own chunks: ``N`` chunk texts
drawn at random (seeded), embedded with the live version's model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from monitoring.exact import Measurement, Sample
from monitoring.recall import BUCKETS
from monitoring.recent import RecordedQuery
from quarry.errors import InvalidRequest

if TYPE_CHECKING:
    from embedding.base import Embedder
    from indexing.collections import CollectionConfig
    from indexing.docstore import CollectionVersion, StateStore
    from monitoring.monitor import RecallMonitor
    from stores.base import VectorStore

CHUNK_TOP_K = 10


@dataclass(frozen=True)
class BucketFigures:
    """One selectivity bucket's figures: samples, mean, 10th percentile and minimum recall@k."""

    bucket: str
    samples: int
    mean_recall: float
    p10_recall: float
    min_recall: float


@dataclass(frozen=True)
class RecallCheck:
    """An on-demand check's outcome: the version measured, where the queries came from, per-bucket figures.

    Attributes:
        version: The live version measured; ``physical`` its store collection.
        depth: Candidates the ANN was asked for (the searcher's depth).
    """

    collection: str
    source: Literal["recent", "chunks"]
    queries: int
    buckets: list[BucketFigures]
    measurements: list[Measurement]
    version: int = 1
    physical: str = ""
    depth: int = 0


def check_recall(  # noqa: PLR0913 - what is measured, and the parts that measure it
    monitor: RecallMonitor, store: VectorStore, docstore: StateStore, cfg: CollectionConfig,
    live: CollectionVersion, model: Embedder, n_queries: int, *, depth: int, seed: int = 0,
) -> RecallCheck:
    """Measure recall@k of ``n_queries`` queries on ``live`` (collection ``cfg.name``'s live version) now.

    Args:
        monitor: The monitor whose exact search and recent queries are used (nothing is recorded).
        store: The vector store holding ``live.physical_name``.
        docstore: The state of record (the chunks queries are drawn from).
        cfg: The collection's configuration (its name and metric).
        live: Its live version (what is measured).
        model: ``live``'s embedding model (for queries drawn from chunks).
        n_queries: How many queries (recent searches first, else chunk texts).
        depth: Candidates the ANN is asked for, as the live dense channel asks (the searcher's depth).
        seed: Seeds the draw of chunks.

    Raises:
        InvalidRequest: ``n_queries < 1``.
        StoreError, EmbeddingError: The store or the model failed.
    """
    if n_queries < 1:
        raise InvalidRequest(f"queries must be >= 1, got {n_queries}")
    name = cfg.name
    recorded = monitor.recent.latest(name, n_queries) if monitor.recent is not None else []
    queries = [q for q in recorded if live.dim in (0, q.vector.shape[0])]  # another model's vectors: not these
    source: Literal["recent", "chunks"] = "recent"
    if not queries:
        source = "chunks"
        queries = _chunk_queries(docstore, model, name, n_queries, seed)
    samples = []
    for q in queries:
        found = store.search(live.physical_name, q.vector[None, :], max(depth, q.top_k), q.flt,
                                    with_payload=False)[0]
        ids = tuple(h.id for h in found[: q.top_k])
        samples.append(Sample(name, cfg.metric, q.vector, q.flt, q.top_k, ids, live.physical_name))
    measured = []
    for outcome in monitor.measure_many(samples, record=False):
        if isinstance(outcome, Exception):
            raise outcome
        measured.append(outcome)
    return RecallCheck(name, source, len(queries), _figures(measured), measured, live.version, live.physical_name,
                       depth)


def _chunk_queries(docstore: StateStore, model: Embedder, name: str, n: int, seed: int) -> list[RecordedQuery]:
    _, chunk_ids = docstore.bm25_chunk_ids(name)
    picked = random.Random(seed).sample(chunk_ids, min(n, len(chunk_ids)))
    chunks = docstore.get_chunks(name, picked)
    texts = [chunks[c].text for c in picked if c in chunks]
    if not texts:
        return []
    model.warm_up()
    vectors = model.embed(texts).vectors
    return [RecordedQuery(np.asarray(v, dtype=np.float32), None, CHUNK_TOP_K) for v in vectors]


def _figures(measured: list[Measurement]) -> list[BucketFigures]:
    out = []
    for bucket in BUCKETS:
        values = [m.recall for m in measured if m.bucket == bucket]
        if values:
            out.append(
                BucketFigures(
                    bucket, len(values), float(np.mean(values)), float(np.percentile(values, 10)), min(values)
                )
            )
    return out
