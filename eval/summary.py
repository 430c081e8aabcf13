"""Result types of an evaluation run and their ``summary.json`` form.

``summary.json`` (a stable interface; extra keys may be added, none removed)::

    {"config": {...},
     "modes": {"<mode>": {"ndcg@10": float, "recall@10": float, "recall@100": float,
                          "mrr@10": float, "latency_ms": {"p50": float, "p95": float},
                          "num_queries": int}},
     "answers": {...},       # only with ``quarry eval --answers`` (fields: eval/answers.py)
     "ann_vs_exact": {...}}  # only when the run measured it (fields: eval/ann.py)

The rankings, channel ranks, query texts and qrels a :class:`Summary` also holds are not in
``summary.json``: :mod:`eval.report` writes them to ``queries.json`` for the per-query view.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eval.metrics import METRICS


def percentile_ms(latencies_ms: list[float] | tuple[float, ...], q: float) -> float:
    """Return the ``q``-th percentile of latencies (numpy's linear interpolation), 0.0 if empty.

    Args:
        latencies_ms: Per-query latencies in milliseconds.
        q: Percentile in [0, 100].

    Returns:
        The percentile in milliseconds.
    """
    if not latencies_ms:
        return 0.0
    return float(np.percentile(np.asarray(latencies_ms, dtype=np.float64), q))


@dataclass(frozen=True)
class ModeResult:
    """Scores and timings of one retrieval mode over one split.

    Attributes:
        mode: Mode name as passed to the search callable, e.g. ``"bm25"``.
        metrics: Mean of each metric of :data:`eval.metrics.METRICS`, each in [0, 1].
        per_query: Query id -> {metric -> value}, every judged query of the split.
        latencies_ms: Query id -> wall-clock time of its search call, in milliseconds.
        rankings: Query id -> the document ids returned, best first (empty when not kept).
        channel_ranks: Query id -> {document id -> {channel -> 1-based rank in that channel}},
            from the search's ``explain`` (empty when the search gave none).
    """

    mode: str
    metrics: dict[str, float]
    per_query: dict[str, dict[str, float]]
    latencies_ms: dict[str, float]
    rankings: dict[str, list[str]] = field(default_factory=dict)
    channel_ranks: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)

    @property
    def p50_ms(self) -> float:
        """Median search latency in milliseconds."""
        return percentile_ms(list(self.latencies_ms.values()), 50)

    @property
    def p95_ms(self) -> float:
        """95th-percentile search latency in milliseconds."""
        return percentile_ms(list(self.latencies_ms.values()), 95)

    def to_dict(self) -> dict[str, Any]:
        """Return this mode's entry of ``summary.json["modes"]``."""
        entry: dict[str, Any] = {name: self.metrics[name] for name in METRICS}
        entry["latency_ms"] = {"p50": self.p50_ms, "p95": self.p95_ms}
        entry["num_queries"] = len(self.per_query)
        return entry


@dataclass(frozen=True)
class Summary:
    """Everything one evaluation run produced.

    Attributes:
        config: What was run (dataset, split, top_k, store, model, ...); JSON-serialisable.
        modes: Mode name -> its result, in the order the modes were run.
        answers: The answers section (:mod:`eval.answers`), when ``--answers`` ran.
        ann_vs_exact: Recall of the collection's index against exact search (:mod:`eval.ann`).
        queries: Query id -> text of the judged queries (for the per-query view).
        qrels: Query id -> {document id -> grade} of the split.
    """

    config: dict[str, Any]
    modes: dict[str, ModeResult] = field(default_factory=dict)
    answers: dict[str, Any] | None = None
    ann_vs_exact: dict[str, Any] | None = None
    queries: dict[str, str] = field(default_factory=dict)
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return the ``summary.json`` object (see the module docstring)."""
        out: dict[str, Any] = {
            "config": self.config,
            "modes": {name: result.to_dict() for name, result in self.modes.items()},
        }
        if self.answers is not None:
            out["answers"] = self.answers
        if self.ann_vs_exact is not None:
            out["ann_vs_exact"] = self.ann_vs_exact
        return out


def summary_modes(summary: Summary | Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Return ``{"<mode>": {metric: value, ...}}`` of a :class:`Summary` or a loaded summary.json.

    Args:
        summary: A :class:`Summary`, or the parsed content of a ``summary.json``.

    Returns:
        Mode name -> its ``summary.json`` entry.
    """
    data = summary.to_dict() if isinstance(summary, Summary) else summary
    modes = data.get("modes", {})
    return {str(name): dict(entry) for name, entry in modes.items()}
