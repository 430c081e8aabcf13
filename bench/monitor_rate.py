"""Benchmark whether the recall monitor's sampler keeps up with a vector store's search throughput.

The dense channel's searches (ANN at the searcher's depth, ids and scores only, as
:class:`retrieval.search.Searcher` asks) are driven against one store collection by ``--threads``
threads for ``--seconds``, and each answer is offered to a real
:class:`monitoring.monitor.RecallMonitor` (default settings: 1 % sampling, 25 % of a core, a
queue of 256) exactly as the searcher offers it. Printed: the store's searches/s, samples
offered (drawn), taken (measured), dropped (queue full) and still queued when the load ends,
and how long the queue then took to drain. The sampler keeps up when taken + queued = offered,
nothing is dropped and the queue drains within a few seconds.

A second phase measures the sampler's capacity: ``--burst`` searches offered at 100 % at once
(most wait in the queue), then the samples measured per second until it is empty.

    python bench/monitor_rate.py [--url milvus://127.0.0.1:19530] [--vectors 20000] [--dim 384]
                                 [--index auto|flat|hnsw] [--seconds 30] [--threads 8] [--json FILE]

Measured (shared 2-core machine, the Milvus 2.3.5 server of scripts/services/milvus.sh on the same
host, 20,000 random unit vectors of 384 dims, the planner's HNSW, depth 200, 8 threads, 30 s):
see docs/index-health.md ("The sampler's rate") for the figures and the command.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from indexing.index_sizing import GIB  # noqa: E402
from indexing.planner import plan_for_store  # noqa: E402
from monitoring.monitor import RecallMonitor  # noqa: E402
from quarry.settings import MonitorSettings  # noqa: E402
from stores.base import IndexSpec, VectorRecord, VectorStore  # noqa: E402
from stores.factory import open_store  # noqa: E402

DEPTH = 200  # the searcher's depth at the default rank window (100 x DEPTH_FACTOR 2)
TOP_K = 10


class Draws:
    """``random.random`` that counts the draws under ``rate`` (samples offered)."""

    def __init__(self, rate: float, seed: int = 0) -> None:
        self.rate = rate
        self.offered = 0
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        """One uniform ``[0, 1)`` number."""
        with self._lock:
            value = float(self._rng.random())
            if value < self.rate:
                self.offered += 1
            return value


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def fill(store: VectorStore, name: str, n: int, dim: int, index: str) -> IndexSpec:
    """A collection of ``n`` random unit vectors under the planner's index (or the kind asked for)."""
    rng = np.random.default_rng(1)
    store.create_collection(name, dim)
    data = unit(rng, n, dim)
    for start in range(0, n, 2000):
        store.upsert(name, [VectorRecord(f"r{i}", data[i], {"tag": "a" if i % 10 else "b"})
                            for i in range(start, min(n, start + 2000))])
    plan = plan_for_store(store, n, dim, 16 * GIB, top_k=DEPTH)
    spec = plan.spec if index == "auto" else (IndexSpec("FLAT") if index == "flat" else plan.spec)
    if index == "hnsw" and spec.kind != "HNSW":
        spec = IndexSpec("HNSW", params={"M": 16, "efConstruction": 200}, search_params={"ef": 64})
    store.build_index(name, spec, 600)
    return spec


def drive(store: VectorStore, name: str, monitor: RecallMonitor, dim: int, threads: int, seconds: float) -> int:
    """Search from ``threads`` threads for ``seconds``, offering every answer; returns the searches made."""
    stop = time.monotonic() + seconds
    done = [0] * threads

    def worker(i: int) -> None:
        rng = np.random.default_rng(100 + i)
        while time.monotonic() < stop:
            query = unit(rng, 1, dim)
            hits = store.search(name, query, DEPTH, with_payload=False)[0]
            monitor.offer(name, "cosine", query[0], None, TOP_K, hits)
            done[i] += 1

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(done)


def measured(monitor: RecallMonitor) -> int:
    return int(getattr(monitor, "measured", -1))


def run(args: argparse.Namespace) -> dict[str, Any]:
    store = open_store(args.url)
    name = f"monrate_{uuid.uuid4().hex[:8]}"
    try:
        spec = fill(store, name, args.vectors, args.dim, args.index)
        draws = Draws(args.rate)
        monitor = RecallMonitor(store, MonitorSettings(sample_rate=args.rate), draw=draws)
        started = time.perf_counter()
        searches = drive(store, name, monitor, args.dim, args.threads, args.seconds)
        elapsed = time.perf_counter() - started
        queued_at_end, dropped = monitor.queued, monitor.dropped
        taken_at_end = draws.offered - dropped - queued_at_end
        drain_started = time.perf_counter()
        drained = monitor.drain(args.drain_s)
        drain_s = time.perf_counter() - drain_started
        load = {
            "searches": searches, "searches_per_s": round(searches / elapsed, 1), "offered": draws.offered,
            "taken_during_load": taken_at_end, "dropped": dropped, "queued_at_end": queued_at_end,
            "drain_s": round(drain_s, 2), "drained": drained, "monitor_measured": measured(monitor),
        }
        monitor.close()
        # capacity: a burst of samples at 100 %, then samples measured per second until empty
        burst = RecallMonitor(store, MonitorSettings(sample_rate=1.0, queue_size=args.burst + 1))
        rng = np.random.default_rng(7)
        queries = unit(rng, args.burst, args.dim)
        answers = store.search(name, queries, DEPTH, with_payload=False)
        started = time.perf_counter()
        for vector, hits in zip(queries, answers, strict=True):
            burst.offer(name, "cosine", vector, None, TOP_K, hits)
        ok = burst.drain(args.drain_s)
        capacity_s = time.perf_counter() - started
        figures = burst.figures(name)["buckets"]["none"]
        burst.close()
        capacity = {"burst": args.burst, "drained": ok, "seconds": round(capacity_s, 2),
                    "samples_per_s": round(args.burst / capacity_s, 2), "mean_recall": figures["mean_recall"]}
        needed = load["searches_per_s"] * 0.01
        return {"url": args.url, "vectors": args.vectors, "dim": args.dim, "index": spec.kind,
                "threads": args.threads, "rate": args.rate, "load": load, "capacity": capacity,
                "needed_at_1pct_per_s": round(needed, 2),
                "headroom": round(capacity["samples_per_s"] / needed, 1) if needed else None}
    finally:
        store.drop_collection(name)
        store.close()


def main() -> None:
    """Run the benchmark (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="milvus://127.0.0.1:19530")
    parser.add_argument("--vectors", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--index", choices=("auto", "flat", "hnsw"), default="auto")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rate", type=float, default=0.01, help="QUARRY_MONITOR__SAMPLE_RATE under load")
    parser.add_argument("--burst", type=int, default=200, help="samples offered at once for the capacity phase")
    parser.add_argument("--drain-s", type=float, default=300.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
