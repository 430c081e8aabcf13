"""Result types of an evaluation run and their ``summary.json`` form.

``summary.json`` (the interface of issue 2; extra keys may be added, none removed)::

    {"config": {...},
     "modes": {"<mode>": {"ndcg@10": float, "recall@10": float, "recall@100": float,
                          "mrr@10": float, "latency_ms": {"p50": float, "p95": float},
                          "num_queries": int}},
     "answers": {...}}   # only with ``quarry eval --answers`` (fields: eval/answers.py)
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
    """

    mode: str
    metrics: dict[str, float]
    per_query: dict[str, dict[str, float]]
    latencies_ms: dict[str, float]

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
    """

    config: dict[str, Any]
    modes: dict[str, ModeResult] = field(default_factory=dict)
    answers: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the ``summary.json`` object (see the module docstring)."""
        out: dict[str, Any] = {
            "config": self.config,
            "modes": {name: result.to_dict() for name, result in self.modes.items()},
        }
        if self.answers is not None:
            out["answers"] = self.answers
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
