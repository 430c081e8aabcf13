"""Filtered recall and latency per filter form on every vector store (issue 20, finding 10).

Usage::

    python bench/filtered_recall.py [--backends milvus-lite pgvector ...] [--n 20000] [--json FILE]

Per backend: load the :mod:`eval.filtered` dataset (``n`` x 32 random unit vectors), build the
ANN index :func:`eval.filtered.ann_spec` forces (HNSW, or IVF_FLAT on Milvus Lite), then for the
0.1 % and 1 % row sets, each written as a string equality, a numeric equality, a ``$in``, a range
and an ``$or``: one query per call (``top_k`` 10, after a warm-up of 3), recall@10 against numpy
brute force over the matching rows, the fewest hits of any query, and the median latency.
Server backends must be running (``bash scripts/services.sh start``).

Figures (2-core machine shared with other jobs; 20k x 32; p50 ms before -> after routing, every
row at recall@10 1.000 and 10 hits after):

=============  ===============  ===============  ===============  ===============  ===============
backend, set   eq_str           eq_int           in               range            or
=============  ===============  ===============  ===============  ===============  ===============
pgvector 0.1%  17.7 -> 5.6      16.0 -> 1.7      119.7 -> 0.9     125.8 -> 34.3    166.2 -> 2.7
pgvector 1%    13.3 -> 3.1      19.5 -> 3.2      31.6 -> 8.8      33.3 -> 36.5     7.2 -> 2.2
qdrant-edge 1% 0.78 -> 0.07     0.70 -> 0.07     27.5 -> 1.2      0.93 -> 0.07     1.82 -> 0.11
Lite 1%        3.9 -> 3.9       3.7 -> 3.7       4.0 -> 4.1       3.8 -> 3.8       17.0 -> 4.5
server 1%      200 -> 200       200 -> 200       200 -> 200       201 -> 200       222 -> 200
=============  ===============  ===============  ===============  ===============  ===============

Before, Qdrant's 1 % rows came back at recall 0.982 in every form (graph walk with ACORN),
1.000 after (exact); Milvus (server 200 ms: the Strong read's time tick) and pgvector were at
recall 1.000 before too. pgvector's range stays a scan of every row: no index serves a range
on ``jsonb``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

# Run as ``python bench/filtered_recall.py``: this file's folder would shadow the ``stores`` package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from eval.filtered import ann_spec, exact_top, make_data, recall, selections  # noqa: E402
from stores.factory import open_store  # noqa: E402

TOP_K = 10
WARMUP = 3


def urls(args: argparse.Namespace, tmp: Path) -> dict[str, str]:
    return {
        "milvus-lite": f"milvus://{tmp}/bench.db",
        "milvus-server": args.milvus_url,
        "qdrant-edge": f"qdrant://{tmp}/qdrant",
        "qdrant-local": f"qdrant+local://{tmp}/qdrant-local",
        "pgvector": args.pg_url,
    }


def bench_backend(url: str, n: int, n_queries: int) -> dict[str, Any]:
    data = make_data(n=n, n_queries=n_queries)
    store = open_store(url)
    name = f"bench_fr_{uuid.uuid4().hex[:8]}"
    out: dict[str, Any] = {}
    try:
        store.create_collection(name, data.vectors.shape[1])
        t0 = time.perf_counter()
        for start in range(0, n, 2000):
            store.upsert(name, data.records(start, min(start + 2000, n)))
        caps = store.capabilities()
        spec = ann_spec(caps.index_kinds, caps.engine)
        store.build_index(name, spec, timeout_s=600)
        out["_load_s"] = round(time.perf_counter() - t0, 1)
        out["_index"] = spec.kind
        for sel in selections(data):
            truth = exact_top(data, sel.rows, TOP_K)
            for q in data.queries[:WARMUP]:
                store.search(name, q[None, :], TOP_K, flt=sel.flt)
            found, times = [], []
            for q in data.queries:
                t = time.perf_counter()
                hits = store.search(name, q[None, :], TOP_K, flt=sel.flt)[0]
                times.append(time.perf_counter() - t)
                found.append([h.id for h in hits])
            out[f"{sel.level} {sel.form}"] = {
                "recall@10": round(recall(found, truth), 3),
                "min_hits": min(len(f) for f in found),
                "p50_ms": round(1000 * statistics.median(times), 2),
            }
    finally:
        store.drop_collection(name)
        store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["milvus-lite", "milvus-server", "qdrant-edge", "pgvector"])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--milvus-url", default="milvus://127.0.0.1:19530")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5433/quarry?schema=bench_fr")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        table = urls(args, Path(tmp))
        for backend in args.backends:
            res = bench_backend(table[backend], args.n, args.queries)
            results[backend] = res
            print(f"== {backend}: {res.pop('_index')} (load+build {res.pop('_load_s')} s)")
            print(f"{'set':<14}{'recall@10':>10}{'min hits':>9}{'p50 ms':>9}")
            for key, row in res.items():
                print(f"{key:<14}{row['recall@10']:>10.3f}{row['min_hits']:>9}{row['p50_ms']:>9.2f}")
            sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
