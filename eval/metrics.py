"""Ranking metrics of a run against qrels, computed by ``pytrec_eval`` (trec_eval), not by hand.

Measures, with the trec_eval names they come from (trec_eval 9, as used by BEIR: Thakur et al.,
arXiv:2104.08663, ``beir.retrieval.evaluation.EvaluateRetrieval.evaluate``):

=============  ========================  ===================================================
ours           trec_eval measure         meaning
=============  ========================  ===================================================
``ndcg@10``    ``ndcg_cut.10``           nDCG over the top 10, gain = relevance grade,
                                         discount ``1/log2(rank+1)``, ideal from all qrels
``recall@10``  ``recall.10``             relevant retrieved in the top 10 / all relevant
``recall@100`` ``recall.100``            relevant retrieved in the top 100 / all relevant
``mrr@10``     ``recip_rank`` on the     1/rank of the first relevant document if it is in
               run cut to 10             the top 10, else 0 (plain ``recip_rank`` has no cut)
=============  ========================  ===================================================

A document is relevant when its grade is > 0 (trec_eval's default ``relevance_level`` 1).

Ranking convention: a run gives each query its document ids **in ranked order**; the order is
what is scored. The ids are handed to trec_eval with strictly decreasing scores, so trec_eval's
own tie-breaking (by document id on equal scores) can never reorder what the system returned. A
repeated id keeps its first (best) position. Every judged query counts in the mean: a query the
run does not answer scores 0 on every measure (trec_eval would silently drop it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pytrec_eval

METRICS: tuple[str, ...] = ("ndcg@10", "recall@10", "recall@100", "mrr@10")
"""The metric names of Quarry's summaries, in report order."""

_TREC_MEASURES: dict[str, str] = {
    "ndcg@10": "ndcg_cut_10",
    "recall@10": "recall_10",
    "recall@100": "recall_100",
}
MRR_DEPTH = 10

Qrels = Mapping[str, Mapping[str, int]]
"""Query id -> {document id -> relevance grade}."""
Rankings = Mapping[str, Sequence[str]]
"""Query id -> document ids, best first."""


def to_trec_run(rankings: Rankings, depth: int | None = None) -> dict[str, dict[str, float]]:
    """Turn ranked id lists into a trec_eval run whose scores reproduce the given order.

    Args:
        rankings: Query id -> document ids, best first.
        depth: Keep only the first ``depth`` distinct ids per query (``None``: all).

    Returns:
        Query id -> {document id -> score}, the score of rank ``r`` (1-based) being ``n - r + 1``.
    """
    run: dict[str, dict[str, float]] = {}
    for qid, ids in rankings.items():
        distinct = list(dict.fromkeys(ids))
        if depth is not None:
            distinct = distinct[:depth]
        run[qid] = {doc_id: float(len(distinct) - rank) for rank, doc_id in enumerate(distinct)}
    return run


def _trec_eval(
    qrels: Qrels, run: dict[str, dict[str, float]], measures: set[str]
) -> dict[str, dict[str, float]]:
    """Run pytrec_eval on ``run`` for the judged queries; returns its per-query measure dicts."""
    judged = {qid: {doc: int(grade) for doc, grade in docs.items()} for qid, docs in qrels.items()}
    evaluator = pytrec_eval.RelevanceEvaluator(judged, measures)
    result: dict[str, dict[str, float]] = evaluator.evaluate(run)
    return result


def per_query_metrics(qrels: Qrels, rankings: Rankings) -> dict[str, dict[str, float]]:
    """Score every judged query of a run.

    Args:
        qrels: Query id -> {document id -> grade}; defines which queries are scored.
        rankings: Query id -> document ids, best first. Queries absent from ``qrels`` are
            ignored; judged queries absent from ``rankings`` score 0.

    Returns:
        Query id (every key of ``qrels``) -> {metric name of :data:`METRICS` -> value in [0, 1]}.
    """
    run = to_trec_run({qid: rankings.get(qid, ()) for qid in qrels})
    cut = to_trec_run({qid: rankings.get(qid, ()) for qid in qrels}, depth=MRR_DEPTH)
    full = _trec_eval(qrels, run, {"ndcg_cut.10", "recall.10,100"})
    mrr = _trec_eval(qrels, cut, {"recip_rank"})
    scores: dict[str, dict[str, float]] = {}
    for qid in qrels:
        measured = full.get(qid, {})
        row = {name: float(measured.get(trec, 0.0)) for name, trec in _TREC_MEASURES.items()}
        row["mrr@10"] = float(mrr.get(qid, {}).get("recip_rank", 0.0))
        scores[qid] = {name: row[name] for name in METRICS}
    return scores


def mean_metrics(per_query: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Average per-query metrics over all queries (arithmetic mean, as trec_eval's ``all``).

    Args:
        per_query: Output of :func:`per_query_metrics`.

    Returns:
        Metric name -> mean over the queries; every metric is 0.0 when there are no queries.
    """
    n = len(per_query)
    return {
        name: (math.fsum(row[name] for row in per_query.values()) / n if n else 0.0)
        for name in METRICS
    }


def evaluate_rankings(qrels: Qrels, rankings: Rankings) -> dict[str, float]:
    """Mean :data:`METRICS` of a run: :func:`mean_metrics` of :func:`per_query_metrics`.

    Args:
        qrels: Query id -> {document id -> grade}.
        rankings: Query id -> document ids, best first.

    Returns:
        Metric name -> mean value in [0, 1].
    """
    return mean_metrics(per_query_metrics(qrels, rankings))
