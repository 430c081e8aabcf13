"""Benchmark the packaged MiniLM on CUDA (fp16) against the CPU (fp32) of the same machine.

    python bench/embedding_gpu.py [--documents 2048] [--queries 200] [--json FILE]

Both rows load :class:`embedding.sentence_transformers.SentenceTransformerEmbedder` (the
in-process ``torch://`` backend). ``documents/s``: SciFact documents (title + text, truncated to
256 tokens) embedded in batches of 64 after one warm-up batch. ``query p50/p99``: one short
SciFact query per call, as the query path sends it. Runs only where torch sees a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from itertools import islice
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from embedding.sentence_transformers import SentenceTransformerEmbedder  # noqa: E402
from eval.beir import load_split  # noqa: E402
from indexing.sources import iter_jsonl  # noqa: E402


def measure(device: str, documents: list[str], queries: list[str]) -> dict[str, float]:
    import torch

    model = SentenceTransformerEmbedder("all-MiniLM-L6-v2", batch_size=64, device=device)
    model.warm_up()
    model.embed(documents[:64])
    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    sync()
    started = time.perf_counter()
    model.embed(documents)
    sync()
    docs_s = len(documents) / (time.perf_counter() - started)
    latencies = []
    for q in queries:
        t = time.perf_counter()
        model.embed_queries([q])
        latencies.append((time.perf_counter() - t) * 1000)
    latencies.sort()
    return {"documents_per_s": docs_s, "query_p50_ms": statistics.median(latencies),
            "query_p99_ms": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]}


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scifact", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--documents", type=int, default=2048)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/embedding_gpu.py needs a CUDA device visible to torch")
    corpus = islice(iter_jsonl(args.scifact / "corpus.jsonl"), args.documents)
    documents = [f"{d.title} {d.text}".strip() for d in corpus]
    queries = list(load_split(args.scifact, "test").queries.values())[: args.queries]
    results: dict[str, Any] = {
        "config": {"gpu": torch.cuda.get_device_name(0), "cpu_threads": torch.get_num_threads(),
                   "torch": torch.__version__, "documents": len(documents), "queries": len(queries)},
        "cuda_fp16": measure("cuda", documents, queries),
        "cpu_fp32": measure("cpu", documents, queries),
    }
    gpu, cpu = results["cuda_fp16"], results["cpu_fp32"]
    cfg = results["config"]
    title = f"MiniLM-L6 embedding: {cfg['gpu']} vs {cfg['cpu_threads']} CPU threads"
    table = Table("backend", "documents/s", "query p50 ms", "query p99 ms", title=title)
    for name, r in (("cuda fp16", gpu), ("cpu fp32", cpu)):
        table.add_row(name, f"{r['documents_per_s']:.0f}", f"{r['query_p50_ms']:.2f}", f"{r['query_p99_ms']:.2f}")
    table.add_row("ratio", f"{gpu['documents_per_s'] / cpu['documents_per_s']:.1f}x", "", "")
    Console(width=120).print(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
