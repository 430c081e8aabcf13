"""Run comparison: the statistics checked against scipy called directly on a fixed pair of runs, and by hand."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest
import scipy.stats
from rich.console import Console
from typer.testing import CliRunner

from eval.compare import compare_runs, load_run, paired_stats, write_comparison
from eval.metrics import METRICS
from quarry import cli
from quarry.cli import evaluate as cli_evaluate
from quarry.errors import ConfigError, InvalidRequest

QUERIES = [f"q{i:03d}" for i in range(60)]


def fixed_scores(seed: int, shift: float) -> dict[str, dict[str, float]]:
    """Per-query values of every metric: a fixed draw, B's lifted by ``shift`` on most queries."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.0, 1.0, size=(len(QUERIES), len(METRICS)))
    lift = np.where(rng.uniform(size=(len(QUERIES), 1)) < 0.7, shift, -shift / 2)
    values = np.clip(base + lift, 0.0, 1.0).round(4)
    return {q: {m: float(values[i, j]) for j, m in enumerate(METRICS)} for i, q in enumerate(QUERIES)}


def write_run(folder: Path, modes: dict[str, dict[str, dict[str, float]]], split: str = "test") -> Path:
    folder.mkdir(parents=True)
    summary = {"config": {"dataset": "scifact", "split": split}, "modes": {m: {} for m in modes}}
    (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    per_query = {m: {q: {**v, "latency_ms": 1.0} for q, v in rows.items()} for m, rows in modes.items()}
    (folder / "per_query.json").write_text(json.dumps(per_query), encoding="utf-8")
    return folder


@pytest.fixture()
def runs(tmp_path: Path) -> tuple[Path, Path]:
    a = {"bm25": fixed_scores(1, 0.0), "hybrid": fixed_scores(2, 0.0)}
    b = {"bm25": fixed_scores(1, 0.0), "hybrid": fixed_scores(2, 0.08), "dense": fixed_scores(3, 0.0)}
    del b["hybrid"]["q059"]  # one query only A scored: left out of the pairs
    return write_run(tmp_path / "run_a", a), write_run(tmp_path / "run_b", b)


def test_statistics_match_scipy_on_a_fixed_pair_of_runs(runs: tuple[Path, Path]) -> None:
    a, b = load_run(runs[0]), load_run(runs[1])
    comparison = compare_runs(a, b, resamples=2000, seed=7)
    assert [(r.mode, r.metric) for r in comparison.rows] == [("bm25", m) for m in METRICS] + [
        ("hybrid", m) for m in METRICS
    ]
    assert "mode 'dense' only in run_b" in comparison.notes
    assert "hybrid: 1 queries scored by one run only are left out" in comparison.notes
    for row in comparison.rows:
        common = sorted(set(a.per_query[row.mode]) & set(b.per_query[row.mode]))
        x = np.array([a.per_query[row.mode][q][row.metric] for q in common])
        y = np.array([b.per_query[row.mode][q][row.metric] for q in common])
        s = row.stats
        assert s.n == len(common) == (59 if row.mode == "hybrid" else 60)
        assert s.delta == pytest.approx(float(np.mean(y - x)), abs=1e-12)
        assert (s.mean_a, s.mean_b) == (pytest.approx(x.mean()), pytest.approx(y.mean()))
        assert (s.wins, s.losses, s.ties) == (int(np.sum(y > x)), int(np.sum(y < x)), int(np.sum(y == x)))
        if row.mode == "bm25":  # identical runs
            assert (s.delta, s.p_value, s.ci_low, s.ci_high, s.ties) == (0.0, 1.0, 0.0, 0.0, 60)
            continue
        perm = scipy.stats.permutation_test(
            (y, x), lambda u, v, axis: np.mean(u - v, axis=axis), permutation_type="samples", vectorized=True,
            n_resamples=2000, alternative="two-sided", rng=np.random.default_rng(7),
        )
        boot = scipy.stats.bootstrap(
            (y - x,), np.mean, n_resamples=2000, confidence_level=0.95, method="percentile",
            rng=np.random.default_rng(7),
        )
        assert s.p_value == pytest.approx(perm.pvalue, abs=1e-12)
        assert s.p_ttest == pytest.approx(scipy.stats.ttest_rel(y, x).pvalue, abs=1e-12)
        assert (s.ci_low, s.ci_high) == (
            pytest.approx(boot.confidence_interval.low, abs=1e-12),
            pytest.approx(boot.confidence_interval.high, abs=1e-12),
        )
        assert s.ci_low is not None and s.ci_high is not None and s.ci_low <= s.delta <= s.ci_high
    ndcg = next(r.stats for r in comparison.rows if (r.mode, r.metric) == ("hybrid", "ndcg@10"))
    assert ndcg.delta > 0.02 and ndcg.p_value is not None and ndcg.p_value < 0.05  # the lift is found


def test_known_answers_worked_by_hand() -> None:
    # Five queries, each +0.2: of the 2**5 sign patterns only all-plus and all-minus reach |mean| 0.2,
    # so the exact two-sided randomisation p-value is 2/32; the differences are constant (no t-test).
    s = paired_stats([0.1, 0.2, 0.3, 0.4, 0.5], [0.3, 0.4, 0.5, 0.6, 0.7])
    assert s.p_value == pytest.approx(2 / 32) and s.p_ttest is None
    assert s.delta == pytest.approx(0.2) and (s.ci_low, s.ci_high) == (pytest.approx(0.2), pytest.approx(0.2))
    assert (s.wins, s.losses, s.ties) == (5, 0, 0)
    # +1, +1, -1 and a tie: the share of the 16 sign patterns whose |mean| reaches the observed 1/4.
    d = np.array([1.0, 1.0, -1.0, 0.0])
    signs = np.array([[1 if (i >> j) & 1 else -1 for j in range(4)] for i in range(16)])
    expected = float(np.mean(np.abs((signs * d).mean(axis=1)) >= abs(d.mean()) - 1e-12))
    s = paired_stats([0.0, 0.0, 1.0, 0.5], [1.0, 1.0, 0.0, 0.5])
    assert s.p_value == pytest.approx(expected) and (s.wins, s.losses, s.ties) == (2, 1, 1)
    one = paired_stats([0.5], [0.7])
    assert one.n == 1 and one.p_value is None and one.ci_low is None


def test_refusals(runs: tuple[Path, Path], tmp_path: Path) -> None:
    other = write_run(tmp_path / "train", {"hybrid": fixed_scores(2, 0.0)}, split="train")
    with pytest.raises(InvalidRequest, match="runs differ in split"):
        compare_runs(load_run(runs[0]), load_run(other))
    disjoint = write_run(tmp_path / "x", {"sparse": fixed_scores(2, 0.0)})
    with pytest.raises(InvalidRequest, match="share no mode"):
        compare_runs(load_run(runs[0]), load_run(disjoint))
    (tmp_path / "means-only").mkdir()
    (tmp_path / "means-only" / "summary.json").write_text('{"modes": {}}', encoding="utf-8")
    with pytest.raises(ConfigError, match="not a readable run folder"):
        load_run(tmp_path / "means-only")
    with pytest.raises(InvalidRequest, match="differ in shape"):
        paired_stats([0.1, 0.2], [0.1])


def test_written_json_and_self_contained_html(runs: tuple[Path, Path], tmp_path: Path) -> None:
    comparison = compare_runs(load_run(runs[0]), load_run(runs[1]), resamples=500)
    json_path, html_path = write_comparison(comparison, tmp_path / "cmp")
    data = json.loads(json_path.read_text(encoding="utf-8"))
    assert {r["mode"] for r in data["rows"]} == {"bm25", "hybrid"} and data["method"]["resamples"] == 500
    row = next(r for r in data["rows"] if (r["mode"], r["metric"]) == ("hybrid", "ndcg@10"))
    assert set(row) >= {"delta", "ci_low", "ci_high", "p_value", "p_ttest", "wins", "losses", "ties", "n"}
    html = html_path.read_text(encoding="utf-8")
    assert 'id="compare-table"' in html and f"{row['delta']:+.4f}" in html and f"{row['p_value']:.4f}" in html
    assert not re.search(r"https?://", html)


def test_cli_compare_prints_and_writes(runs: tuple[Path, Path], tmp_path: Path) -> None:
    with patch.object(cli_evaluate, "out", Console(width=200, file=io.StringIO())) as console:
        args = ["eval", "compare", str(runs[0]), str(runs[1]), "--out", str(tmp_path / "o")]
        result = CliRunner().invoke(cli.app, args)
        printed = console.file.getvalue()
    assert result.exit_code == 0, result.output
    assert "hybrid" in printed and "ndcg@10" in printed and "W/L/T" in printed
    assert (tmp_path / "o" / "compare.json").is_file() and (tmp_path / "o" / "compare.html").is_file()
    written = json.loads((tmp_path / "o" / "compare.json").read_text(encoding="utf-8"))
    delta = next(r["delta"] for r in written["rows"] if (r["mode"], r["metric"]) == ("hybrid", "ndcg@10"))
    assert f"{delta:+.4f}" in printed
    missing = CliRunner().invoke(cli.app, ["eval", "compare", str(runs[0]), str(tmp_path / "nope")])
    assert missing.exit_code == 2


def _with_queries(folder: Path, first_relevant: dict[str, dict[str, int | None]], config: dict[str, object]) -> Path:
    """Add a ``queries.json`` (each query's relevant document at the given rank per mode) and a config."""
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    summary["config"] |= config
    (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    qids = sorted({q for ranks in first_relevant.values() for q in ranks})
    rows = [{"qid": q, "text": f"text of {q}", "scores": {m: 0.0 for m in first_relevant},
             "relevant": [{"doc_id": "d1", "grade": 1, "ranks": {m: first_relevant[m].get(q) for m in first_relevant},
                           "channels": {}}]} for q in qids]
    (folder / "queries.json").write_text(json.dumps({"queries": rows}), encoding="utf-8")
    return folder


def test_flipped_queries_with_their_ranks_and_the_config_difference(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a = _with_queries(runs[0], {"bm25": {"q000": 3, "q001": 40, "q002": None, "q003": 1}},
                      {"fusion": {"method": "rrf", "k": 60}, "chunk_size": 256, "started_at": "2026-12-06T01"})
    b = _with_queries(runs[1], {"bm25": {"q000": 25, "q001": 2, "q002": 9, "q003": 4}},
                      {"fusion": {"method": "rrf", "k": 10}, "chunk_size": 256, "started_at": "2026-12-06T02"})
    comparison = compare_runs(load_run(a), load_run(b), resamples=200)
    flips = [(f.mode, f.qid, f.rank_a, f.rank_b, f.gained) for f in comparison.flips]
    # gains first (into the top 10), then losses; q003 moved inside the top 10: not a flip
    assert flips == [("bm25", "q001", 40, 2, True), ("bm25", "q002", None, 9, True), ("bm25", "q000", 3, 25, False)]
    assert comparison.flips[0].text == "text of q001" and comparison.flips[0].ndcg_a is not None
    assert comparison.config_diff == {"fusion.k": {"a": 60, "b": 10}}  # not both configs; started_at left out
    data = comparison.to_dict()
    assert "config_a" not in data and data["config_diff"] == {"fusion.k": {"a": 60, "b": 10}}
    assert [f["qid"] for f in data["flips"]] == ["q001", "q002", "q000"]
    _, html_path = write_comparison(comparison, tmp_path / "cmp")
    html = html_path.read_text(encoding="utf-8")
    assert 'id="flips-table"' in html and "text of q002" in html and "fusion.k" in html
    assert "chunk_size" not in html
    with patch.object(cli_evaluate, "out", Console(width=200, file=io.StringIO())) as console:
        result = CliRunner().invoke(cli.app, ["eval", "compare", str(a), str(b), "--out", str(tmp_path / "o")])
        printed = console.file.getvalue()
    assert result.exit_code == 0, result.output
    assert "3 queries flipped" in printed and "q001" in printed and "fusion.k" in printed
    with patch.object(cli_evaluate, "out", Console(width=200, file=io.StringIO())) as console:
        args = ["eval", "compare", str(a), str(b), "--json", "--out", str(tmp_path / "j")]
        result = CliRunner().invoke(cli.app, args)
        printed = console.file.getvalue()
    assert result.exit_code == 0 and json.loads(printed)["config_diff"] == {"fusion.k": {"a": 60, "b": 10}}


def test_runs_without_queries_json_list_no_flips(runs: tuple[Path, Path]) -> None:
    comparison = compare_runs(load_run(runs[0]), load_run(runs[1]), resamples=200)
    assert comparison.flips == [] and comparison.config_diff == {}
