"""The default encoder's choice: torch, ONNX fp32 and ONNX int8 side by side, in one run.

For each encoder (the packaged all-MiniLM-L6-v2; ``torch://all-MiniLM-L6-v2``, the reference;
``onnx://all-MiniLM-L6-v2?quantize=none&threads=1``; ``onnx://...?quantize=int8&threads=1``, the
default since this table):

1. **nDCG@10** (dense and hybrid; BM25 is the same for all) on SciFact test (300 queries) and
   CMRC2018 test (3,220): the embedded default (Milvus Lite FLAT + SQLite) ingests the corpus
   with the encoder and evaluates its queries with it. Nothing is tuned: default settings.
   Vectors come through the test suite's memo (``tests/embedding_cache.py``: each text through
   the real model once per machine, keyed by the model's bytes, code and library versions; the
   ONNX rows with ``batch_size`` 32 and ONNX Runtime's default threads, as the tests make them;
   the thread count is not part of their key) unless ``--no-memo``.
2. **CPU per query**: process CPU time (user + system, all threads: ``time.process_time``) per
   query embedding, batch 1, SciFact test queries, the encoders alternating in ``--rounds``
   rounds of ``--cpu-queries`` each; the median round. The torch encoder uses all cores for a
   lone call (its default), ONNX one thread (``threads=1``, what a server uses).
3. **32-client throughput**: one ``quarry serve`` per encoder (``QUARRY_EMBEDDING__URL``), on
   pgvector + a PostgreSQL docstore (this run's own schema) holding SciFact ingested once (the
   ONNX servers query torch's vectors: one model fingerprint; throughput does not depend on it),
   driven by ``wrk`` with 32 connections for ``--seconds``, the servers alternating over
   ``--rounds`` rounds (bench/workers.py's machinery): req/s median and each round's, p50/p99.

    eval "$(bash scripts/services.sh env)"
    python bench/encoders.py [--parts quality,cpu,throughput] [--rounds 3] [--seconds 15]
                             [--json FILE] [--markdown FILE]

Measured 2026-12-03 19:42-19:52 UTC in one run (``--parts quality,cpu,throughput --rounds 3``) on
the shared 2-core machine (load average 3.7-8.8): nDCG@10 SciFact dense / hybrid torch 0.6611 /
0.7163, fp32 0.6611 / 0.7163, int8 0.6657 / 0.7168; CMRC torch 0.1645 / 0.5167, fp32 the same,
int8 0.1647 / 0.5148; CPU ms per batch-1 query 131.6 / 6.78 / 2.30 (median of 3 rounds); median
req/s at 32 clients 30.2 / 35.0 (1.16x) / 35.7 (1.18x), rounds torch 35.0, 30.2, 20.2, fp32 35.1,
35.0, 20.3, int8 56.2, 35.7, 30.5. An earlier run at load 23-29: 1.8 / 5.8 / 8.1 req/s, CPU 340 /
11.3 / 5.5 ms. The table: docs/embedding.md#choosing-the-default-encoder.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench import workers as wb  # noqa: E402
from embedding.base import Embedder  # noqa: E402
from eval.beir import load_split  # noqa: E402
from eval.runner import collection_search, evaluate  # noqa: E402
from indexing.sources import read_documents  # noqa: E402

console = Console()
DATA = REPO.parent / "shared" / "data"
ENCODERS = {
    "torch": "torch://all-MiniLM-L6-v2",
    "onnx_fp32": "onnx://all-MiniLM-L6-v2?quantize=none&threads=1",
    "onnx_int8": "onnx://all-MiniLM-L6-v2?quantize=int8&threads=1",
}
DATASETS = {"scifact": ("scifact", "en"), "cmrc": ("cmrc2018-retrieval", "zh")}


def open_encoder(name: str, cache_dir: Path, memo: bool) -> Embedder:
    """The encoder ``name`` (warmed up), wrapped in the tests' vector memo when ``memo``."""
    from embedding.onnx import OnnxEmbedder
    from embedding.sentence_transformers import SentenceTransformerEmbedder
    from tests.embedding_cache import onnx_vectors, torch_vectors

    if name == "torch":
        model = SentenceTransformerEmbedder("all-MiniLM-L6-v2", batch_size=64, device="cpu")
        model.warm_up()
        return torch_vectors(model) if memo else model
    url = ENCODERS[name] if not memo else ENCODERS[name].replace("&threads=1", "")  # the tests' memo key
    onnx = OnnxEmbedder.from_url(url, cache_dir, batch_size=32)
    onnx.warm_up()
    return onnx_vectors(onnx) if memo else onnx


def quality(name: str, cache_dir: Path, memo: bool, tmp: Path,
            save: Callable[[dict[str, dict[str, float]]], None]) -> dict[str, dict[str, float]]:
    """nDCG@10 (dense, hybrid) of encoder ``name`` on each dataset's test split (``save``: after each)."""
    from quarry.service import Quarry
    from quarry.settings import Settings

    out: dict[str, dict[str, float]] = {}
    embedder = open_encoder(name, cache_dir, memo)
    for key, (folder, language) in DATASETS.items():
        beir = DATA / folder
        embedder.embed(list(load_split(beir, "test").queries.values()))  # one batched pass (memo rows)
        quarry = Quarry(Settings(data_dir=tmp / f"{name}-{key}"), embedder=embedder)
        try:
            quarry.create_collection(key, language=language)
            quarry.upsert(key, read_documents(beir))
            summary = evaluate(collection_search(quarry, key), beir, "test", ["dense", "hybrid"],
                               tmp / f"{name}-{key}-eval", {}, show_progress=False)
            out[key] = {mode: m["ndcg@10"] for mode, m in summary.to_dict()["modes"].items()}
        finally:
            quarry.close()
        console.print(f"{name} {key}: {out[key]}")
        save(out)
    return out


def cpu_per_query(cache_dir: Path, rounds: int, n: int) -> dict[str, Any]:
    """Process CPU ms per batch-1 query embedding, each encoder in turn per round (no memo)."""
    encoders = {name: open_encoder(name, cache_dir, memo=False) for name in ENCODERS}
    queries = list(load_split(DATA / "scifact", "test").queries.values())
    for encoder in encoders.values():  # first calls pay for lazy initialisation
        for q in queries[:10]:
            encoder.embed_queries([q])
    per_round: dict[str, list[float]] = {name: [] for name in encoders}
    for r in range(rounds):
        names = list(encoders) if r % 2 == 0 else list(reversed(encoders))
        for name in names:
            started = time.process_time()
            for q in queries[(r * n) % len(queries):][:n]:
                encoders[name].embed_queries([q])
            per_round[name].append((time.process_time() - started) * 1000 / n)
        console.print(f"cpu round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} ms" for k, v in per_round.items()))
    return {name: {"median_ms": statistics.median(v), "rounds_ms": v} for name, v in per_round.items()}


def throughput(rounds: int, seconds: float, clients: int) -> dict[str, Any]:
    """Each encoder's ``quarry serve`` under ``clients`` connections, alternating over ``rounds``."""
    loader = "wrk" if shutil.which("wrk") else "httpx"
    schema = f"quarry_bench_{uuid.uuid4().hex[:10]}"
    collection = f"bench_encoders_{uuid.uuid4().hex[:8]}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("QUARRY_")},
        "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO),
        "QUARRY_STORE__URL": wb.PG_URL, "QUARRY_DOCSTORE__URL": wb.pg_schema_url(schema),
    }
    servers: dict[str, Any] = {}
    out: dict[str, Any] = {name: {"rounds": []} for name in ENCODERS}
    with tempfile.TemporaryDirectory(prefix="quarry-bench-encoders-") as tmp:
        try:
            env["QUARRY_DATA_DIR"] = str(Path(tmp) / "ingest")
            wb.ingest(env, DATA / "scifact", collection, None, memo=True)
            queries = list(load_split(DATA / "scifact", "test").queries.values())
            for name, url in ENCODERS.items():
                server = wb.start(1, {**env, "QUARRY_DATA_DIR": str(Path(tmp) / name),
                                      "QUARRY_EMBEDDING__URL": url,
                                      "QUARRY_EMBEDDING__CACHE_DIR": str(Path(tmp) / "models")})
                search = f"{server.url}/v1/collections/{collection}/search"
                servers[name] = (server, search)
                for q in queries[:16]:
                    wb.httpx.post(search, json={"query": q, "top_k": 10}, timeout=60).raise_for_status()
            for r in range(rounds):
                names = list(servers) if r % 2 == 0 else list(reversed(servers))
                for name in names:
                    out[name]["rounds"].append(wb.measure(*servers[name], queries, clients, seconds, loader))
                console.print(f"throughput round {r + 1}: " + ", ".join(
                    f"{k} {v['rounds'][-1]['rps']:.1f} req/s (p50 {v['rounds'][-1]['p50_ms']:.0f} ms)"
                    for k, v in out.items()))
        finally:
            for server, _ in servers.values():
                server.stop()
            _drop(env, collection)
            wb.drop_schema(schema)
    for v in out.values():
        v["median_rps"] = statistics.median(x["rps"] for x in v["rounds"])
        v["median_p50_ms"] = statistics.median(x["p50_ms"] for x in v["rounds"])
        v["median_p99_ms"] = statistics.median(x["p99_ms"] for x in v["rounds"])
    return out


def _drop(env: dict[str, str], collection: str) -> None:
    from quarry.service import Quarry
    from quarry.settings import Settings

    saved = dict(os.environ)
    os.environ.update({k: v for k, v in env.items() if k.startswith("QUARRY_")})
    try:
        quarry = Quarry(Settings())
    finally:
        os.environ.clear()
        os.environ.update(saved)
    quarry.drop_collection(collection)
    quarry.close()


def markdown(results: dict[str, Any]) -> str:
    """The table of docs/embedding.md: one row per encoder, ratios against torch."""
    q, c, t = results.get("quality", {}), results.get("cpu", {}), results.get("throughput", {})

    def cell(fn: Callable[[str], str], name: str) -> str:
        try:
            return fn(name)
        except KeyError:
            return "n/m"

    rows = ["| encoder | SciFact dense / hybrid nDCG@10 | CMRC dense / hybrid nDCG@10 | CPU ms/query (batch 1) "
            "| 32-client hybrid req/s (p50 / p99 ms) |", "|---|---|---|---|---|"]
    for name in ENCODERS:
        rows.append("| " + " | ".join([
            f"{name} (`{ENCODERS[name]}`)",
            cell(lambda n: f"{q[n]['scifact']['dense']:.4f} / {q[n]['scifact']['hybrid']:.4f}", name),
            cell(lambda n: f"{q[n]['cmrc']['dense']:.4f} / {q[n]['cmrc']['hybrid']:.4f}", name),
            cell(lambda n: f"{c[n]['median_ms']:.2f} ({c[n]['median_ms'] / c['torch']['median_ms']:.2f}x torch)", name),
            cell(lambda n: f"{t[n]['median_rps']:.1f} ({t[n]['median_rps'] / t['torch']['median_rps']:.2f}x torch; "
                           f"{t[n]['median_p50_ms']:.0f} / {t[n]['median_p99_ms']:.0f})", name),
        ]) + " |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="quality,cpu,throughput")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu-queries", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--no-memo", action="store_true")
    parser.add_argument("--encoders", default=",".join(ENCODERS), help="the encoders whose quality to measure")
    parser.add_argument("--json", type=Path, default=None, help="results (merged into the file if it exists)")
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    results: dict[str, Any] = json.loads(args.json.read_text()) if args.json and args.json.is_file() else {}

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    with tempfile.TemporaryDirectory(prefix="quarry-bench-enc-") as tmp:
        cache_dir = Path(tmp) / "models"
        if "cpu" in parts:
            results["cpu"] = cpu_per_query(cache_dir, args.rounds, args.cpu_queries)
            save()
        if "quality" in parts:
            found = results.setdefault("quality", {})
            for name in args.encoders.split(","):

                def keep(part: dict[str, dict[str, float]], name: str = name) -> None:
                    found[name] = part
                    save()

                quality(name, cache_dir, not args.no_memo, Path(tmp), keep)
        if "throughput" in parts:
            results["throughput"] = throughput(args.rounds, args.seconds, args.clients)
            save()
    table = markdown(results)
    console.print(table)
    save()
    if args.markdown:
        args.markdown.write_text(table)


if __name__ == "__main__":
    main()
