"""The A/B report of a rollout: the paired test of its shadowed queries, and the HTML page.

:func:`with_paired` adds to a report object of :func:`quarry.services.rollout_report.build` the
paired test of the shadowed queries (each ran on both versions): for each per-query figure the
pairs carry, B = candidate against A = live, with :func:`eval.compare.paired_stats` (the same
randomisation test, t-test, bootstrap interval and wins/losses/ties as ``quarry eval compare``):

- ``latency_ms``: the search's latency (lower is better; a positive delta: the candidate is slower);
- ``hits``: hits returned (a version that finds fewer for the same query shows it);
- ``degraded``: 1 when the answer was degraded (e.g. BM25 alone), else 0 (lower is better);

and the distribution of the pairs' top-10 overlap (one figure per pair: not a paired test).
:func:`render_rollout_html` renders it in the style of ``quarry eval``'s report (``rollout.html.j2``
extends ``base.html.j2``: inline CSS, no script, nothing fetched; it opens offline).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from eval.compare import DEFAULT_RESAMPLES, DEFAULT_SEED, paired_stats
from eval.html import template
from indexing.rollout import percentile

PAIRED = (("latency_ms", "live_ms", "candidate_ms", "lower"), ("hits", "live_hits", "candidate_hits", "higher"),
          ("degraded", "live_degraded", "candidate_degraded", "lower"))
"""(figure, live's key, candidate's key, which way is better) of each paired test."""
BATCH = 500  # resamples at once: at most 1,000 pairs x 500 x 8 bytes = 4 MB per array in a server


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with a NaN or infinite float as ``None`` (JSON has neither)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def _overlap(pairs: list[dict[str, Any]], floor: float) -> dict[str, Any]:
    values = [float(p["overlap"]) for p in pairs]
    if not values:
        return {"n": 0, "mean": None, "p50": None, "min": None, "below_gate": None, "top1_same": None}
    return {"n": len(values), "mean": sum(values) / len(values), "p50": percentile(values, 50), "min": min(values),
            "below_gate": sum(v < floor for v in values) / len(values),
            "top1_same": sum(bool(p["top1_same"]) for p in pairs) / len(pairs)}


def with_paired(
    report: dict[str, Any], *, confidence: float = 0.95, resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
) -> dict[str, Any]:
    """``report`` with ``"paired"`` added (its ``"pairs"`` tested; the module doc lists the figures).

    ``paired``: ``{"a": "live", "b": "candidate", "n", "confidence", "resamples", "seed",
    "rows": [{"metric", "better", "n", "mean_a", "mean_b", "delta", "ci_low", "ci_high", "p_value",
    "p_ttest", "wins", "losses", "ties"}], "latency": {"live_p50_ms", "candidate_p50_ms",
    "live_p95_ms", "candidate_p95_ms"}, "overlap": {"n", "mean", "p50", "min", "below_gate",
    "top1_same"}}``: wins are pairs where the candidate's figure is higher.

    Raises:
        ConfigError: scipy is not installed (the ``eval`` extra) and some pairs differ.
    """
    pairs: list[dict[str, Any]] = list(report.get("pairs") or [])
    rows = []
    for metric, a_key, b_key, better in PAIRED:
        a = [float(p[a_key]) for p in pairs]
        b = [float(p[b_key]) for p in pairs]
        stats = paired_stats(a, b, confidence=confidence, resamples=resamples, seed=seed, batch=BATCH)
        rows.append({"metric": metric, "better": better, **_finite(asdict(stats))})
    live_ms, cand_ms = [float(p["live_ms"]) for p in pairs], [float(p["candidate_ms"]) for p in pairs]
    floor = float((report.get("gates") or {}).get("min_overlap", 0.6))
    paired = {
        "a": "live", "b": "candidate", "n": len(pairs), "confidence": confidence, "resamples": resamples,
        "seed": seed, "rows": rows,
        "latency": {"live_p50_ms": percentile(live_ms, 50), "candidate_p50_ms": percentile(cand_ms, 50),
                    "live_p95_ms": percentile(live_ms, 95), "candidate_p95_ms": percentile(cand_ms, 95)},
        "overlap": _overlap(pairs, floor),
    }
    return {**report, "paired": paired}


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return dt.datetime.fromtimestamp(float(ts), tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_rollout_html(report: dict[str, Any]) -> str:
    """The A/B report page of a report object (with ``"paired"``: :func:`with_paired` is run when absent).

    Raises:
        ConfigError: jinja2 or scipy is not installed (the ``eval`` extra).
    """
    if "paired" not in report:
        report = with_paired(report)
    return str(template("rollout.html.j2").render(
        r=report, when=_when, gates_json=json.dumps(report.get("gates", {}), indent=2, sort_keys=True),
    ))


def write_rollout_report(report: dict[str, Any], path: Path, *, as_json: bool = False) -> Path:
    """Write the report to ``path``: the HTML page, or with ``as_json`` the JSON object (with ``"paired"``).

    Raises:
        ConfigError: jinja2 or scipy is not installed (the ``eval`` extra).
        OSError: ``path`` cannot be written.
    """
    if "paired" not in report:
        report = with_paired(report)
    text = json.dumps(report, indent=2, default=str) + "\n" if as_json else render_rollout_html(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
