"""A sampled search and its measurement against exact search (the monitor's and the reindex check's).

:func:`exact_recalls` re-runs a group of samples of one store collection and filter with one
:meth:`~stores.base.VectorStore.search_exact` and one ``get`` of the ANN's ids, and scores each
with the tie-aware recall@k of :func:`monitoring.recall.recall_at_k`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from monitoring.recall import DEFAULT_TOL, Bucket, recall_at_k
from stores.base import FloatMatrix, Metric, VectorStore
from stores.filters import Filter


@dataclass(frozen=True)
class Sample:
    """One search to measure.

    Attributes:
        collection: The collection (or alias) searched.
        metric: Its metric (to score the ANN's ids exactly).
        vector: The query vector, ``(dim,) float32``.
        flt: The search's filter.
        k: Recall cut-off: the search's ``top_k``.
        ids: The ANN answer's first ``k`` ids, best first (searched at the live depth).
        physical: The store collection the ANN searched (a version's, ``indexing.versions``);
            ``None``: ``collection`` itself. The exact re-run reads that one, so it measures the
            index that answered, with vectors of the query's own model, and the figures are
            kept under it (a swap starts fresh ones).
    """

    collection: str
    metric: Metric
    vector: npt.NDArray[np.float32]
    flt: Filter | None
    k: int
    ids: tuple[str, ...]
    physical: str | None = None

    @property
    def store_name(self) -> str:
        """The store collection to re-run it on."""
        return self.physical or self.collection


@dataclass(frozen=True)
class Measurement:
    """A sample's outcome: recall@k, its selectivity bucket and the rows the filter matched."""

    collection: str
    bucket: Bucket
    recall: float
    matching: int | None
    total: int


def exact_recalls(store: VectorStore, samples: Sequence[Sample], tolerance: float) -> list[float]:
    """Tie-aware recall@k of samples of one store collection and filter against its exact answers.

    One :meth:`~stores.base.VectorStore.search_exact` for all (at the largest ``k``) and one
    ``get`` of the ANN's ids (their true scores, for ties); the reindex's check uses it too.

    Args:
        store: The vector store.
        samples: Searches of ``samples[0].store_name`` with ``samples[0].flt``, each with its ANN ids.
        tolerance: Score tolerance of a tie (``MonitorSettings.tolerance``).

    Returns:
        Recall@k per sample, in ``[0, 1]``.

    Raises:
        QuarryError: The store failed.
    """
    if not samples:
        return []
    first = samples[0]
    name = first.store_name
    queries = np.stack([np.asarray(s.vector, dtype=np.float32) for s in samples])
    exact = store.search_exact(name, queries, max(s.k for s in samples), first.flt)
    wanted = list(dict.fromkeys(i for s in samples for i in s.ids))
    found = {r.id: r.vector for r in store.get(name, wanted)} if wanted else {}
    out = []
    for sample, query, answer in zip(samples, queries, exact, strict=True):
        true = [_score(sample.metric, query, found[i]) if i in found else float("-inf") for i in sample.ids]
        out.append(recall_at_k(list(sample.ids), true, [h.id for h in answer], [h.score for h in answer], sample.k,
                               tolerance))
    return out


def filter_key(flt: Filter | None) -> Hashable:
    """A filter as a dictionary key (filters are frozen dataclasses; ``repr`` for one holding a list)."""
    try:
        hash(flt)
    except TypeError:
        return repr(flt)
    return flt


def groups(samples: Sequence[Sample]) -> Iterable[list[int]]:
    """Indexes of ``samples`` grouped by store collection, filter and metric (one exact search each)."""
    groups: dict[tuple[str, Hashable, str], list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault((s.store_name, filter_key(s.flt), s.metric), []).append(i)
    return groups.values()


def _score(metric: Metric, query: npt.NDArray[np.float32], vector: npt.NDArray[np.float32]) -> float:
    """A stored vector's score as the stores give it: inner product, or ``-`` Euclidean distance."""
    if metric == "l2":
        return -float(np.linalg.norm(query - vector))
    return float(np.dot(query, vector))


def sampled_recall(  # noqa: PLR0913 - the collection, its ids and the search's shape
    store: VectorStore, name: str, physical: str, metric: Metric, ids: Sequence[str], *, sample: int, depth: int,
    k: int = 10,
) -> float:
    """Tie-aware recall@k of ``physical``'s ANN index over a seeded sample of its own vectors as queries.

    ``sample`` of ``ids`` (seed 0) are read back, each searched as a live search is (the ANN asked
    for ``depth`` candidates, the first ``k`` kept) and compared with the store's exact answer
    (:func:`exact_recalls`).

    Returns:
        Mean recall over the sample, in ``[0, 1]`` (1.0 when there is nothing to sample).

    Raises:
        StoreError: The store failed.
    """
    if not ids:
        return 1.0
    rng = np.random.default_rng(0)
    picked = rng.choice(len(ids), size=min(sample, len(ids)), replace=False)
    records = store.get(physical, [ids[i] for i in sorted(picked.tolist())])
    if not records:
        return 1.0
    queries: FloatMatrix = np.stack([r.vector for r in records]).astype(np.float32)
    found = store.search(physical, queries, depth, with_payload=False)
    samples = [Sample(name, metric, q, None, k, tuple(h.id for h in hits[:k]), physical)
               for q, hits in zip(queries, found, strict=True)]
    return float(np.mean(exact_recalls(store, samples, DEFAULT_TOL)))
