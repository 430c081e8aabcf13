r"""SciFact levers from saved channel runs: each tuned on train, scored on test, paired against the default.

Reads the ``--runs`` files ``bench/multilingual.py`` writes (each channel's top 100 for every
judged query of ``train`` and ``test``; BM25's runs are the same in both files) for MiniLM
(``dense``) and multilingual-e5-small (``e5``), and scores, on test, each lever with its
setting chosen on train only (best train nDCG@10; ties to the first in grid order):

- ``default``: RRF ``k=60`` 1:1, BM25 + MiniLM, 100 candidates (Quarry's default);
- ``rrf k, weights``: RRF with ``k`` in {10, 20, 40, 60, 100} x dense weight 0.3-0.7;
- ``window``: the default fusion over the first 20, 50 or 100 candidates per channel (a deeper
  window needs deeper runs);
- ``weighted zscore`` / ``weighted minmax``: dense weight 0.0-1.0 by 0.1, BM25 ``1 - w``;
- ``e5 instead of MiniLM``: the default RRF and weighted zscore tuned, BM25 + e5;
- ``second dense channel``: BM25 + MiniLM + e5, RRF 1:1:1 and weighted zscore over the
  weights simplex by 0.1.

Each row's test nDCG@10 is paired against the default per query (:func:`eval.compare.paired_stats`:
randomisation-test p, 10,000 resamples, bootstrap 95 % interval).

    python bench/levers.py --minilm runs-scifact-minilm.json --e5 runs-scifact-e5.json --json levers.json
    python bench/levers.py --markdown levers.json

Figures: docs/fusion.md#scifact-levers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eval.tune import DEFAULT, ChannelRuns, Point, fused_rankings  # noqa: E402
from retrieval.fusion import Fusion  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "scifact"
TENTHS = [round(0.1 * i, 1) for i in range(11)]


def load_runs(minilm: Path, e5: Path) -> dict[str, ChannelRuns]:
    """Split -> channel (``bm25``, ``dense``, ``e5``) -> query -> ``(doc, score)`` best first."""
    a, b = json.loads(minilm.read_text())["runs"], json.loads(e5.read_text())["runs"]
    out: dict[str, ChannelRuns] = {}
    for split in a:
        runs = {c: {q: [(d, float(s)) for d, s in h] for q, h in a[split][c].items()} for c in ("bm25", "dense")}
        runs["e5"] = {q: [(d, float(s)) for d, s in h] for q, h in b[split]["dense"].items()}
        out[split] = runs
    return out


def grids() -> dict[str, tuple[list[str], list[Point]]]:
    """Lever -> (the channels it fuses, its grid)."""
    split = [{"bm25": round(1 - w, 1), "dense": w} for w in TENTHS]
    simplex = [{"bm25": round(1 - m - e, 1), "dense": m, "e5": e} for m in TENTHS for e in TENTHS if m + e <= 1.0001]
    return {
        "default": (["bm25", "dense"], [Point(DEFAULT, 100)]),
        "rrf k, weights": (["bm25", "dense"], [
            Point(Fusion("rrf", k, {"bm25": round(1 - w, 1), "dense": w}), 100)
            for k in (10, 20, 40, 60, 100) for w in (0.3, 0.4, 0.5, 0.6, 0.7)]),
        "window": (["bm25", "dense"], [Point(DEFAULT, c) for c in (20, 50, 100)]),
        "weighted zscore": (["bm25", "dense"], [Point(Fusion("weighted", 60, w, "zscore"), 100) for w in split]),
        "weighted minmax": (["bm25", "dense"], [Point(Fusion("weighted", 60, w, "minmax"), 100) for w in split]),
        "e5 instead of MiniLM, rrf": (["bm25", "e5"], [Point(Fusion("rrf", 60, {"bm25": 1.0, "e5": 1.0}), 100)]),
        "e5 instead of MiniLM, weighted zscore": (["bm25", "e5"], [
            Point(Fusion("weighted", 60, {"bm25": w["bm25"], "e5": w["dense"]}, "zscore"), 100) for w in split]),
        "second dense channel, rrf": (["bm25", "dense", "e5"], [
            Point(Fusion("rrf", 60, {"bm25": 1.0, "dense": 1.0, "e5": 1.0}), 100)]),
        "second dense channel, weighted zscore": (["bm25", "dense", "e5"], [
            Point(Fusion("weighted", 60, w, "zscore"), 100) for w in simplex]),
    }


def main() -> None:  # noqa: PLR0914 - one report
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minilm", type=Path, help="bench/multilingual.py --runs file of MiniLM on SciFact")
    parser.add_argument("--e5", type=Path, help="the same of multilingual-e5-small")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument("--markdown", type=Path, default=None, help="print the table of a --json file")
    args = parser.parse_args()
    if args.markdown is not None:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    from eval.beir import load_split
    from eval.compare import paired_stats
    from eval.metrics import mean_metrics, per_query_metrics

    runs = load_runs(args.minilm, args.e5)
    qrels = {s: load_split(DATA, s).qrels for s in ("train", "test")}

    def metrics(split: str, channels: list[str], point: Point) -> dict[str, dict[str, float]]:
        picked = {c: runs[split][c] for c in channels}
        return per_query_metrics(qrels[split], fused_rankings(picked, point))

    base = metrics("test", ["bm25", "dense"], Point(DEFAULT, 100))
    order = sorted(base)
    rows: dict[str, Any] = {}
    for lever, (channels, grid) in grids().items():
        scored = [(mean_metrics(metrics("train", channels, p))["ndcg@10"], -i, p) for i, p in enumerate(grid)]
        train, _, best = max(scored, key=lambda s: (s[0], s[1]))
        mine = metrics("test", channels, best)
        stats = paired_stats([base[q]["ndcg@10"] for q in order], [mine[q]["ndcg@10"] for q in order])
        rows[lever] = {"setting": best.describe(), "channels": channels, "train_ndcg@10": train,
                       "test": mean_metrics(mine), "vs_default": vars(stats), "grid_points": len(grid)}
        print(f"{lever}: train {train:.4f} test {rows[lever]['test']['ndcg@10']:.4f} "
              f"delta {stats.delta:+.4f} p {stats.p_value}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


def markdown(rows: dict[str, Any]) -> str:
    """One line per lever: its setting, train and test nDCG@10, delta vs the default, p and interval."""
    lines = ["| lever | setting chosen on train | train nDCG@10 | test nDCG@10 | vs default (95 % CI) | p |",
             "|---|---|---|---|---|---|"]
    for lever, r in rows.items():
        f, s = r["setting"]["fusion"], r["vs_default"]
        setting = f"{f['method']} " + ", ".join(f"{c} {w:g}" for c, w in f["weights"].items())
        setting += f" k={f['k']}" if f["method"] == "rrf" else f" {f['normalization']}"
        setting += f", {r['setting']['candidates']} candidates"
        ci = "-" if s["ci_low"] is None else f"[{s['ci_low']:+.4f}, {s['ci_high']:+.4f}]"
        p = "-" if s["p_value"] is None else ("< 0.001" if s["p_value"] < 0.001 else f"{s['p_value']:.3f}")
        lines.append(f"| {lever} | {setting} | {r['train_ndcg@10']:.4f} | {r['test']['ndcg@10']:.4f} "
                     f"| {s['delta']:+.4f} {ci} | {p} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
