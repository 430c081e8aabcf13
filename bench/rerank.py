"""Benchmark the cross-encoder reranker on SciFact (query, passage) pairs.

Usage::

    python bench/rerank.py [--json FILE] [--model PATH] [--minilm-shape] [--calls N]
                           [--batch-sizes 1 16 32 64] [--device auto|cpu|cuda]

Each model is loaded through :class:`rerank.cross_encoder.CrossEncoderReranker`, once per batch
size, and scores the top-50 of a query per call (one call = 50 pairs, as the query path does
with ``top_n=50``): SciFact test query ``i`` against corpus passages ``50 i .. 50 i + 49``
(title + text, truncated to 512 tokens). After one warm-up call, ``--calls`` calls are timed;
a row gives pairs/s over all of them and the p50/p99 latency of one call.

Models:

* ``tiny``: the random BERT of :func:`rerank.tiny.build_tiny_cross_encoder` (hidden 32,
  2 layers), built in a temporary folder; it measures the serving code, not a real model.
* ``minilm-l6-shape`` (``--minilm-shape``): random weights in the layout of
  ``cross-encoder/ms-marco-MiniLM-L-6-v2`` (hidden 384, 6 layers): the compute of the real model,
  hence its throughput, without its weights.
* ``model`` (``--model PATH``): a real cross-encoder folder, e.g. ms-marco-MiniLM-L-6-v2.

``--json FILE`` writes ``{"config": {...}, "models": {"<model>": {"<batch size>": {"pairs_per_s",
"p50_ms", "p99_ms", "calls"}}}}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

# Run as ``python bench/rerank.py``: this file's folder would shadow the ``rerank`` package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from rerank.cross_encoder import CrossEncoderReranker, DeviceChoice, resolve_device  # noqa: E402
from rerank.tiny import build_tiny_cross_encoder  # noqa: E402

REPO = _HERE.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "scifact"
TOP_N = 50


def load_calls(root: Path, calls: int) -> list[tuple[str, list[str]]]:
    """``calls`` (query, 50 passages) inputs from SciFact test queries and its corpus."""
    test_ids = {line.split("\t")[0] for line in (root / "qrels" / "test.tsv").read_text().splitlines()[1:]}
    queries = [q["text"] for q in map(json.loads, (root / "queries.jsonl").open()) if q["_id"] in test_ids]
    passages: list[str] = []
    with (root / "corpus.jsonl").open() as corpus:
        for line in corpus:
            doc = json.loads(line)
            passages.append(f"{doc['title']} {doc['text']}")
            if len(passages) == TOP_N * calls:
                break
    return [(queries[i], passages[TOP_N * i : TOP_N * (i + 1)]) for i in range(calls)]


def measure(model: str, device: DeviceChoice, batch_size: int, inputs: list[tuple[str, list[str]]]) -> dict[str, float]:
    """Time ``reranker.score`` on each input after one warm-up call."""
    reranker = CrossEncoderReranker(model, device=device, batch_size=batch_size)
    reranker.warm_up()
    reranker.score(*inputs[0])
    latencies_s = []
    for query, passages in inputs:
        start = time.perf_counter()
        reranker.score(query, passages)
        latencies_s.append(time.perf_counter() - start)
    lat = np.array(latencies_s)
    return {
        "pairs_per_s": TOP_N * len(lat) / float(lat.sum()),
        "p50_ms": float(np.percentile(lat, 50) * 1000),
        "p99_ms": float(np.percentile(lat, 99) * 1000),
        "calls": len(lat),
    }


def render(results: dict[str, dict[str, dict[str, float]]], device: str) -> None:
    """Print one table row per (model, batch size)."""
    table = Table(title=f"cross-encoder rerank, top-{TOP_N} of SciFact per call, {device}")
    for column in ("model", "batch", "pairs/s", "p50 ms / call", "p99 ms / call", "calls"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for name, rows in results.items():
        for batch, row in rows.items():
            table.add_row(
                name,
                batch,
                f"{row['pairs_per_s']:.1f}",
                f"{row['p50_ms']:.1f}",
                f"{row['p99_ms']:.1f}",
                str(int(row["calls"])),
            )
    Console().print(table)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--json", type=Path, help="write the results to this file")
    parser.add_argument("--model", help="folder of a real cross-encoder to measure as well")
    parser.add_argument(
        "--minilm-shape",
        action="store_true",
        help="also measure random weights in the ms-marco-MiniLM-L-6-v2 layout",
    )
    parser.add_argument("--calls", type=int, default=10, help="timed top-50 calls per row")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 32, 64])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="a BEIR SciFact folder")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    inputs = load_calls(args.data, args.calls)
    results: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="quarry-bench-rerank-") as tmp:
        models = {"tiny": str(build_tiny_cross_encoder(Path(tmp) / "tiny"))}
        if args.minilm_shape:
            built = build_tiny_cross_encoder(Path(tmp) / "l6", shape="minilm-l6")
            models["minilm-l6-shape"] = str(built)
        if args.model:
            models["model"] = args.model
        for name, path in models.items():
            results[name] = {str(bs): measure(path, args.device, bs, inputs) for bs in args.batch_sizes}
            print(f"{name}: done", file=sys.stderr)
    device = resolve_device(args.device)
    config: dict[str, Any] = {
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "top_n": TOP_N,
        "calls": args.calls,
        "data": str(args.data),
        "model": args.model,
    }
    render(results, f"{device}, {config['torch_threads']} torch threads")
    if args.json:
        args.json.write_text(json.dumps({"config": config, "models": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
