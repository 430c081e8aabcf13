"""32-client hybrid search through ``quarry serve --workers 1`` and ``--workers 2``, alternately, in one run.

Both servers run at once on the same shared backends (the vector store: pgvector at
``QUARRY_TEST_PG_URL`` or the Milvus server; the docstore: a PostgreSQL schema of this run's own,
dropped at the end) and serve one SciFact collection (or its first ``--subset`` documents),
ingested first in this process. Each round drives the 1-worker server, then the 2-worker one
(the order flips every round, so that a drift of the shared machine's load lands on both) with
``--clients`` connections for ``--seconds`` each, sending the SciFact test queries (300, cycled,
``top_k`` 10, ``mode`` hybrid) through ``wrk`` (Debian ``wrk``: ~1% of a core) or, without it,
httpx in this process. A round prints req/s, p50/p99 and errors of both, the ratio 2w/1w, the
servers' own CPU per request (all their processes, from ``/proc``) and how busy the machine's
cores were (``/proc/stat``: everything else on the machine included). The summary is the median
ratio over the rounds. A 1-client phase per server first splits a query's wall time by stage
(the response's ``timings_ms``: ``embed`` = query vector, ``bm25``, ``ann`` = the store's search,
``fuse``, ``hydrate`` = texts from the docstore).

    eval "$(bash scripts/services.sh env)"
    python bench/workers.py [--store pgvector|milvus] [--rounds 5] [--seconds 15] [--clients 32]
                            [--subset N] [--embedding-url URL] [--json FILE]

The ingest embeds with the torch MiniLM through the test suite's vector memo
(``tests/embedding_cache.py``: rows computed once per machine), unless ``--no-memo``; the servers
embed queries with ``--embedding-url`` (default: the default encoder: ONNX int8 since 2026-12-03,
torch before; the figures below are torch's: pass ``--embedding-url torch://all-MiniLM-L6-v2`` to
repeat them).

Measured 2026-12-03 17:51 (load average ~6.5, ``--rounds 3 --seconds 15``, torch): 2w/1w 1.279,
0.966, 1.293, median **1.279** (1w 32.1 / 39.4 / 32.4 req/s, 2w 41.0 / 38.0 / 41.9). Earlier
(2 cores at load average 17-29; pgvector + PostgreSQL docstore, full SciFact,
``--rounds 4 --seconds 20``, wrk, torch): 2w/1w 1.055, 0.649, 1.025 (median 1.025) with each worker's
torch on all cores; 2.121, 1.572, 0.484, 0 (median 1.028; the 2-worker server answered nothing in
the last round) with one torch thread per worker: those 0 rounds were this script's unread
stderr pipe, since fixed. Every round and the bound: docs/performance.md#workers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.search import load, load_wrk  # noqa: E402
from eval.beir import load_split  # noqa: E402
from indexing.sources import read_documents  # noqa: E402
from tests.serve import QuarryServer  # noqa: E402

console = Console()
PG_URL = os.environ.get("QUARRY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5433/quarry")
MILVUS_URL = os.environ.get("QUARRY_TEST_MILVUS_URL", "milvus://127.0.0.1:19530")
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------- /proc
def _tree(root: int) -> list[int]:
    """``root`` and its descendants (uvicorn's workers, an encoder child process)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, ppid in parents.items() if ppid in frontier]
        found += frontier
    return found


def process_cpu_s(root: int) -> float:
    """CPU seconds (user + system) used so far by ``root``'s process tree."""
    total = 0
    for pid in _tree(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLK_TCK


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores since boot (``/proc/stat``)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return float(sum(values) - idle), float(sum(values))


# ------------------------------------------------------------------------------------- the setup
def pg_schema_url(name: str) -> str:
    """The PostgreSQL URL with ``name`` (created here) first on the ``search_path``."""
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options={quote(f'-csearch_path={name}')}"


def drop_schema(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def ingest(env: dict[str, str], scifact: Path, collection: str, subset: int | None, memo: bool) -> int:
    """SciFact (or its first ``subset`` documents) into ``collection``; returns the document count."""
    from embedding.sentence_transformers import SentenceTransformerEmbedder
    from quarry.service import Quarry
    from quarry.settings import Settings
    from tests.embedding_cache import torch_vectors

    saved = dict(os.environ)
    os.environ.update(env)
    try:
        settings = Settings()
        embedder = None
        if memo:
            embedder = torch_vectors(SentenceTransformerEmbedder("all-MiniLM-L6-v2", batch_size=64, device="cpu"))
        quarry = Quarry(settings, embedder=embedder)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        quarry.create_collection(collection, language="en")
        docs = list(read_documents(scifact))[:subset]
        quarry.upsert(collection, docs)
        return len(docs)
    finally:
        quarry.close()


def start(workers: int, env: dict[str, str]) -> QuarryServer:
    """A ``quarry serve --workers N`` on a free port, ready; its log goes to ``$QUARRY_DATA_DIR/serve.log``."""
    log = Path(env["QUARRY_DATA_DIR"]) / "serve.log"
    log.unlink(missing_ok=True)
    return QuarryServer(env, args=["--workers", str(workers)], log=log).wait_ready(timeout_s=400)


# -------------------------------------------------------------------------------- measurements
def stages(url: str, queries: list[str], n: int = 30) -> dict[str, float]:
    """Mean ``timings_ms`` per stage over ``n`` sequential hybrid queries (1 client)."""
    sums: dict[str, float] = {}
    with httpx.Client(timeout=60) as http:
        for q in queries[:n]:
            r = http.post(url, json={"query": q, "top_k": 10, "mode": "hybrid"})
            r.raise_for_status()
            for key, ms in r.json()["timings_ms"].items():
                if isinstance(ms, int | float):
                    sums[key] = sums.get(key, 0.0) + ms
    return {k: v / n for k, v in sums.items()}


def measure(server: QuarryServer, url: str, queries: list[str], clients: int, seconds: float,
            loader: str) -> dict[str, Any]:
    """One load phase: wrk's (or httpx's) figures, the server's CPU per request, the machine's busy share."""
    cpu0, (busy0, total0) = process_cpu_s(server.proc.pid), machine_busy()
    if loader == "wrk":
        out = load_wrk(url, queries, clients, seconds)
    else:
        import asyncio

        out = {**asyncio.run(load(url, queries, clients, seconds)), "load": "httpx"}
    cpu1, (busy1, total1) = process_cpu_s(server.proc.pid), machine_busy()
    out["server_cpu_ms_per_request"] = (cpu1 - cpu0) * 1000 / max(1, out["requests"])
    out["server_cores"] = (cpu1 - cpu0) / seconds
    out["machine_busy"] = (busy1 - busy0) / max(1.0, total1 - total0)
    return out


def main() -> None:  # noqa: PLR0915 - one linear script
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scifact", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--store", choices=["pgvector", "milvus"], default="pgvector")
    parser.add_argument("--subset", type=int, default=None, help="first N SciFact documents (default: all 5,183)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--embedding-url", default=None, help="the servers' QUARRY_EMBEDDING__URL")
    parser.add_argument("--load", choices=["auto", "wrk", "httpx"], default="auto")
    parser.add_argument("--no-memo", action="store_true", help="ingest with the model, not the tests' vector memo")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    loader = args.load if args.load != "auto" else ("wrk" if shutil.which("wrk") else "httpx")

    schema = f"quarry_bench_{uuid.uuid4().hex[:10]}"
    collection = f"bench_workers_{uuid.uuid4().hex[:8]}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("QUARRY_")},
        "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO),
        "QUARRY_STORE__URL": PG_URL if args.store == "pgvector" else MILVUS_URL,
        "QUARRY_DOCSTORE__URL": pg_schema_url(schema),
    }
    if args.embedding_url:
        env["QUARRY_EMBEDDING__URL"] = args.embedding_url
    servers: dict[int, tuple[QuarryServer, str]] = {}
    results: dict[str, Any] = {"config": {**vars(args), "scifact": str(args.scifact), "json": None,
                                          "load": loader, "store": env["QUARRY_STORE__URL"]}, "rounds": []}
    with tempfile.TemporaryDirectory(prefix="quarry-bench-workers-") as tmp:
        try:
            env["QUARRY_DATA_DIR"] = str(Path(tmp) / "ingest")
            started = time.perf_counter()
            docs = ingest(env, args.scifact, collection, args.subset, memo=not args.no_memo)
            console.print(f"ingested {docs} documents into {collection} in {time.perf_counter() - started:.0f} s")
            queries = list(load_split(args.scifact, "test").queries.values())
            for workers in (1, 2):
                server = start(workers, {**env, "QUARRY_DATA_DIR": str(Path(tmp) / f"w{workers}")})
                url = f"{server.url}/v1/collections/{collection}/search"
                servers[workers] = (server, url)
                for q in queries[:16]:  # lazy initialisation, in every worker (connections land on either)
                    httpx.post(url, json={"query": q, "top_k": 10}, timeout=60).raise_for_status()
            results["stages_ms"] = {str(w): stages(url, queries) for w, (_, url) in servers.items()}
            console.print(f"stages, 1 client (ms): {json.dumps(results['stages_ms'], default=lambda x: round(x, 2))}")
            for i in range(args.rounds):
                order = (1, 2) if i % 2 == 0 else (2, 1)
                row = {str(w): measure(*servers[w], queries, args.clients, args.seconds, loader) for w in order}
                row["ratio"] = row["2"]["rps"] / row["1"]["rps"] if row["1"]["rps"] else float("nan")
                results["rounds"].append(row)
                console.print(f"round {i + 1}: " + "; ".join(
                    f"{w}w {row[w]['rps']:.1f} req/s p50 {row[w]['p50_ms']:.0f} p99 {row[w]['p99_ms']:.0f} ms, "
                    f"{row[w]['errors']} err, server {row[w]['server_cpu_ms_per_request']:.1f} ms CPU/req "
                    f"({row[w]['server_cores']:.2f} cores), machine {row[w]['machine_busy']:.0%} busy"
                    for w in ("1", "2")) + f"; 2w/1w {row['ratio']:.3f}")
            ratios = [r["ratio"] for r in results["rounds"] if r["ratio"] == r["ratio"]]  # nan: 1w answered nothing
            results["median_ratio"] = statistics.median(ratios) if ratios else float("nan")
            console.print(f"median 2w/1w throughput over {args.rounds} rounds: {results['median_ratio']:.3f}")
        finally:
            for server, _ in servers.values():
                server.stop()
            try:
                from quarry.service import Quarry
                from quarry.settings import Settings

                os.environ.update({k: v for k, v in env.items() if k.startswith("QUARRY_")})
                cleanup = Quarry(Settings())
                cleanup.drop_collection(collection)
                cleanup.close()
            finally:
                drop_schema(schema)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
