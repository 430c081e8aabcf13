"""Whether one client's CPU-heavy queries slow everyone else's (issue 20, finding 4).

A real ``quarry serve`` process on loopback, over the first ``--docs`` SciFact documents. Two
light clients run alone first, then beside ``--heavy`` clients that loop 8,192-character BM25
queries (SciFact text, many distinct terms), each phase ``--seconds`` long:

* a light search client: short SciFact test queries, BM25 mode, one at a time;
* a liveness poller: ``GET /healthz``, one at a time.

The figures are each light client's p50/p99 latency alone and under the heavy load, and their
ratio (loaded / alone, same run): a ratio near 1 means the heavy queries' work did not stall the
event loop the light requests are served on. The load comes from httpx in this process (it
competes with the server for the CPUs; the ratio is the figure to compare between commits).

    python bench/loop_starvation.py [--docs 1000] [--seconds 15] [--heavy 4] [--json FILE]
                                    [--data-dir DIR] [--scifact DIR]

``--data-dir`` (default: a folder under the system temp dir, kept between runs) is ingested
once (idempotent), so two checkouts can be measured on the same data, one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eval.beir import load_split  # noqa: E402
from indexing.sources import iter_jsonl  # noqa: E402
from tests.serve import QuarryServer  # noqa: E402

LONG_CHARS = 8192


def ingest(scifact: Path, data_dir: Path, docs: int) -> None:
    """Put the first ``docs`` SciFact documents in collection ``scifact`` (skipped when done)."""
    from quarry.service import Quarry
    from quarry.settings import Settings

    quarry = Quarry(Settings(data_dir=data_dir))
    try:
        if "scifact" not in {c.name for c in quarry.list_collections()}:
            quarry.create_collection("scifact", language="en")
        quarry.upsert("scifact", list(itertools.islice(iter_jsonl(scifact / "corpus.jsonl"), docs)))
    finally:
        quarry.close()


async def _loop(http: httpx.AsyncClient, request: Any, until: float, latencies: list[float], errors: list[str]) -> None:
    i = 0
    while time.perf_counter() < until:
        started = time.perf_counter()
        try:
            r = await request(http, i)
            if r.status_code != 200:
                errors.append(str(r.status_code))
        except httpx.HTTPError as exc:
            errors.append(type(exc).__name__)
        latencies.append((time.perf_counter() - started) * 1000)
        i += 1


def _stats(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "n": len(ordered),
        "p50_ms": statistics.median(ordered) if ordered else float("nan"),
        "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan"),
    }


async def phase(base: str, short: list[str], long: list[str], heavy: int, seconds: float) -> dict[str, Any]:
    search = f"{base}/v1/collections/scifact/search"
    until = time.perf_counter() + seconds
    light: list[float] = []
    health: list[float] = []
    loaded: list[list[float]] = [[] for _ in range(heavy)]
    errors: list[str] = []

    def light_request(http: httpx.AsyncClient, i: int) -> Any:
        return http.post(search, json={"query": short[i % len(short)], "mode": "bm25", "top_k": 10})

    def health_request(http: httpx.AsyncClient, _: int) -> Any:
        return http.get(f"{base}/healthz")

    def heavy_request(k: int) -> Any:
        return lambda http, i: http.post(
            search, json={"query": long[(i + k) % len(long)], "mode": "bm25", "top_k": 10}
        )

    limits = httpx.Limits(max_connections=heavy + 2, max_keepalive_connections=heavy + 2)
    async with httpx.AsyncClient(limits=limits, timeout=60) as http:
        await asyncio.gather(
            _loop(http, light_request, until, light, errors),
            _loop(http, health_request, until, health, errors),
            *(_loop(http, heavy_request(k), until, loaded[k], errors) for k in range(heavy)),
        )
    heavy_n = sum(len(x) for x in loaded)
    return {
        "light_search": _stats(light), "healthz": _stats(health),
        "heavy_req_per_s": heavy_n / seconds, "errors": len(errors),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--heavy", type=int, default=4)
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "quarry-bench-loop")
    parser.add_argument("--scifact", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    scifact = args.scifact
    ingest(scifact, args.data_dir, args.docs)
    short = list(load_split(scifact, "test").queries.values())
    text = " ".join(d.text for d in itertools.islice(iter_jsonl(scifact / "corpus.jsonl"), 2000, 2400))
    long = [text[i * LONG_CHARS : (i + 1) * LONG_CHARS] for i in range(len(text) // LONG_CHARS)]
    env = {**os.environ, "QUARRY_DATA_DIR": str(args.data_dir), "PYTHONPATH": str(REPO)}
    server = QuarryServer(env).wait_ready()
    try:
        base = server.url
        for q in short[:20]:  # warm the caches (stemmer, jieba, the BM25 snapshot)
            httpx.post(f"{base}/v1/collections/scifact/search", json={"query": q, "mode": "bm25"}, timeout=60)
        alone = asyncio.run(phase(base, short, long, 0, args.seconds))
        loaded = asyncio.run(phase(base, short, long, args.heavy, args.seconds))
    finally:
        server.stop()
    ratios = {
        name: loaded[name]["p50_ms"] / alone[name]["p50_ms"] for name in ("light_search", "healthz")
    }
    result = {"docs": args.docs, "heavy_clients": args.heavy, "seconds": args.seconds, "alone": alone,
              "loaded": loaded, "p50_ratio_loaded_over_alone": ratios}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
