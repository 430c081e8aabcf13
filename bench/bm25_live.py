"""The incremental BM25 index (indexing.bm25_live) against a bm25s snapshot, in one run, on SciFact.

Prints: query latency (300 test queries, top-100, best of ``--repeats``) of both, and the ratio;
the cost of one single-document upsert (incremental apply vs a full bm25s rebuild, which is what
the registry did per write before issue 25).

    python bench/bm25_live.py [--scifact PATH] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eval.beir import load_split  # noqa: E402
from indexing.sources import iter_jsonl  # noqa: E402
from quarry.settings import BM25Settings  # noqa: E402
from indexing.bm25 import BM25Index  # noqa: E402
from indexing.bm25_live import LiveBM25, Row  # noqa: E402
from indexing.text import tokenize  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scifact", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    docs = list(iter_jsonl(args.scifact / "corpus.jsonl"))
    rows: list[Row] = [(d.id, d.id, tokenize(f"{d.title}\n{d.text}", "en"), {}) for d in docs]
    queries = [tokenize(q, "en") for q in load_split(args.scifact, "test").queries.values()]
    params = BM25Settings()
    t = time.perf_counter()
    snap = BM25Index.build(rows, params, 1)
    build_bm25s = time.perf_counter() - t
    t = time.perf_counter()
    live = LiveBM25.build(rows, params, 1)
    build_live = time.perf_counter() - t
    view = live.view()

    def run(index: object) -> float:
        best = float("inf")
        for _ in range(args.repeats):
            t = time.perf_counter()
            for q in queries:
                index.top(q, 100)  # type: ignore[attr-defined]
            best = min(best, time.perf_counter() - t)
        return best / len(queries) * 1000

    ms_bm25s, ms_live = run(snap), run(view)
    t = time.perf_counter()
    n = 50
    for i in range(n):
        d = rows[i]
        live.apply({d[1]: [(d[0], d[1], d[2][::-1], {})]}, 2 + i)
    apply_ms = (time.perf_counter() - t) / n * 1000
    print(f"SciFact {len(rows)} docs, {len(queries)} queries, 2 shared cores")
    print(f"build: bm25s {build_bm25s:.2f} s, live {build_live:.2f} s")
    print(f"query top-100: bm25s {ms_bm25s:.3f} ms, live {ms_live:.3f} ms (ratio {ms_live / ms_bm25s:.2f})")
    print(f"one-document upsert: live apply {apply_ms:.2f} ms vs a full bm25s rebuild {build_bm25s * 1000:.0f} ms "
          f"({build_bm25s * 1000 / apply_ms:.0f}x)")


if __name__ == "__main__":
    main()
