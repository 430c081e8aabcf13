"""Benchmark the recall monitor's cost: the REST API's 32-client hybrid throughput, monitor on vs off.

Two ``quarry serve`` processes run side by side over two copies of the same data (Milvus Lite
and SQLite let one process open a file): one with ``QUARRY_MONITOR__SAMPLE_RATE`` at its default
(0.01, "on"), one at 0 ("off"). They take turns under load, in short phases (on, off, off, on,
...: a drift of the machine's load cancels out), without restarts between phases. Each phase
drives one server with bench/search.py's load (wrk when installed, else httpx; 32 clients, the
SciFact test queries, ``top_k`` 10, hybrid). Each round's figure is its on/off requests/s ratio;
reported: the median ratio over the rounds (target >= 0.95), its quartiles, min and max, the
pooled ratio (summed on / summed off), p99 and errors (non-2xx, transport, degraded answers) per
phase, and the "on" server's monitor figures at the end (``GET .../recall``: samples, dropped).

    python bench/monitor.py [--docs 1000] [--seconds 8] [--rounds 12] [--rate 0.01] [--json FILE]

SciFact's first ``--docs`` documents are ingested into ``QUARRY_DATA_DIR`` (default a temporary
folder) first; other ``QUARRY_*`` settings are inherited (e.g. ``QUARRY_STORE__URL`` for pgvector).

Measured 2026-12-03 (shared 2-core machine, load average 3-7 and bench/reindex_load.py running
beside it; torch MiniLM, Milvus Lite, 600 docs / 854 chunks)::

    QUARRY_DATA_DIR=DIR python bench/monitor.py --docs 600 --collection h22load --skip-ingest \
        --seconds 6 --rounds 12

rounds on/off: 0.838 0.565 1.643 1.180 1.534 1.565 0.962 0.782 0.876 0.943 1.075 1.535; median
1.018 (target >= 0.95), quartiles 0.848-1.535, min 0.565, max 1.643, pooled 1.055; 0 errors;
the "on" server measured 13 samples (recall 1.0, 0 dropped). The spread is the machine's, not
the monitor's (the phases range 14.6-38.5 req/s on both sides).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import signal
import statistics
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

from bench.search import load, load_wrk  # noqa: E402
from eval.beir import load_split  # noqa: E402
from tests.serve import QuarryServer  # noqa: E402

console = Console()


def ingest(scifact: Path, docs: int, env: dict[str, str], collection: str) -> None:
    """Ingest SciFact's first ``docs`` documents (idempotent: a re-run embeds nothing)."""
    with tempfile.TemporaryDirectory(prefix="quarry-monitor-bench-") as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        with (scifact / "corpus.jsonl").open() as src, corpus.open("w") as dst:
            dst.writelines(itertools.islice(src, docs))
        subprocess.run([sys.executable, "-m", "quarry.cli", "ingest", str(corpus), "--collection", collection],
                       env=env, check=True)


def measure(base: str, queries: list[str], seconds: float, loader: str) -> dict[str, Any]:
    """32 clients on ``base``'s search for ``seconds``; the load figures."""
    if loader == "wrk":
        return load_wrk(f"{base}/search", queries, 32, seconds)
    return {**asyncio.run(load(f"{base}/search", queries, 32, seconds)), "load": "httpx"}


def monitor_figures(base: str) -> dict[str, Any]:
    """The monitor's counts (``GET .../recall``): samples measured, mean recall, dropped, queued."""
    figures = httpx.get(f"{base}/recall", timeout=30).json()
    return {
        "samples": sum(b["samples"] for b in figures["buckets"].values()),
        "mean_recall": figures["buckets"]["none"]["mean_recall"],
        "dropped": figures["dropped"], "queued": figures["queued"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scifact", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--docs", type=int, default=1000, help="SciFact documents to ingest")
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each load phase")
    parser.add_argument("--rounds", type=int, default=12, help="on/off pairs, alternated")
    parser.add_argument("--rate", type=float, default=0.01, help="sample rate of the 'on' server")
    parser.add_argument("--collection", default="scifact_monitor")
    parser.add_argument("--load", choices=["auto", "wrk", "httpx"], default="auto")
    parser.add_argument("--skip-ingest", action="store_true", help="QUARRY_DATA_DIR holds the collection already")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.setdefault("QUARRY_DATA_DIR", tempfile.mkdtemp(prefix="quarry-monitor-data-"))
    if not args.skip_ingest:
        ingest(args.scifact, args.docs, env, args.collection)
    copy = tempfile.mkdtemp(prefix="quarry-monitor-copy-")  # Milvus Lite and SQLite: one process per file
    shutil.copytree(env["QUARRY_DATA_DIR"], copy, dirs_exist_ok=True)
    dirs = {"on": env["QUARRY_DATA_DIR"], "off": copy}
    queries = list(load_split(args.scifact, "test").queries.values())
    loader = args.load if args.load != "auto" else ("wrk" if shutil.which("wrk") else "httpx")
    rates = {"on": args.rate, "off": 0.0}
    servers: dict[str, QuarryServer] = {}
    bases = {}
    try:
        for side in ("on", "off"):
            servers[side] = QuarryServer({**env, "QUARRY_DATA_DIR": dirs[side],
                                          "QUARRY_MONITOR__SAMPLE_RATE": str(rates[side])}).wait_ready()
            bases[side] = f"{servers[side].url}/v1/collections/{args.collection}"
            for q in queries[:64]:  # warm-up: first calls pay for lazy initialisation
                httpx.post(f"{bases[side]}/search", json={"query": q, "top_k": 10}, timeout=60)
        phases = []
        for r in range(args.rounds):  # on, off, off, on, ...: a drift of the machine's load cancels out
            for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
                result = measure(bases[side], queries, args.seconds, loader)
                phases.append({"round": r + 1, "side": side, "rate": rates[side], **result})
            on, off = (next(p for p in phases[-2:] if p["side"] == s) for s in ("on", "off"))
            console.print(f"round {r + 1}: on {on['rps']:.1f} req/s, off {off['rps']:.1f} req/s, "
                          f"ratio {on['rps'] / max(off['rps'], 1e-9):.3f}, errors {on['errors']}+{off['errors']}")
        figures = monitor_figures(bases["on"])
    finally:
        for server in servers.values():
            if server.stop(timeout_s=30) == -signal.SIGKILL:  # reported, not left behind
                console.print(f"server {server.proc.pid} ignored SIGTERM for 30 s: killed")
    by_round = {(p["round"], p["side"]): p["rps"] for p in phases}
    ratios = [by_round[r, "on"] / max(by_round[r, "off"], 1e-9) for r in range(1, args.rounds + 1)]
    pooled = sum(p["rps"] for p in phases if p["side"] == "on") / sum(p["rps"] for p in phases if p["side"] == "off")
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    summary = {"median_ratio": statistics.median(ratios), "q1": quartiles[0], "q3": quartiles[2],
               "min": min(ratios), "max": max(ratios), "pooled_ratio": pooled, "rounds": len(ratios),
               "errors": sum(p["errors"] for p in phases), "monitor": figures}
    table = Table("round", "on req/s", "off req/s", "on/off", "on p99 ms", "off p99 ms", "errors",
                  title=f"bench/monitor.py: median on/off = {summary['median_ratio']:.3f} "
                        f"({loader}, 32 clients, {args.docs} docs, {args.seconds:g} s phases)")
    for r, ratio in enumerate(ratios, start=1):
        on, off = (next(p for p in phases if p["round"] == r and p["side"] == s) for s in ("on", "off"))
        table.add_row(str(r), f"{on['rps']:.1f}", f"{off['rps']:.1f}", f"{ratio:.3f}", f"{on['p99_ms']:.0f}",
                      f"{off['p99_ms']:.0f}", str(on["errors"] + off["errors"]))
    console.print(table)
    console.print(summary)
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "phases": phases, "docs": args.docs}, indent=2))


if __name__ == "__main__":
    main()
