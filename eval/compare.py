"""Compare two evaluation runs query by query: deltas, paired significance tests, confidence intervals.

``quarry eval compare RUN_A RUN_B`` (and ``quarry eval --baseline RUN_A``) reads each run's
``summary.json`` and ``per_query.json`` and, for every mode both runs have and every metric of
:data:`eval.metrics.METRICS`, pairs the per-query values of the queries both runs scored
(B minus A):

- **delta**: mean of the paired differences, i.e. mean(B) - mean(A) over those queries;
- **p-value**: Fisher's paired randomisation test, two-sided, on the mean difference
  (``scipy.stats.permutation_test`` with ``permutation_type="samples"``: the two values of each
  query are swapped at random; exact enumeration when ``2**n`` is at most the number of
  resamples). It is the test Smucker, Allan and Carterette recommend for IR metrics ("A comparison
  of statistical significance tests for information retrieval evaluation", CIKM 2007) and ranx's
  default; the paired t-test's p-value (``scipy.stats.ttest_rel``) is given beside it;
- **confidence interval** of the delta: bootstrap percentile interval of the mean difference
  (``scipy.stats.bootstrap``, 95 % by default);
- **wins / losses / ties**: queries where B is higher / lower / equal (within 1e-9);
- **flipped queries**: per mode, the queries whose first relevant document is in the top
  :data:`FLIP_K` (10) of one run and not of the other, with that rank in each run (``None``: not
  in the run's top 100) and their nDCG@10, read from each run's ``queries.json``;
- **config difference**: only the settings that differ (nested keys dotted, e.g.
  ``fusion.method``), not both configs; the run facts that always differ (``started_at``) are left out.

Resampling uses a fixed seed, so a comparison is reproducible. No correction for testing many
metrics and modes at once is applied: a p-value near 0.05 among 12 tests is weak evidence.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from eval.metrics import METRICS
from eval.summary import Summary
from quarry.errors import ConfigError, InvalidRequest, missing_extra

COMPARE_JSON = "compare.json"
COMPARE_HTML = "compare.html"
TIE_TOLERANCE = 1e-9
DEFAULT_RESAMPLES = 10_000
DEFAULT_SEED = 0
SIGNIFICANCE = 0.05
FLIP_K = 10
"""A query flips when its first relevant document is within this rank in one run and not in the other."""
ALWAYS_DIFFERENT = frozenset({"started_at"})
"""p-values below it are coloured in the printed table and the HTML (a display choice, not a decision rule)."""

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class RunData:
    """What a comparison needs of one run.

    Attributes:
        label: How the run is named in the output (its folder, or ``"this run"``).
        config: The run's ``summary.json["config"]``.
        per_query: Mode -> query id -> {metric -> value}.
    """

    label: str
    config: dict[str, Any]
    per_query: dict[str, dict[str, dict[str, float]]]
    first_relevant: dict[str, dict[str, int | None]] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Flip:
    """A query whose first relevant document entered or left the top :data:`FLIP_K` from A to B.

    Attributes:
        mode: The mode.
        qid: Query id.
        text: Query text (empty when neither run kept it).
        rank_a: 1-based rank of its first relevant document in A (``None``: not retrieved).
        rank_b: The same in B.
        ndcg_a: Its nDCG@10 in A (``None``: not scored).
        ndcg_b: Its nDCG@10 in B.
    """

    mode: str
    qid: str
    text: str
    rank_a: int | None
    rank_b: int | None
    ndcg_a: float | None
    ndcg_b: float | None

    @property
    def gained(self) -> bool:
        """B brought a relevant document into the top :data:`FLIP_K`."""
        return self.rank_b is not None and self.rank_b <= FLIP_K


@dataclass(frozen=True)
class PairedStats:
    """Statistics of B minus A over paired per-query values.

    Attributes:
        n: Number of paired queries.
        mean_a: Mean of A over those queries.
        mean_b: Mean of B over those queries.
        delta: ``mean_b - mean_a``.
        ci_low: Lower bound of the bootstrap interval of ``delta`` (None when ``n < 2``).
        ci_high: Upper bound (None when ``n < 2``).
        p_value: Two-sided paired randomisation test (None when ``n < 2``).
        p_ttest: Two-sided paired t-test (None when ``n < 2`` or the differences are constant
            within :data:`TIE_TOLERANCE`).
        wins: Queries where B > A.
        losses: Queries where B < A.
        ties: Queries where they are equal within :data:`TIE_TOLERANCE`.
    """

    n: int
    mean_a: float
    mean_b: float
    delta: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    p_ttest: float | None
    wins: int
    losses: int
    ties: int


@dataclass(frozen=True)
class MetricDelta:
    """One row of a comparison: a mode and a metric, with its :class:`PairedStats`."""

    mode: str
    metric: str
    stats: PairedStats


@dataclass(frozen=True)
class Comparison:
    """Run B against run A.

    Attributes:
        a: Label of the base run.
        b: Label of the compared run.
        rows: One per mode both runs have and metric, modes in B's order.
        confidence: Confidence level of the intervals, e.g. 0.95.
        resamples: Resamples of the randomisation test and the bootstrap.
        seed: Seed of both.
        notes: What was left out (modes one run lacks, queries only one run scored).
        config_a: Run A's config.
        config_b: Run B's config.
        flips: The flipped queries, per mode, gains first, then by query id.
    """

    a: str
    b: str
    rows: list[MetricDelta]
    confidence: float
    resamples: int
    seed: int
    notes: list[str] = field(default_factory=list)
    config_a: dict[str, Any] = field(default_factory=dict)
    config_b: dict[str, Any] = field(default_factory=dict)
    flips: list[Flip] = field(default_factory=list)

    @property
    def config_diff(self) -> dict[str, dict[str, Any]]:
        """The settings that differ: dotted key -> ``{"a": value, "b": value}`` (missing: ``None``)."""
        return config_diff(self.config_a, self.config_b)

    def to_dict(self) -> dict[str, Any]:
        """The ``compare.json`` object: labels, method, notes, one entry per row, the flips, the config difference."""
        return {
            "a": self.a,
            "b": self.b,
            "method": {
                "delta": "mean of per-query (B - A) over the queries both runs scored",
                "p_value": "two-sided paired randomisation test (Fisher), scipy.stats.permutation_test",
                "p_ttest": "two-sided paired t-test, scipy.stats.ttest_rel",
                "ci": f"{self.confidence:.0%} bootstrap percentile interval of the delta, scipy.stats.bootstrap",
                "resamples": self.resamples,
                "seed": self.seed,
                "tie_tolerance": TIE_TOLERANCE,
            },
            "notes": self.notes,
            "rows": [{"mode": r.mode, "metric": r.metric, **asdict(r.stats)} for r in self.rows],
            "flip_k": FLIP_K,
            "flips": [asdict(f) for f in self.flips],
            "config_diff": self.config_diff,
        }


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out |= _flatten(value, name + ".")
        else:
            out[name] = value
    return out


def config_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The settings of two run configs that differ, nested keys dotted, sorted; ``started_at`` left out.

    Returns:
        Dotted key -> ``{"a": A's value, "b": B's value}`` (``None`` where a run lacks it).
    """
    fa, fb = _flatten(a), _flatten(b)
    keys = sorted((fa.keys() | fb.keys()) - ALWAYS_DIFFERENT)
    return {k: {"a": fa.get(k), "b": fb.get(k)} for k in keys if fa.get(k) != fb.get(k)}


def _scipy_stats() -> Any:
    try:
        import scipy.stats
    except ImportError as exc:
        raise missing_extra(exc.name or "scipy", "eval") from exc
    return scipy.stats


def _mean_difference(x: FloatArray, y: FloatArray, axis: int = -1) -> Any:
    return np.mean(x - y, axis=axis)


def paired_stats(
    a: Sequence[float] | FloatArray,
    b: Sequence[float] | FloatArray,
    *,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    batch: int | None = None,
) -> PairedStats:
    """Delta, randomisation-test and t-test p-values, bootstrap interval and W/L/T of B vs A.

    Args:
        a: Per-query values of the base run.
        b: The same queries' values in the compared run, in the same order.
        confidence: Confidence level of the interval, in (0, 1).
        resamples: Resamples of the randomisation test and the bootstrap.
        seed: Seed of both (a :func:`numpy.random.default_rng` each).
        batch: Resamples computed at once (``None``: all of them; the memory is about
            ``8 * n * batch`` bytes per array): a server bounds it; the draws, and so the results, are
            the same (scipy draws the resamples in order, batch after batch).

    Returns:
        The statistics (see :class:`PairedStats`); with all differences 0: p 1.0, interval [0, 0].

    Raises:
        InvalidRequest: ``a`` and ``b`` differ in length, or ``confidence`` is not in (0, 1).
        ConfigError: scipy is not installed (the ``eval`` extra).
    """
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise InvalidRequest(f"paired values differ in shape: {x.shape} and {y.shape}")
    if not 0 < confidence < 1:
        raise InvalidRequest(f"confidence must be in (0, 1), got {confidence}")
    diff = y - x
    n = int(diff.size)
    wins = int(np.sum(diff > TIE_TOLERANCE))
    losses = int(np.sum(diff < -TIE_TOLERANCE))
    base = PairedStats(
        n=n,
        mean_a=float(x.mean()) if n else 0.0,
        mean_b=float(y.mean()) if n else 0.0,
        delta=float(diff.mean()) if n else 0.0,
        ci_low=None,
        ci_high=None,
        p_value=None,
        p_ttest=None,
        wins=wins,
        losses=losses,
        ties=n - wins - losses,
    )
    if n < 2:  # a pair of queries is the least a paired test needs
        return base
    if not np.any(diff):
        return replace(base, ci_low=0.0, ci_high=0.0, p_value=1.0)
    stats = _scipy_stats()
    perm = stats.permutation_test(
        (y, x), _mean_difference, permutation_type="samples", vectorized=True,
        n_resamples=resamples, alternative="two-sided", rng=np.random.default_rng(seed), batch=batch,
    )
    boot = stats.bootstrap(
        (diff,), np.mean, n_resamples=resamples, confidence_level=confidence, method="percentile",
        vectorized=True, rng=np.random.default_rng(seed), batch=batch,
    )
    p_t = float(stats.ttest_rel(y, x).pvalue) if np.ptp(diff) > TIE_TOLERANCE else None  # constant: no t
    return replace(
        base,
        ci_low=float(boot.confidence_interval.low),
        ci_high=float(boot.confidence_interval.high),
        p_value=float(perm.pvalue),
        p_ttest=p_t if p_t is None or math.isfinite(p_t) else None,
    )


def run_data(summary: Summary, label: str = "this run") -> RunData:
    """The :class:`RunData` of a run still in memory."""
    per_query = {name: {q: dict(v) for q, v in r.per_query.items()} for name, r in summary.modes.items()}
    first: dict[str, dict[str, int | None]] = {}
    for name, result in summary.modes.items():
        for qid in summary.qrels:
            ranking = result.rankings.get(qid, [])
            relevant = {d for d, grade in summary.qrels[qid].items() if grade > 0}
            first.setdefault(name, {})[qid] = next((i for i, d in enumerate(ranking, 1) if d in relevant), None)
    return RunData(label, dict(summary.config), per_query, first, dict(summary.queries))


def load_run(folder: Path, label: str | None = None) -> RunData:
    """Read a run folder written by ``quarry eval`` (``summary.json`` and ``per_query.json``).

    Args:
        folder: The run's ``--out`` folder.
        label: How the run is named in the output; default the folder's name.

    Returns:
        The run.

    Raises:
        ConfigError: A file is missing or malformed (the committed ``eval/baselines/*.json`` hold
            means only: a comparison needs a run folder with ``per_query.json``).
    """
    folder = Path(folder)
    try:
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        per_query = json.loads((folder / "per_query.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"{folder} is not a readable run folder (summary.json and per_query.json of `quarry eval --out`): {exc}"
        ) from exc
    if not isinstance(summary, dict) or not isinstance(per_query, dict):
        raise ConfigError(f"{folder}: summary.json and per_query.json must hold JSON objects")
    modes: dict[str, dict[str, dict[str, float]]] = {}
    for mode, queries in per_query.items():
        if not isinstance(queries, dict):
            raise ConfigError(f"{folder / 'per_query.json'}: mode {mode!r} is not an object of queries")
        modes[str(mode)] = {
            str(q): {m: float(v) for m, v in row.items() if m in METRICS and isinstance(v, int | float)}
            for q, row in queries.items()
            if isinstance(row, dict)
        }
    config = summary.get("config")
    first, texts = _read_queries(folder / "queries.json")
    return RunData(label or folder.resolve().name, config if isinstance(config, dict) else {}, modes, first, texts)


def _read_queries(path: Path) -> tuple[dict[str, dict[str, int | None]], dict[str, str]]:
    """Mode -> query id -> rank of its first relevant document, and the query texts, of a ``queries.json``.

    A run folder without one (written before it existed) gives nothing: no flips are listed.

    Raises:
        ConfigError: The file exists and is not the per-query view's JSON.
    """
    if not path.is_file():
        return {}, {}
    try:
        view = json.loads(path.read_text(encoding="utf-8"))
        first: dict[str, dict[str, int | None]] = {}
        texts: dict[str, str] = {}
        for row in view["queries"]:
            qid = str(row["qid"])
            texts[qid] = str(row.get("text", ""))
            for mode in row.get("scores", {}):
                ranks = [d["ranks"].get(mode) for d in row.get("relevant", [])]
                found = [int(r) for r in ranks if isinstance(r, int)]
                first.setdefault(mode, {})[qid] = min(found) if found else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{path} is not the per-query view of `quarry eval --out`: {exc}") from exc
    return first, texts


def run_flips(a: RunData, b: RunData, modes: Sequence[str]) -> list[Flip]:
    """The queries of ``modes`` whose first relevant document crossed the top :data:`FLIP_K` (see the module doc)."""
    flips: list[Flip] = []
    for mode in modes:
        ra, rb = a.first_relevant.get(mode, {}), b.first_relevant.get(mode, {})
        for qid in sorted(ra.keys() & rb.keys()):
            rank_a, rank_b = ra[qid], rb[qid]
            top_a, top_b = rank_a is not None and rank_a <= FLIP_K, rank_b is not None and rank_b <= FLIP_K
            if top_a != top_b:
                flips.append(Flip(
                    mode, qid, b.texts.get(qid) or a.texts.get(qid, ""), rank_a, rank_b,
                    a.per_query.get(mode, {}).get(qid, {}).get("ndcg@10"),
                    b.per_query.get(mode, {}).get(qid, {}).get("ndcg@10"),
                ))
    return sorted(flips, key=lambda f: (modes.index(f.mode), not f.gained, f.qid))


def check_same_task(a: RunData, b: RunData) -> None:
    """Refuse to pair runs of different datasets or splits.

    Raises:
        InvalidRequest: Both configs name a dataset (or split) and they differ.
    """
    for key in ("dataset", "split"):
        va, vb = a.config.get(key), b.config.get(key)
        if va is not None and vb is not None and va != vb:
            raise InvalidRequest(f"runs differ in {key}: {a.label} has {va!r}, {b.label} has {vb!r}")


def _pairs(qa: Mapping[str, Mapping[str, float]], qb: Mapping[str, Mapping[str, float]], metric: str) -> tuple[
    list[float], list[float]
]:
    common = sorted(q for q in qa.keys() & qb.keys() if metric in qa[q] and metric in qb[q])
    return [qa[q][metric] for q in common], [qb[q][metric] for q in common]


def compare_runs(
    a: RunData,
    b: RunData,
    metrics: Sequence[str] = METRICS,
    *,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> Comparison:
    """Compare run B with run A for every mode both have (see the module docstring).

    Args:
        a: The base run.
        b: The compared run.
        metrics: Metric names to compare.
        confidence: Confidence level of the intervals.
        resamples: Resamples of each test and bootstrap.
        seed: Their seed.

    Returns:
        The comparison; modes only one run has and queries only one run scored are named in ``notes``.

    Raises:
        InvalidRequest: The runs are of different datasets or splits, or share no mode.
    """
    check_same_task(a, b)
    shared = [m for m in b.per_query if m in a.per_query]
    if not shared:
        raise InvalidRequest(f"{a.label} ({sorted(a.per_query)}) and {b.label} ({sorted(b.per_query)}) share no mode")
    notes = [f"mode {m!r} only in {a.label}" for m in a.per_query if m not in b.per_query]
    notes += [f"mode {m!r} only in {b.label}" for m in b.per_query if m not in a.per_query]
    rows: list[MetricDelta] = []
    for mode in shared:
        qa, qb = a.per_query[mode], b.per_query[mode]
        only = len(qa.keys() ^ qb.keys())
        if only:
            notes.append(f"{mode}: {only} queries scored by one run only are left out")
        for metric in metrics:
            xs, ys = _pairs(qa, qb, metric)
            stats = paired_stats(xs, ys, confidence=confidence, resamples=resamples, seed=seed)
            rows.append(MetricDelta(mode, metric, stats))
    return Comparison(a.label, b.label, rows, confidence, resamples, seed, notes, a.config, b.config,
                      run_flips(a, b, shared))


def write_comparison(comparison: Comparison, out_dir: Path) -> tuple[Path, Path]:
    """Write ``compare.json`` and the self-contained ``compare.html`` into ``out_dir``.

    Returns:
        ``(json_path, html_path)``.

    Raises:
        ConfigError: jinja2 is not installed (the ``eval`` extra).
        OSError: ``out_dir`` cannot be written.
    """
    from eval.html import render_compare_html

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out_dir / COMPARE_JSON, out_dir / COMPARE_HTML
    json_path.write_text(json.dumps(comparison.to_dict(), indent=2, default=str) + "\n", encoding="utf-8")
    html_path.write_text(render_compare_html(comparison), encoding="utf-8")
    return json_path, html_path
