"""Fit the hybrid fusion on a tuning split: each channel is retrieved once, fused in memory per grid point.

Fusion is a pure function of the channels' ranked ``(id, score)`` lists
(:func:`retrieval.fusion.fuse`), so tuning retrieves each judged query's BM25 and dense
candidates once (:func:`channel_runs`, ``max(candidates)`` deep) and scores every grid point
(method × weights × normalisation or ``k`` × candidates per channel) from those lists with
``pytrec_eval``: after the two channels' runs, SciFact train's 809 queries take 1–3 s per point
on a loaded 2-core machine (the 66-point default grid: 434 s there; most of it pure-Python fusion).

Only a split other than the reported one may be tuned on (SciFact ``train``, CMRC2018 ``dev``);
:func:`tune` refuses the split named ``test``. The chosen setting is written as JSON
(:func:`write_setting`): ``fusion`` is what a collection's ``fusion`` default takes (the
create-collection body), a search body's ``fusion`` and ``quarry eval --fusion FILE``;
``candidates`` is the per-channel depth that won (``QUARRY_SEARCH__CANDIDATES``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.metrics import mean_metrics, per_query_metrics
from eval.runner import SearchFn
from quarry.errors import InvalidRequest
from retrieval.fusion import NORMALIZATIONS, Fusion, fuse

ChannelRuns = dict[str, dict[str, list[tuple[str, float]]]]
"""Channel (``bm25``, ``dense``) -> query id -> ``(document id, score)`` best first."""

CHANNELS = ("bm25", "dense")
DEFAULT = Fusion("rrf", 60, {"bm25": 1.0, "dense": 1.0})
"""Quarry's default hybrid fusion (``QUARRY_SEARCH__RRF_K``/``*_WEIGHT`` defaults)."""


@dataclass(frozen=True)
class Point:
    """One grid point: a fusion setting and the candidates taken from each channel."""

    fusion: Fusion
    candidates: int

    def describe(self) -> dict[str, Any]:
        """The point as JSON."""
        return {"fusion": self.fusion.describe(), "candidates": self.candidates}


@dataclass(frozen=True)
class Scored:
    """A grid point and its mean metrics on one split."""

    point: Point
    metrics: dict[str, float]


def default_grid(candidates: Sequence[int] = (100, 200, 300)) -> list[Point]:
    """The small grid ``quarry eval --tune`` searches: 27 fusion settings per candidates value.

    The default RRF; RRF with ``k`` in {20, 60} × dense weight in {0.4, 0.5, 0.6}; weighted with
    each normalisation × dense weight in {0.3, …, 0.7}, BM25 weight ``1 - w`` throughout.
    (On SciFact train a wider grid, ``k`` in {10, …, 100} and dense weights 0.1–0.9, chose the
    same setting: figures in ``docs/fusion.md``.)
    """
    settings: list[Fusion] = [DEFAULT]
    settings += [Fusion("rrf", k, _split(w)) for k in (20, 60) for w in (0.4, 0.5, 0.6)]
    settings += [
        Fusion("weighted", 60, _split(w), norm) for norm in NORMALIZATIONS for w in (0.3, 0.4, 0.5, 0.6, 0.7)
    ]
    return [Point(f, c) for c in candidates for f in settings]


def _split(dense: float) -> dict[str, float]:
    return {"bm25": round(1 - dense, 2), "dense": dense}


def channel_runs(search: SearchFn, queries: Mapping[str, str], depth: int) -> ChannelRuns:
    """Each channel's candidates for every query, retrieved once.

    Args:
        search: ``search(text, mode, top_k) -> [(document id, score)]`` (:data:`eval.runner.SearchFn`),
            asked in modes ``bm25`` and ``dense``.
        queries: Query id -> text; a blank query gets empty lists (it scores 0, as in the runner).
        depth: Candidates per channel (``top_k`` asked).

    Returns:
        Channel -> query id -> ``(document id, score)`` best first.
    """
    runs: ChannelRuns = {c: {} for c in CHANNELS}
    for channel in CHANNELS:
        for qid, text in queries.items():
            runs[channel][qid] = [] if not text.strip() else [(h[0], float(h[1])) for h in search(text, channel, depth)]
    return runs


def fused_rankings(runs: ChannelRuns, point: Point, top_k: int = 100) -> dict[str, list[str]]:
    """Query id -> the fused top ``top_k`` document ids under ``point``."""
    qids = set().union(*(runs[c].keys() for c in runs))
    out: dict[str, list[str]] = {}
    for qid in qids:
        channels = {c: runs[c].get(qid, [])[: point.candidates] for c in runs}
        out[qid] = [f.id for f in fuse(channels, point.fusion, top_k)]
    return out


def score(runs: ChannelRuns, qrels: Mapping[str, Mapping[str, int]], point: Point) -> dict[str, float]:
    """Mean metrics (:data:`eval.metrics.METRICS`) of ``point`` over the judged queries."""
    return mean_metrics(per_query_metrics(qrels, fused_rankings(runs, point)))


def single_channel(runs: ChannelRuns, qrels: Mapping[str, Mapping[str, int]], channel: str) -> dict[str, float]:
    """Mean metrics of one channel alone (its first 100 candidates)."""
    rankings = {qid: [d for d, _ in hits[:100]] for qid, hits in runs[channel].items()}
    return mean_metrics(per_query_metrics(qrels, rankings))


def tune(
    runs: ChannelRuns,
    qrels: Mapping[str, Mapping[str, int]],
    split: str,
    grid: Iterable[Point],
    objective: str = "ndcg@10",
    recall_floor: float | None = None,
) -> tuple[Point, list[Scored]]:
    """Score every grid point on the tuning split and pick the best.

    Args:
        runs: Each channel's candidates on the tuning split (:func:`channel_runs`).
        qrels: The tuning split's judgements.
        split: Its name; ``test`` is refused (tuned figures must be reported on unseen queries).
        grid: The points to score (:func:`default_grid`).
        objective: The metric maximised.
        recall_floor: If given, only points whose ``recall@100`` is at least this fraction of the
            default RRF's on the tuning split compete (a point that buys nDCG with recall loses).

    Returns:
        ``(best point, every point scored, best first)``; ties keep the grid's order (the
        default first).

    Raises:
        InvalidRequest: ``split == "test"``, an empty grid or an unknown objective.
    """
    if split == "test":
        raise InvalidRequest("tuning on the test split is refused: tune on train (SciFact) or dev (CMRC2018)")
    scored = [Scored(p, score(runs, qrels, p)) for p in grid]
    if not scored:
        raise InvalidRequest("empty tuning grid")
    if objective not in scored[0].metrics:
        raise InvalidRequest(f"unknown objective {objective!r}; use one of {', '.join(scored[0].metrics)}")
    floor = -1.0
    if recall_floor is not None:
        base = score(runs, qrels, Point(DEFAULT, scored[0].point.candidates))["recall@100"]
        floor = base * recall_floor
    eligible = [s for s in scored if s.metrics["recall@100"] >= floor] or scored
    ranked = sorted(eligible, key=lambda s: -s.metrics[objective])
    return ranked[0].point, sorted(scored, key=lambda s: -s.metrics[objective])


def write_setting(path: Path, best: Point, facts: Mapping[str, Any]) -> dict[str, Any]:
    """Write the chosen setting as JSON (``fusion``, ``candidates`` and how it was chosen); return it."""
    setting = {**best.describe(), "tuned": dict(facts)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(setting, indent=2) + "\n", encoding="utf-8")
    return setting


def read_fusion(raw: Mapping[str, Any]) -> Fusion:
    """A :class:`Fusion` from its JSON (:meth:`Fusion.describe`, or a tuned file's ``fusion``).

    Raises:
        InvalidRequest: Unknown keys or values of the wrong type.
    """
    body = raw.get("fusion", raw)
    known = {"method", "k", "weights", "normalization"}
    if not isinstance(body, Mapping) or set(body) - known:
        raise InvalidRequest(f"a fusion setting has the keys {sorted(known)}, got {body!r:.120}")
    try:
        return Fusion(
            str(body.get("method", "rrf")),  # type: ignore[arg-type]
            int(body.get("k", 60)),
            {str(c): float(w) for c, w in dict(body.get("weights") or {}).items()},
            str(body.get("normalization", "minmax")),  # type: ignore[arg-type]
        )
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"bad fusion setting: {exc}") from exc
