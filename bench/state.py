"""Benchmark the state of record's hot paths: search hydration (``get_chunks``) and ingestion (``write_batch``).

Compares two source trees in one run, alternated: ``--base`` (e.g. the commit before a change,
exported with ``git archive``) and ``--head`` (default: this checkout). Each round starts one
child process per tree (``PYTHONPATH`` = that tree), on SQLite (a fresh file) and, with
``--pg-url``, PostgreSQL (a fresh schema of the child's own); the order of the trees flips every
round. A child measures, on one collection of ``--docs`` documents of 4 chunks each:

* ``hydrate``: ``get_chunks`` of 10 random chunk ids (what a search page reads), ``--reads`` times;
  median µs per call;
* ``write``: ``write_batch`` of 64 new documents (256 chunks, with their texts and tokens),
  ``--writes`` times; median ms per batch.

Prints each round and the medians of head/base ratios (< 1: head is faster). Example::

    git archive 2010aa7 | (mkdir -p /tmp/base && tar -x -C /tmp/base)
    python bench/state.py --base /tmp/base --pg-url postgresql://postgres@127.0.0.1:5441/quarry --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

CHILD = r"""
import json, random, statistics, sys, time, uuid
from pathlib import Path
from indexing.docstore import StoredChunk, StoredDocument, open_docstore
url, folder, docs, reads, writes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
state = open_docstore(url, Path(folder))
state.put_collection("c", {})
words = ("alpha beta gamma delta epsilon zeta eta theta iota kappa " * 8).split()
def batch(prefix, n):
    documents, chunks = [], []
    for i in range(n):
        d = f"{prefix}{i}"
        documents.append(StoredDocument(d, uuid.uuid4().hex, "t", " ".join(words), {"n": i}))
        chunks += [StoredChunk(f"{d}#{p}", d, p, " ".join(words[:40]), words[:40], {"document_id": d, "n": i})
                   for p in range(4)]
    return documents, chunks
for start in range(0, docs, 256):
    d, c = batch(f"d{start}_", min(256, docs - start))
    state.write_batch("c", d, c, [])
ids = [f"d{s}_{i}#{p}" for s in range(0, docs, 256) for i in range(min(256, docs - s)) for p in range(4)]
rng = random.Random(7)
hydrate = []
for _ in range(reads):
    pick = rng.sample(ids, 10)
    t = time.perf_counter(); got = state.get_chunks("c", pick); hydrate.append(time.perf_counter() - t)
    assert len(got) == 10
write = []
for w in range(writes):
    d, c = batch(f"w{w}_", 64)
    t = time.perf_counter(); state.write_batch("c", d, c, []); write.append(time.perf_counter() - t)
state.close()
print(json.dumps({"hydrate_us": statistics.median(hydrate) * 1e6, "write_ms": statistics.median(write) * 1e3}))
"""


def _pg_schema(pg_url: str) -> tuple[str, str]:
    import psycopg

    name = f"bench_state_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    sep = "&" if "?" in pg_url else "?"
    return name, f"{pg_url}{sep}options=-csearch_path%3D{name}"


def _drop(pg_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {name} CASCADE")


def _child(tree: Path, url: str, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        url = url or f"sqlite://{folder}/state.sqlite"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        out = subprocess.run(
            [sys.executable, "-c", CHILD, url, folder, str(args.docs), str(args.reads), str(args.writes)],
            env=env, cwd=tree, capture_output=True, text=True, check=True,
        )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    """Run the rounds and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--head", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--pg-url", default="")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--docs", type=int, default=2048)
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--writes", type=int, default=30)
    args = parser.parse_args()
    backends = ["sqlite"] + (["postgres"] if args.pg_url else [])
    ratios: dict[str, list[float]] = {}
    random.seed(1)
    for r in range(args.rounds):
        trees = [("base", args.base), ("head", args.head)]
        if r % 2:
            trees.reverse()
        for backend in backends:
            got: dict[str, dict[str, float]] = {}
            for label, tree in trees:
                schema, url = _pg_schema(args.pg_url) if backend == "postgres" else ("", "")
                try:
                    got[label] = _child(tree, url, args)
                finally:
                    if schema:
                        _drop(args.pg_url, schema)
            for metric in ("hydrate_us", "write_ms"):
                ratio = got["head"][metric] / got["base"][metric]
                ratios.setdefault(f"{backend} {metric}", []).append(ratio)
                print(f"round {r} {backend:8} {metric:10} base {got['base'][metric]:9.1f} "
                      f"head {got['head'][metric]:9.1f} head/base {ratio:.3f}", flush=True)
    print(f"-- medians over {args.rounds} rounds ({time.strftime('%H:%M')}):")
    for name, values in ratios.items():
        print(f"{name:22} head/base {statistics.median(values):.3f}")


if __name__ == "__main__":
    main()
