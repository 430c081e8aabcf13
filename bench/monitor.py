"""Benchmark the recall monitor's cost: the REST API's 32-client hybrid throughput, monitor on vs off.

Two ``quarry serve`` processes over the same data take turns (on, off, on, off, ...: one at a
time, as Milvus Lite lets one process open its file, in the order on, off, off, on, ... so that a
drift of the machine's load cancels out): ``QUARRY_MONITOR__SAMPLE_RATE`` at its default (0.01)
and at 0 (off). Each phase drives the server with bench/search.py's load (wrk
when installed, else httpx; 32 clients, the SciFact test queries, ``top_k`` 10, hybrid); the
figure is the ratio of the on phases' summed requests/s to the off phases' (target >= 0.95).
Also reported: p50/p99 per phase, errors (non-2xx, transport, degraded answers), and the
monitor's own figures after each "on" phase (``GET .../recall``: samples measured, dropped).

    python bench/monitor.py [--docs 1000] [--seconds 15] [--rounds 2] [--rate 0.01] [--json FILE]

SciFact's first ``--docs`` documents are ingested into ``QUARRY_DATA_DIR`` (default a temporary
folder) first; other ``QUARRY_*`` settings are inherited (e.g. ``QUARRY_STORE__URL`` for pgvector).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.search import _free_port, load, load_wrk, start_server  # noqa: E402
from eval.beir import load_split  # noqa: E402

console = Console()


def ingest(scifact: Path, docs: int, env: dict[str, str], collection: str) -> None:
    """Ingest SciFact's first ``docs`` documents (idempotent: a re-run embeds nothing)."""
    with tempfile.TemporaryDirectory(prefix="quarry-monitor-bench-") as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        with (scifact / "corpus.jsonl").open() as src, corpus.open("w") as dst:
            dst.writelines(itertools.islice(src, docs))
        subprocess.run([sys.executable, "-m", "quarry.cli", "ingest", str(corpus), "--collection", collection],
                       env=env, check=True)


def phase(env: dict[str, str], rate: float, queries: list[str], collection: str, seconds: float,
          loader: str) -> dict[str, Any]:
    """One server with ``sample_rate = rate`` under 32 clients; its load figures and monitor figures."""
    port = _free_port()
    proc = start_server(port, {**env, "QUARRY_MONITOR__SAMPLE_RATE": str(rate)})
    try:
        base = f"http://127.0.0.1:{port}/v1/collections/{collection}"
        for q in queries[:32]:  # warm-up: first calls pay for lazy initialisation
            httpx.post(f"{base}/search", json={"query": q, "top_k": 10}, timeout=60)
        if loader == "wrk":
            result = load_wrk(f"{base}/search", queries, 32, seconds)
        else:
            result = {**asyncio.run(load(f"{base}/search", queries, 32, seconds)), "load": "httpx"}
        figures = httpx.get(f"{base}/recall", timeout=30).json()
        result["recall"] = {
            "samples": sum(b["samples"] for b in figures["buckets"].values()),
            "mean_recall": figures["buckets"]["none"]["mean_recall"],
            "dropped": figures["dropped"], "queued": figures["queued"],
        }
        return {"rate": rate, **result}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scifact", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--docs", type=int, default=1000, help="SciFact documents to ingest")
    parser.add_argument("--seconds", type=float, default=15.0, help="duration of each load phase")
    parser.add_argument("--rounds", type=int, default=2, help="on/off pairs, alternated")
    parser.add_argument("--rate", type=float, default=0.01, help="sample rate of the 'on' phases")
    parser.add_argument("--collection", default="scifact_monitor")
    parser.add_argument("--load", choices=["auto", "wrk", "httpx"], default="auto")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.setdefault("QUARRY_DATA_DIR", tempfile.mkdtemp(prefix="quarry-monitor-data-"))
    ingest(args.scifact, args.docs, env, args.collection)
    queries = list(load_split(args.scifact, "test").queries.values())
    loader = args.load if args.load != "auto" else ("wrk" if shutil.which("wrk") else "httpx")
    phases = []
    for r in range(args.rounds):  # on, off, off, on, ...: a drift of the machine's load cancels out
        for rate in (args.rate, 0.0) if r % 2 == 0 else (0.0, args.rate):
            phases.append(phase(env, rate, queries, args.collection, args.seconds, loader))
            console.print(phases[-1])
    on = [p for p in phases if p["rate"] > 0]
    off = [p for p in phases if p["rate"] == 0]
    ratio = sum(p["rps"] for p in on) / sum(p["rps"] for p in off)
    table = Table("phase", "rate", "req/s", "p50 ms", "p99 ms", "errors", "samples", "dropped",
                  title=f"bench/monitor.py: on/off = {ratio:.3f} ({loader}, 32 clients, {args.docs} docs)")
    for i, p in enumerate(phases, start=1):
        table.add_row(str(i), f"{p['rate']:g}", f"{p['rps']:.1f}", f"{p['p50_ms']:.1f}", f"{p['p99_ms']:.1f}",
                      f"{p['errors']} / {p['requests']}", str(p["recall"]["samples"]), str(p["recall"]["dropped"]))
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"ratio": ratio, "phases": phases, "docs": args.docs}, indent=2))


if __name__ == "__main__":
    main()
