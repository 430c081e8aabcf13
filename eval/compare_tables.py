"""The terminal tables of ``quarry eval compare`` (rich): metric deltas, flipped queries, config difference."""

from __future__ import annotations

import json

from rich.markup import escape
from rich.table import Table

from eval.compare import FLIP_K, SIGNIFICANCE, Comparison


def _p_text(p: float | None) -> str:
    return "n/a" if p is None else f"{p:.4f}"


def _rank_text(rank: int | None) -> str:
    return "-" if rank is None else str(rank)


def flips_table(comparison: Comparison) -> Table:
    """The flipped queries as a rich table (printed after the comparison)."""
    table = Table(
        "mode", "query", "rank A", "rank B", "nDCG@10 A", "nDCG@10 B", "text",
        title=f"{len(comparison.flips)} {'query' if len(comparison.flips) == 1 else 'queries'} flipped "
        f"(first relevant document in or out of the top {FLIP_K})",
        caption="rank: of the first relevant document (-: not in the top 100)",
    )
    for f in comparison.flips:
        style = "green" if f.gained else "red"
        table.add_row(
            f.mode, f.qid, _rank_text(f.rank_a), f"[{style}]{_rank_text(f.rank_b)}[/]",
            "n/a" if f.ndcg_a is None else f"{f.ndcg_a:.4f}", "n/a" if f.ndcg_b is None else f"{f.ndcg_b:.4f}",
            escape(f.text[:80]),
        )
    return table


def diff_table(comparison: Comparison) -> Table:
    """The config difference as a rich table (no rows: the configs agree)."""
    table = Table("setting", f"A: {comparison.a}", f"B: {comparison.b}", title="config difference")
    for key, pair in comparison.config_diff.items():
        table.add_row(key, json.dumps(pair["a"], default=str), json.dumps(pair["b"], default=str))
    return table


def comparison_table(comparison: Comparison) -> Table:
    """The comparison as a rich table (what ``quarry eval compare`` prints)."""
    pct = f"{comparison.confidence:.0%} CI"
    table = Table(
        "mode", "metric", "A", "B", "delta", pct, "p (rand.)", "p (t)", "W/L/T",
        title=f"B = {comparison.b} vs A = {comparison.a}",
        caption="p (rand.): paired randomisation test; p (t): paired t-test; CI: bootstrap; "
        "W/L/T: queries B won/lost/tied",
    )
    for row in comparison.rows:
        s = row.stats
        ci = "n/a" if s.ci_low is None or s.ci_high is None else f"[{s.ci_low:+.4f}, {s.ci_high:+.4f}]"
        significant = s.p_value is not None and s.p_value < SIGNIFICANCE and s.delta != 0
        style = ("green" if s.delta > 0 else "red") if significant else ""
        table.add_row(
            row.mode, row.metric, f"{s.mean_a:.4f}", f"{s.mean_b:.4f}", f"[{style}]{s.delta:+.4f}[/]" if style
            else f"{s.delta:+.4f}", ci, _p_text(s.p_value), _p_text(s.p_ttest), f"{s.wins}/{s.losses}/{s.ties}",
        )
    return table
