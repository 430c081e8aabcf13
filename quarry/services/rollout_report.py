"""The A/B report of a collection's rollout: live vs candidate side by side, as one JSON object.

:func:`build` is pure: from a :class:`~quarry.services.rollout.Snapshot` (the rollout's record
and decisions, this process's figures of the current step, the shadowed pairs) it makes the
object that ``GET /v1/collections/{name}/rollout/report?format=json`` answers and that
:mod:`eval.rollout_report` renders as HTML, after adding the paired test of the shadowed queries
(:func:`eval.compare.paired_stats`: the statistics live above this layer). :func:`report` reads
the snapshot of a collection and builds it.

The object (units in the names; a figure without data is ``null``)::

    {"collection", "generated_at",                      # unix seconds
     "rollout": {"state", "candidate", "baseline", "percent", "step", "schedule", "step_samples",
                 "shadow_rate", "auto", "started_at", "updated_at", "step_started_at"},
     "gates": {bound: value},                           # indexing.rollout.Gates, as evaluated
     "window": {"since", "measured"},                   # the current step; measured: this process served some
     "versions": {"live": V, "candidate": V},           # V: {"version", "queries", "errors", "error_rate",
                                                        #     "degraded_rate", "p50_ms", "p95_ms", "p99_ms",
                                                        #     "recall", "recall_samples", "rated", "raters",
                                                        #     "down_rate", "clicked", "click_queries", "click_rate"}
     "overlap": {"mean", "samples"},                    # top-10 overlap of the step's shadowed queries
     "shadow": {"run", "skipped", "pairs"},
     "pairs": [{"step", "served_by", "live_ms", "candidate_ms", "live_hits", "candidate_hits",
                "live_degraded", "candidate_degraded", "overlap", "top1_same"}],   # oldest first
     "decisions": [...],                                # the record's, each with its gate figures
     "notes": [str]}

Figures are per process, as the gates' are: with several replicas, each reports what it served.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from indexing.rollout import Figures, Gates, percentile
from quarry.services.rollout import Pair, Snapshot, snapshot
from quarry.services.view import View


def _version(number: int, figures: Figures | None) -> dict[str, Any]:
    out: dict[str, Any] = {"version": number}
    if figures is None:
        return out | dict.fromkeys(("queries", "errors", "error_rate", "degraded_rate", "p50_ms", "p95_ms", "p99_ms",
                                    "recall", "recall_samples", "rated", "raters", "down_rate", "clicked",
                                    "click_queries", "click_rate"))
    summary = figures.summary()
    return out | {
        "queries": figures.queries, "errors": figures.errors, "error_rate": summary["error_rate"],
        "degraded_rate": summary["degraded_rate"], "p50_ms": percentile(figures.latencies_ms, 50),
        "p95_ms": summary["p95_ms"], "p99_ms": summary["p99_ms"], "recall": summary["recall"],
        "recall_samples": summary["recall_samples"], "rated": summary["rated"], "raters": summary["raters"],
        "down_rate": summary["down_rate"], "clicked": summary["clicked"], "click_queries": summary["click_queries"],
        "click_rate": summary["click_rate"],
    }


def _pair(pair: Pair) -> dict[str, Any]:
    out = asdict(pair)
    del out["candidate"]
    out["served_by"] = "candidate" if out.pop("served_by_candidate") else "live"
    return out


def _notes(snap: Snapshot) -> list[str]:
    r = snap.rollout
    notes = ["Figures are this process's (each replica counts the queries it served); the decisions keep the "
             "figures each gate evaluation read."]
    if snap.live is None:
        notes.append("This process served no query of the current step (a CLI process, or another replica "
                      "served them): the side-by-side figures are empty.")
    if not snap.pairs:
        notes.append("No shadowed query yet" + (" (shadow_rate is 0: none is shadowed)" if r.shadow_rate == 0 else "")
                     + ": the paired test needs shadowed queries.")
    else:
        notes.append("A shadowed query ran on the serving version in the request and on the other one in the "
                     "background (one thread, after it): its latency pairs the same query, not the same moment.")
    if not r.active:
        notes.append(f"The rollout is {r.state}: these are its figures up to then.")
    return notes


def build(snap: Snapshot, now: float) -> dict[str, Any]:
    """The A/B report object of ``snap`` (the module doc draws it), ``generated_at`` ``now`` (unix seconds)."""
    r = snap.rollout
    overlaps = [] if snap.candidate is None else snap.candidate.overlap
    return {
        "collection": r.collection,
        "generated_at": now,
        "rollout": {"state": r.state, "candidate": r.candidate, "baseline": r.baseline, "percent": r.percent,
                    "step": r.step, "schedule": list(r.schedule), "step_samples": r.step_samples,
                    "shadow_rate": r.shadow_rate, "auto": r.auto, "started_at": r.started_at,
                    "updated_at": r.updated_at, "step_started_at": r.step_started_at},
        "gates": asdict(Gates.from_json(r.gates)),
        "window": {"since": r.step_started_at, "measured": snap.live is not None},
        "versions": {"live": _version(r.baseline, snap.live), "candidate": _version(r.candidate, snap.candidate)},
        "overlap": {"mean": sum(overlaps) / len(overlaps) if overlaps else None, "samples": len(overlaps)},
        "shadow": {"run": snap.shadow_run, "skipped": snap.shadow_skipped, "pairs": len(snap.pairs)},
        "pairs": [_pair(p) for p in snap.pairs],
        "decisions": [dict(d) for d in r.decisions],
        "notes": _notes(snap),
    }


def report(v: View, name: str) -> dict[str, Any]:
    """The A/B report of ``name``'s newest rollout, from this process's figures.

    Raises:
        CollectionNotFound: No such collection.
        NotFound: It never had a rollout.
    """
    return build(snapshot(v, name), time.time())
