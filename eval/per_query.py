"""The per-query view of a run: each query's metric per mode, what it retrieved, where its relevant documents rank.

Built from a :class:`eval.summary.Summary` (rankings, channel ranks, query texts, qrels) and written
by :mod:`eval.report` as ``queries.json`` and the per-query sections of ``report.html``:

- every query: its text, its metric per mode, the top ``shown`` ids of each mode, and each relevant
  document with its rank in each mode (``None``: not in that mode's top ``top_k``) and its rank in
  each channel (``bm25``/``dense``: the search's ``explain``, preferring the hybrid mode's, which
  fetches each channel deeper than a page);
- the worst queries of a mode (lowest metric, then query id);
- the queries where ``hybrid`` scored below a single channel (``bm25`` or ``dense``), largest loss first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from eval.summary import Summary

PRIMARY_METRIC = "ndcg@10"
HYBRID = "hybrid"
SINGLE_CHANNELS = ("bm25", "dense")
SHOWN_IDS = 10


@dataclass(frozen=True)
class RelevantDoc:
    """A judged-relevant document of a query.

    Attributes:
        doc_id: Document id.
        grade: Relevance grade (> 0).
        ranks: Mode -> its 1-based rank in that mode's ranking, None when not retrieved.
        channels: Channel -> its 1-based rank in that channel (only channels that found it).
    """

    doc_id: str
    grade: int
    ranks: dict[str, int | None]
    channels: dict[str, int]


@dataclass(frozen=True)
class QueryRow:
    """One query of the per-query view.

    Attributes:
        qid: Query id.
        text: Query text.
        scores: Mode -> the metric's value for this query.
        retrieved: Mode -> its first ``SHOWN_IDS`` document ids.
        relevant: The relevant documents, best graded first, then by id.
    """

    qid: str
    text: str
    scores: dict[str, float]
    retrieved: dict[str, list[str]]
    relevant: list[RelevantDoc]

    def loss(self) -> tuple[str, float] | None:
        """The single channel that beat ``hybrid`` on this query and by how much, or None."""
        if HYBRID not in self.scores:
            return None
        rivals = [(self.scores[m], m) for m in SINGLE_CHANNELS if m in self.scores]
        if not rivals:
            return None
        best, mode = max(rivals)
        gap = best - self.scores[HYBRID]
        return (mode, gap) if gap > 0 else None


def _channel_ranks(summary: Summary, qid: str, doc_id: str) -> dict[str, int]:
    merged: dict[str, int] = {}
    order = [m for m in summary.modes if m != HYBRID] + ([HYBRID] if HYBRID in summary.modes else [])
    for mode in order:  # the hybrid mode's ranks last: they win
        merged.update(summary.modes[mode].channel_ranks.get(qid, {}).get(doc_id, {}))
    return merged


def query_rows(summary: Summary, metric: str = PRIMARY_METRIC) -> list[QueryRow]:
    """The per-query view of every judged query, in split order.

    Args:
        summary: A run made by :func:`eval.runner.run_modes` (it keeps the rankings).
        metric: The metric shown per mode.

    Returns:
        One row per query of ``summary.qrels``.
    """
    rows = []
    for qid, judged in summary.qrels.items():
        positions = {
            mode: {doc: rank for rank, doc in enumerate(r.rankings.get(qid, []), start=1)}
            for mode, r in summary.modes.items()
        }
        relevant = [
            RelevantDoc(
                doc,
                grade,
                {mode: positions[mode].get(doc) for mode in summary.modes},
                _channel_ranks(summary, qid, doc),
            )
            for doc, grade in sorted(judged.items(), key=lambda item: (-item[1], item[0]))
            if grade > 0
        ]
        rows.append(
            QueryRow(
                qid,
                summary.queries.get(qid, ""),
                {mode: r.per_query.get(qid, {}).get(metric, 0.0) for mode, r in summary.modes.items()},
                {mode: r.rankings.get(qid, [])[:SHOWN_IDS] for mode, r in summary.modes.items()},
                relevant,
            )
        )
    return rows


def worst_queries(rows: list[QueryRow], mode: str, n: int = 20) -> list[QueryRow]:
    """The ``n`` queries with the lowest metric in ``mode`` (ties by query id); [] if no such mode."""
    scored = [row for row in rows if mode in row.scores]
    return sorted(scored, key=lambda row: (row.scores[mode], row.qid))[:n]


def hybrid_losses(rows: list[QueryRow]) -> list[tuple[QueryRow, str, float]]:
    """Queries where hybrid scored below a single channel: ``(row, best channel, gap)``, largest gap first."""
    losses = []
    for row in rows:
        lost = row.loss()
        if lost is not None:
            losses.append((row, *lost))
    return sorted(losses, key=lambda item: (-item[2], item[0].qid))


def worst_mode(summary: Summary) -> str:
    """The mode the worst-queries list is about: ``hybrid`` when run, else the first mode."""
    return HYBRID if HYBRID in summary.modes else next(iter(summary.modes), "")


def per_query_view(summary: Summary, metric: str = PRIMARY_METRIC, n: int = 20) -> dict[str, Any]:
    """The ``queries.json`` object.

    Returns:
        ``{"metric", "worst_mode", "worst": [qid], "hybrid_losses": [{"qid", "channel", "gap"}],
        "queries": [row as dict]}``.
    """
    rows = query_rows(summary, metric)
    mode = worst_mode(summary)
    return {
        "metric": metric,
        "worst_mode": mode,
        "worst": [row.qid for row in worst_queries(rows, mode, n)],
        "hybrid_losses": [{"qid": r.qid, "channel": c, "gap": g} for r, c, g in hybrid_losses(rows)],
        "queries": [asdict(row) for row in rows],
    }
