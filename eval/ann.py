"""ANN vs exact: how much of the exact nearest neighbours the collection's vector index returns.

For the eval queries, the collection's store is searched as the dense channel searches it (its
index and query-time parameters, no filter) and the answer is compared with **exact search done
here**: a brute-force scan of every stored vector in numpy (the store's vectors read back with
``VectorStore.get``; the stores' own exact modes differ per engine, so one scan serves them all).
Both rank the chunks the store holds, so the figure is the index's recall alone, whatever the
fusion or grouping above it does.

Recall@k is tie-aware (ann-benchmarks' convention): a returned chunk counts when its exact
similarity is at least the k-th best exact similarity minus :data:`TIE_EPSILON`, so a different
pick among equally near chunks is not a miss; each query's recall is ``min(k, counted) / k``, and
the figure is the mean over the queries. Scores: cosine on L2-normalised vectors (the stores'
``cosine``), inner product for ``ip``, negated Euclidean distance for ``l2``.

A collection over ``max_vectors`` vectors is not scanned (memory: ``n × dim × 4`` bytes); the section
then says so instead of giving a number.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from stores.base import FloatMatrix, Metric, VectorStore

if TYPE_CHECKING:
    from eval.beir import BeirSplit
    from quarry.service import Quarry

TIE_EPSILON = 1e-5
DEFAULT_KS = (10, 100)
DEFAULT_MAX_VECTORS = 1_000_000
_READ_BATCH = 1000
_WORST_SHOWN = 10
EXACT_METHOD = "numpy brute force over every stored vector (read back from the store)"


def read_vectors(store: VectorStore, name: str, ids: Sequence[str]) -> tuple[list[str], FloatMatrix]:
    """Every vector of ``ids`` the store holds, read in batches of 1,000.

    Returns:
        ``(ids found, (n, dim) float32)``, in the order of ``ids``.
    """
    found: list[str] = []
    rows: list[npt.NDArray[np.float32]] = []
    for start in range(0, len(ids), _READ_BATCH):
        for record in store.get(name, ids[start : start + _READ_BATCH]):
            found.append(record.id)
            rows.append(np.asarray(record.vector, dtype=np.float32))
    dim = rows[0].shape[0] if rows else 0
    return found, np.vstack(rows) if rows else np.zeros((0, dim), dtype=np.float32)


def similarities(base: FloatMatrix, queries: FloatMatrix, metric: Metric) -> npt.NDArray[np.float64]:
    """``(q, n)`` higher-is-better scores of every stored vector for every query, as the stores score them."""
    b = base.astype(np.float64)
    q = queries.astype(np.float64)
    if metric == "l2":
        sq = (q**2).sum(axis=1)[:, None] + (b**2).sum(axis=1)[None, :] - 2.0 * q @ b.T
        return np.asarray(-np.sqrt(np.maximum(sq, 0.0)))
    if metric == "cosine":
        b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
        q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    return np.asarray(q @ b.T)


def tie_aware_recall(found: Sequence[str], scores: dict[str, float], kth_best: float, k: int) -> float:
    """Share of the true top-``k`` a search returned, counting near-ties as found.

    Args:
        found: The ids the index returned (its top ``k``).
        scores: Exact score of every stored id for this query.
        kth_best: The ``k``-th best exact score.
        k: Cut-off.

    Returns:
        ``min(k, #found with score >= kth_best - TIE_EPSILON) / k``.
    """
    counted = sum(1 for i in found[:k] if scores.get(i, -np.inf) >= kth_best - TIE_EPSILON)
    return min(k, counted) / k


def ann_vs_exact(
    store: VectorStore,
    name: str,
    chunk_ids: Sequence[str],
    query_ids: Sequence[str],
    query_vectors: FloatMatrix,
    metric: Metric,
    ks: Sequence[int] = DEFAULT_KS,
    *,
    max_vectors: int = DEFAULT_MAX_VECTORS,
) -> dict[str, Any]:
    """Recall@k of the store's index against exact search, for each ``k`` of ``ks``.

    Args:
        store: The vector store.
        name: The collection.
        chunk_ids: Every chunk id of the collection (the vectors to scan).
        query_ids: Ids of the queries, for the worst-queries list.
        query_vectors: ``(q, dim) float32`` query vectors, as the dense channel embeds them.
        metric: The collection's similarity.
        ks: Cut-offs; each is capped at the number of stored vectors.
        max_vectors: Largest collection scanned.

    Returns:
        ``{"exact": method, "index": spec or None, "vectors": n, "queries": q,
        "recall": {"<k>": mean}, "ms_per_query": {"index": ms, "exact": ms},
        "worst": [{"qid", "k", "recall"}]}`` (recall at the largest k, below 1 only), or ``{"skipped": reason, ...}``.

    Raises:
        StoreError: The store failed (its own errors, unwrapped).
    """
    spec = store.describe_index(name)
    index = None if spec is None else {"kind": spec.kind, "params": spec.params, "search_params": spec.search_params}
    facts: dict[str, Any] = {"exact": EXACT_METHOD, "index": index, "metric": metric, "queries": len(query_ids)}
    if len(chunk_ids) > max_vectors:
        return {**facts, "vectors": len(chunk_ids), "skipped": f"{len(chunk_ids):,} vectors > {max_vectors:,}"}
    ids, base = read_vectors(store, name, chunk_ids)
    if not ids or not len(query_ids):
        return {**facts, "vectors": len(ids), "skipped": "no stored vectors or no queries"}
    cuts = sorted({min(k, len(ids)) for k in ks})
    started = time.perf_counter()
    answers = store.search(name, query_vectors, cuts[-1], with_payload=False)
    index_ms = (time.perf_counter() - started) * 1000 / len(query_ids)
    started = time.perf_counter()
    sims = similarities(base, query_vectors, metric)
    exact_ms = (time.perf_counter() - started) * 1000 / len(query_ids)
    ordered = np.sort(sims, axis=1)[:, ::-1]
    per_query: dict[int, list[float]] = {k: [] for k in cuts}
    for row, hits in enumerate(answers):
        scores = dict(zip(ids, sims[row].tolist(), strict=True))
        found = [h.id for h in hits]
        for k in cuts:
            per_query[k].append(tie_aware_recall(found, scores, float(ordered[row, k - 1]), k))
    top = cuts[-1]
    worst = sorted(zip(query_ids, per_query[top], strict=True), key=lambda item: (item[1], item[0]))[:_WORST_SHOWN]
    return {
        **facts,
        "vectors": len(ids),
        "recall": {str(k): float(np.mean(per_query[k])) for k in cuts},
        "ms_per_query": {"index": index_ms, "exact": exact_ms},
        "worst": [{"qid": q, "k": top, "recall": r} for q, r in worst if r < 1.0],
    }


def collection_ann(quarry: Quarry, name: str, ks: Sequence[int] = DEFAULT_KS) -> Callable[[BeirSplit], dict[str, Any]]:
    """The ``ann`` callback of :func:`eval.runner.evaluate` for one collection of a service.

    The split's non-blank queries are embedded as queries by the service's embedder; the chunk ids come from
    the docstore.
    """

    def run(split: BeirSplit) -> dict[str, Any]:
        cfg = quarry.get_collection(name)
        qids = [q for q, text in split.queries.items() if text.strip()]
        vectors = quarry.embedder.embed_queries([split.queries[q] for q in qids]).vectors if qids else None
        chunk_ids = quarry.docstore.bm25_chunk_ids(name)[1]
        if vectors is None:
            return {"exact": EXACT_METHOD, "skipped": "no non-blank queries"}
        return ann_vs_exact(quarry.store, name, chunk_ids, qids, vectors, cfg.metric, ks)

    return run
