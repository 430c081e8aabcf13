"""Benchmark the query path, each figure beside a baseline measured in the same run.

1. BM25 queries/s: Quarry's BM25 (bm25s snapshot, top-10 with filters compiled away) against
   rank-bm25's BM25Okapi on the same tokens, over the SciFact corpus and test queries.
2. REST search API (hybrid, no rerank): a real ``quarry serve`` process on loopback, driven
   with 1 client and with 32 concurrent connections: p50/p99 latency, requests/s, errors
   (transport errors, non-2xx answers, and 200s whose ``degraded`` is not empty: a query answered
   from BM25 alone is cheaper and must not pass for a hybrid one). The load comes from ``wrk``
   (Debian package ``wrk``: a C event loop that needs ~1% of a core, so the server keeps the
   machine's 2 cores) when it is installed, else from httpx in this process
   (``--load httpx``; it competes with the server for the CPUs and lowers its figures).
   Each request sends the next SciFact test query (300, cycled) with ``top_k`` 10.

    python bench/search.py [--json FILE] [--embedding-url onnx://all-MiniLM-L6-v2?quantize=int8]
                           [--load auto|wrk|httpx]

The server uses ``QUARRY_DATA_DIR`` (default ``./data``) and ingests SciFact there first if
needed (idempotent: a re-run embeds nothing). It inherits the environment, so other settings
apply too, e.g. ``QUARRY_EMBEDDING__QUERY_PROCESS=true`` (the query encoder in a child process).

3. Two source trees, alternated in one run (``--compare-ref REF``): the REST figure of 2., 32
   clients, for the code at git ``REF`` (the baseline, exported with ``git archive`` into a
   temporary folder) and this checkout as it is, uncommitted changes included (the candidate; or
   ``--candidate-ref REF2``). Each side ingests SciFact with its own code into a data dir of its
   own (``--compare-data DIR`` keeps them between runs; default: a temporary folder), then both
   servers run at once, each started from its tree (``cwd`` and ``PYTHONPATH``: the first lines
   print which ``quarry`` each imports), and take turns under load for ``--rounds`` rounds of
   ``--seconds`` (the order flips every round, so that a drift of the machine's load lands on
   both). Reported: each round's candidate/baseline requests/s ratio, their median, quartiles,
   min and max, the pooled ratio (summed candidate / summed baseline), p50 and errors per phase.

    python bench/search.py --compare-ref main [--candidate-ref REF2] [--rounds 8] [--seconds 15]
                           [--compare-data DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rank_bm25 import BM25Okapi
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eval.beir import load_split  # noqa: E402
from indexing.sources import iter_jsonl  # noqa: E402
from quarry.settings import BM25Settings  # noqa: E402
from indexing.bm25 import BM25Index  # noqa: E402
from indexing.text import tokenize  # noqa: E402
from tests.serve import QuarryServer  # noqa: E402

console = Console()


def bench_bm25(scifact: Path, repeats: int) -> dict[str, Any]:
    docs = list(iter_jsonl(scifact / "corpus.jsonl"))
    tokens = [tokenize(f"{d.title}\n{d.text}", "en") for d in docs]
    queries = [tokenize(q, "en") for q in load_split(scifact, "test").queries.values()]
    ours = BM25Index.build([(d.id, d.id, t, {}) for d, t in zip(docs, tokens, strict=True)], BM25Settings(), 1)
    okapi = BM25Okapi(tokens)

    def run_ours() -> None:
        for q in queries:
            ours.search(q, 10)

    def run_okapi() -> None:
        for q in queries:
            scores = okapi.get_scores(q)
            np.argpartition(-scores, 10)[:10]

    ours_s = min(_timed(run_ours) for _ in range(repeats))
    okapi_s = _timed(run_okapi)
    ours_qps, okapi_qps = len(queries) / ours_s, len(queries) / okapi_s
    return {"quarry_qps": ours_qps, "rank_bm25_qps": okapi_qps, "speedup": ours_qps / okapi_qps,
            "queries": len(queries), "documents": len(docs)}


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


async def _client(http: httpx.AsyncClient, url: str, queries: list[str], until: float, offset: int,
                  latencies: list[float], errors: list[str]) -> None:
    i = offset
    while time.perf_counter() < until:
        body = {"query": queries[i % len(queries)], "top_k": 10, "mode": "hybrid"}
        started = time.perf_counter()
        try:
            r = await http.post(url, json=body)
            if r.status_code != 200:
                errors.append(str(r.status_code))
            elif r.json()["degraded"]:  # answered, but not as asked: BM25 alone is cheaper
                errors.append("degraded")
        except httpx.HTTPError as exc:
            errors.append(type(exc).__name__)
        latencies.append((time.perf_counter() - started) * 1000)
        i += 1


async def load(url: str, queries: list[str], clients: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=30) as http:
        for q in queries[:clients]:  # warm the connections
            await http.post(url, json={"query": q, "top_k": 10})
        started = time.perf_counter()
        until = started + seconds
        await asyncio.gather(*(_client(http, url, queries, until, c * 7, latencies, errors) for c in range(clients)))
        elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "clients": clients, "requests": len(latencies), "errors": len(errors), "rps": len(latencies) / elapsed,
        "p50_ms": statistics.median(ordered), "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


_WRK_SCRIPT = """
local queries = {}
for line in io.lines("%s") do queries[#queries + 1] = line end
local counter = 0
request = function()
  counter = counter + 1
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, queries[(counter %% #queries) + 1])
end
local threads = {}
setup = function(thread) table.insert(threads, thread) end
degraded = 0
response = function(status, headers, body)  -- a 200 whose dense channel was skipped is no success
  if status == 200 and not string.find(body, '"degraded":[]', 1, true) then degraded = degraded + 1 end
end
done = function(summary, latency, requests)
  local n = 0
  for _, thread in ipairs(threads) do n = n + thread:get("degraded") end
  io.write(string.format("Degraded responses: %%d\\n", n))
end
"""


def load_wrk(url: str, queries: list[str], clients: int, seconds: float) -> dict[str, Any]:
    """Drive ``url`` with wrk (1 thread, ``clients`` connections); parse its ``--latency`` report."""
    with tempfile.TemporaryDirectory(prefix="quarry-wrk-") as tmp:
        bodies = Path(tmp) / "bodies.jsonl"
        bodies.write_text("".join(json.dumps({"query": q, "top_k": 10, "mode": "hybrid"}) + "\n" for q in queries))
        script = Path(tmp) / "search.lua"
        script.write_text(_WRK_SCRIPT % bodies)
        cmd = ["wrk", "-t1", f"-c{clients}", f"-d{seconds:g}s", "--timeout", "30s", "--latency", "-s", str(script), url]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    degraded = int(re.search(r"Degraded responses: (\d+)", out).group(1))  # type: ignore[union-attr]
    bad = int(non2xx.group(1)) if non2xx else 0
    return {
        "clients": clients, "requests": total, "errors": errors + bad + degraded,
        "transport": errors, "non2xx": bad, "degraded": degraded,
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50_ms": _wrk_ms(re.search(r"50%\s+([\d.]+\w+)", out)),
        "p99_ms": _wrk_ms(re.search(r"99%\s+([\d.]+\w+)", out)),
        "load": "wrk",
    }


def _wrk_ms(match: re.Match[str] | None) -> float:
    if match is None:
        raise RuntimeError("wrk printed no latency distribution")
    value = match.group(1)
    for unit, scale in (("us", 1e-3), ("ms", 1.0), ("s", 1e3), ("m", 60e3)):
        if value.endswith(unit):
            return float(value[: -len(unit)]) * scale
    raise RuntimeError(f"unknown wrk latency unit in {value!r}")


def bench_api(
    scifact: Path, seconds: float, embedding_url: str | None, collection: str, loader: str
) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if embedding_url:
        env["QUARRY_EMBEDDING__URL"] = embedding_url
    subprocess.run([sys.executable, "-m", "quarry.cli", "ingest", str(scifact), "--collection", collection],
                   env=env, check=True)
    server = QuarryServer(env).wait_ready()
    try:
        url = f"{server.url}/v1/collections/{collection}/search"
        queries = list(load_split(scifact, "test").queries.values())
        for q in queries[:32]:  # warm-up: first calls pay for lazy initialisation
            httpx.post(url, json={"query": q, "top_k": 10}, timeout=60)

        def run(clients: int) -> dict[str, Any]:
            if loader == "wrk":
                return load_wrk(url, queries, clients, seconds)
            return {**asyncio.run(load(url, queries, clients, seconds)), "load": "httpx"}

        return {"embedding_url": embedding_url or "torch://all-MiniLM-L6-v2", "1_client": run(1), "32_clients": run(32)}
    finally:
        server.stop()


def export_tree(ref: str, dest: Path) -> str:
    """Write the files of git ``ref`` (this repository's) into ``dest``; returns the commit id.

    Raises:
        subprocess.CalledProcessError: ``ref`` names no commit, or git or tar failed.
    """
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                         check=True, capture_output=True, text=True).stdout.strip()
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", sha], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return sha


def _tree_env(tree: Path, data_dir: Path, embedding_url: str | None) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(tree),
           "QUARRY_DATA_DIR": str(data_dir)}
    if embedding_url:
        env["QUARRY_EMBEDDING__URL"] = embedding_url
    return env


def _imported_from(env: dict[str, str], tree: Path) -> str:
    """The folder ``quarry`` is imported from by a child started like the server (``cwd`` ``tree``)."""
    code = "import pathlib, quarry; print(pathlib.Path(quarry.__file__).resolve().parents[1])"
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=tree, check=True, capture_output=True,
                          text=True).stdout.strip()


def _spread(ratios: list[float]) -> dict[str, float]:
    quartiles = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 3
    return {"median": statistics.median(ratios), "q1": quartiles[0], "q3": quartiles[2],
            "min": min(ratios), "max": max(ratios)}


def compare_trees(args: argparse.Namespace, loader: str) -> dict[str, Any]:
    """Section 3 of the module docstring: baseline ``args.compare_ref`` against the candidate, alternated."""
    with tempfile.TemporaryDirectory(prefix="quarry-bench-compare-") as tmp:
        trees: dict[str, Path] = {"baseline": Path(tmp) / "baseline", "candidate": REPO}
        labels = {"baseline": f"{args.compare_ref} ({export_tree(args.compare_ref, trees['baseline'])[:12]})",
                  "candidate": "this checkout"}
        if args.candidate_ref:
            trees["candidate"] = Path(tmp) / "candidate"
            labels["candidate"] = f"{args.candidate_ref} ({export_tree(args.candidate_ref, trees['candidate'])[:12]})"
        data_root = args.compare_data or Path(tmp) / "data"
        envs = {side: _tree_env(tree, data_root / side, args.embedding_url) for side, tree in trees.items()}
        for side, tree in trees.items():
            origin = _imported_from(envs[side], tree)
            if Path(origin) != tree.resolve():
                raise RuntimeError(f"the {side} imports quarry from {origin}, not from {tree}")
            console.print(f"{side}: {labels[side]}, quarry from {origin}, data {data_root / side}")
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "quarry.cli", "ingest", str(args.scifact), "--collection",
                            args.collection], env=envs[side], cwd=tree, check=True, stdout=subprocess.DEVNULL)
            console.print(f"{side}: ingested in {time.perf_counter() - started:.0f} s")
        queries = list(load_split(args.scifact, "test").queries.values())
        servers: dict[str, QuarryServer] = {}
        try:
            for side, tree in trees.items():
                servers[side] = QuarryServer(envs[side], cwd=tree)
            urls = {}
            for side, server in servers.items():
                urls[side] = f"{server.wait_ready().url}/v1/collections/{args.collection}/search"
                for q in queries[:32]:  # warm-up: first calls pay for lazy initialisation
                    httpx.post(urls[side], json={"query": q, "top_k": 10}, timeout=60).raise_for_status()
            phases: list[dict[str, Any]] = []
            for r in range(args.rounds):
                for side in ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline"):
                    if loader == "wrk":
                        out = load_wrk(urls[side], queries, 32, args.seconds)
                    else:
                        out = {**asyncio.run(load(urls[side], queries, 32, args.seconds)), "load": "httpx"}
                    phases.append({"round": r + 1, "side": side, **out})
                base, cand = (next(p for p in phases[-2:] if p["side"] == s) for s in ("baseline", "candidate"))
                console.print(f"round {r + 1}: baseline {base['rps']:.1f} req/s (p50 {base['p50_ms']:.0f} ms), "
                              f"candidate {cand['rps']:.1f} req/s (p50 {cand['p50_ms']:.0f} ms), "
                              f"ratio {cand['rps'] / max(base['rps'], 1e-9):.3f}, "
                              f"errors {base['errors']}+{cand['errors']}")
        finally:
            for server in servers.values():
                server.stop()
    rps = {(p["round"], p["side"]): p["rps"] for p in phases}
    ratios = [rps[r, "candidate"] / max(rps[r, "baseline"], 1e-9) for r in range(1, args.rounds + 1)]
    pooled = sum(p["rps"] for p in phases if p["side"] == "candidate") / max(
        sum(p["rps"] for p in phases if p["side"] == "baseline"), 1e-9)
    return {"baseline": labels["baseline"], "candidate": labels["candidate"], "clients": 32, "load": loader,
            "seconds": args.seconds, "ratios": ratios, "ratio": _spread(ratios), "pooled_ratio": pooled,
            "errors": {s: sum(p["errors"] for p in phases if p["side"] == s) for s in ("baseline", "candidate")},
            "phases": phases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scifact", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of each load phase")
    parser.add_argument("--embedding-url", default=None, help="query encoder of the server (QUARRY_EMBEDDING__URL)")
    parser.add_argument("--collection", default="scifact", help="collection to ingest SciFact into and query")
    parser.add_argument("--skip-api", action="store_true")
    parser.add_argument("--load", choices=["auto", "wrk", "httpx"], default="auto",
                        help="load generator (auto: wrk when installed)")
    parser.add_argument("--compare-ref", default=None, metavar="REF",
                        help="only compare REST throughput: git REF (baseline) against this checkout, alternated")
    parser.add_argument("--candidate-ref", default=None, metavar="REF",
                        help="with --compare-ref: the candidate is git REF, not this checkout")
    parser.add_argument("--rounds", type=int, default=8, help="with --compare-ref: rounds (each runs both sides)")
    parser.add_argument("--compare-data", type=Path, default=None,
                        help="with --compare-ref: keep the two sides' data dirs here (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    loader = args.load if args.load != "auto" else ("wrk" if shutil.which("wrk") else "httpx")

    if args.compare_ref:
        result = compare_trees(args, loader)
        summary = result["ratio"]
        console.print(f"REST hybrid, 32 clients ({loader}), candidate {result['candidate']} / baseline "
                      f"{result['baseline']}: median ratio {summary['median']:.3f} over {args.rounds} rounds, "
                      f"quartiles {summary['q1']:.3f}-{summary['q3']:.3f}, min {summary['min']:.3f}, "
                      f"max {summary['max']:.3f}, pooled {result['pooled_ratio']:.3f}, errors "
                      f"{result['errors']['baseline']}+{result['errors']['candidate']}")
        if args.json:
            args.json.write_text(json.dumps({"compare": result}, indent=2))
        return

    results: dict[str, Any] = {"bm25": bench_bm25(args.scifact, repeats=3)}
    table = Table("benchmark", "quarry", "baseline", "ratio", title="bench/search.py")
    b = results["bm25"]
    table.add_row("BM25 queries/s (SciFact)", f"{b['quarry_qps']:.0f}", f"rank-bm25 {b['rank_bm25_qps']:.1f}",
                  f"{b['speedup']:.0f}x")
    if not args.skip_api:
        results["api"] = bench_api(args.scifact, args.seconds, args.embedding_url, args.collection, loader)
        for key in ("1_client", "32_clients"):
            r = results["api"][key]
            table.add_row(f"REST hybrid, {r['clients']} client(s) ({r['load']})",
                          f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms",
                          f"{r['rps']:.0f} req/s", f"{r['errors']} errors / {r['requests']}")
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
