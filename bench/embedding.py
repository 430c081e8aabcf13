"""Benchmark the embedding backends in one run, each beside the torch baseline.

Backends: sentence-transformers on torch (the baseline), ONNX Runtime fp32 and int8 in process,
and a real Triton server (``quarry triton serve``, PyTriton, started here on free ports and
stopped with SIGTERM at the end) over gRPC and HTTP, wrapping one in-process backend. Unless
``--no-repository``, also the production layout: the stock ``tritonserver`` loading
``model_repository/`` (CPU config: sentence-transformers on torch inside Triton's Python-backend
stub, :mod:`embedding.triton_standalone`), as ``triton_repo_grpc`` / ``triton_repo_http``,
against in-process torch.

Workload "sentences": SciFact claims (short queries, what the query path embeds), one sentence
per request, driven by 8 concurrent client threads and by 1 (Triton's dynamic batching should
raise throughput at 8). Latency = one request. Workload "documents": SciFact documents (mostly
cut at 256 tokens) in batches of 64 from one caller, the ingestion path.

    python bench/embedding.py [--json FILE] [--markdown FILE] [--seconds 6] [--rounds 2]
                              [--triton-backend onnx-fp32|onnx|torch] [--shared-memory] [--batched]
                              [--no-repository]

The CPUs here are shared, so the backends are measured in interleaved rounds and the best round
of each is kept (the JSON says how many).

The JSON has one entry per backend (``torch``, ``onnx_fp32``, ``onnx_int8``, ``triton_grpc``,
``triton_http``, ``triton_repo_grpc``, ``triton_repo_http``) with ``sentences_per_s``,
``p50_ms``, ``p99_ms`` at 8 clients, the same at 1 client under ``by_clients``,
``documents_per_s``, and for Triton the ``backend`` it wraps and ``overhead_1_client``: what
Triton adds to one request, from a phase per round in which one client sends blocks of
``OVERHEAD_BLOCK`` (20) sentences in process and the same ones through Triton, alternately
(``added_p50_ms``: the median over blocks of the difference of the two p50s; the best rounds'
p50s come from different moments of a shared CPU, so their difference drifts by milliseconds).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from embedding.base import Embedder  # noqa: E402
from embedding.batching import BatchingEmbedder  # noqa: E402
from embedding.onnx import OnnxEmbedder  # noqa: E402
from embedding.sentence_transformers import SentenceTransformerEmbedder  # noqa: E402
from embedding.triton import TritonEmbedder  # noqa: E402
from embedding.triton_server import BACKENDS  # noqa: E402
from embedding.triton_standalone import standalone_command  # noqa: E402

console = Console()
CLIENTS = (1, 8)
OVERHEAD_BLOCK = 20  # sentences per block of the side-by-side Triton overhead phase


def load_texts(scifact: Path, docs: int) -> tuple[list[str], list[str]]:
    with (scifact / "queries.jsonl").open(encoding="utf-8") as fh:
        sentences = [json.loads(line)["text"] for line in fh]
    documents = []
    with (scifact / "corpus.jsonl").open(encoding="utf-8") as fh:
        for line, _ in zip(fh, range(docs), strict=False):
            doc = json.loads(line)
            documents.append(f"{doc['title']} {doc['text']}".strip())
    return sentences, documents


def drive(embed: Callable[[Sequence[str]], Any], sentences: list[str], clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` threads send one sentence per request for ``seconds``; latency per request."""
    for s in sentences[:8]:
        embed([s])
    latencies: list[list[float]] = [[] for _ in range(clients)]
    start = time.perf_counter()
    until = start + seconds

    def worker(i: int) -> None:
        k = i
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            embed([sentences[k % len(sentences)]])
            latencies[i].append(time.perf_counter() - t0)
            k += clients

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    lat_ms = np.array([x for per in latencies for x in per]) * 1000
    return {
        "clients": clients, "requests": int(lat_ms.size), "sentences_per_s": round(lat_ms.size / wall, 1),
        "p50_ms": round(float(np.percentile(lat_ms, 50)), 2), "p99_ms": round(float(np.percentile(lat_ms, 99)), 2),
    }


def paired_overhead(
    inproc: Embedder, remote: Embedder, sentences: list[str], seconds: float, block: int = OVERHEAD_BLOCK
) -> list[tuple[float, float]]:
    """One ``(inproc_p50_ms, remote_p50_ms)`` pair per block of ``block`` sentences, 1 client.

    Each block of sentences goes through ``inproc``, then the same ones through ``remote``.

    Neighbouring blocks see the same machine speed, so the per-pair difference isolates what the
    server adds even while shared CPUs drift between rounds; blocks rather than single calls
    keep each model's weights in cache, as when it runs alone.
    """
    for s in sentences[:8]:
        inproc.embed_queries([s])
        remote.embed_queries([s])
    pairs = []
    until = time.perf_counter() + seconds
    k = 0
    while time.perf_counter() < until:
        texts = [sentences[(k + i) % len(sentences)] for i in range(block)]
        k += block
        ms: list[list[float]] = [[], []]
        for side, embedder in enumerate((inproc, remote)):
            for text in texts:
                t0 = time.perf_counter()
                embedder.embed_queries([text])
                ms[side].append((time.perf_counter() - t0) * 1000)
        pairs.append((float(np.median(ms[0])), float(np.median(ms[1]))))
    return pairs


def overhead_summary(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    arr = np.array(pairs)
    return {
        "blocks": len(pairs),
        "in_process_p50_ms": round(float(np.median(arr[:, 0])), 2),
        "triton_p50_ms": round(float(np.median(arr[:, 1])), 2),
        "added_p50_ms": round(float(np.median(arr[:, 1] - arr[:, 0])), 2),
    }


def documents_per_s(embedder: Embedder, documents: list[str]) -> float:
    embedder.embed(documents[:4])
    t0 = time.perf_counter()
    for i in range(0, len(documents), 64):
        embedder.embed(documents[i : i + 64])
    return round(len(documents) / (time.perf_counter() - t0), 1)


def measure(
    name: str, embedder: Embedder, sentences: list[str], documents: list[str], seconds: float
) -> dict[str, Any]:
    embedder.warm_up()
    by_clients = {str(c): drive(embedder.embed_queries, sentences, c, seconds) for c in CLIENTS}
    row: dict[str, Any] = {"by_clients": by_clients}
    if documents:
        row["documents_per_s"] = documents_per_s(embedder, documents)
    console.log(f"{name}: {row} (load average {os.getloadavg()[0]:.1f})")
    return row


def best_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per client count the round with the highest throughput (this machine's CPUs are shared)."""
    by_clients = {c: max((r["by_clients"][c] for r in rows), key=lambda x: x["sentences_per_s"]) for c in ("1", "8")}
    best: dict[str, Any] = {k: v for k, v in by_clients["8"].items() if k != "clients"}
    best.update(clients=8, by_clients=by_clients, rounds=len(rows))
    if "documents_per_s" in rows[0]:
        best["documents_per_s"] = max(r["documents_per_s"] for r in rows)
    return best


def free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class TritonProcess:
    """``python -m quarry.triton_cli serve`` on free ports, stopped with SIGTERM."""

    def __init__(
        self, backend: str, cache_dir: Path, max_batch: int, delay_us: int, shared_memory: bool = False
    ) -> None:
        self.http, self.grpc, self.metrics = free_ports(3)
        self.log = tempfile.NamedTemporaryFile(prefix="triton-bench-", suffix=".log", delete=False)  # noqa: SIM115
        env = {**os.environ, "QUARRY_EMBEDDING__CACHE_DIR": str(cache_dir)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "quarry.triton_cli", "serve", "--model", backend, "--address", "127.0.0.1",
             "--http-port", str(self.http), "--grpc-port", str(self.grpc), "--metrics-port", str(self.metrics),
             "--max-batch-size", str(max_batch), "--max-queue-delay-us", str(delay_us),
             *(["--shared-memory"] if shared_memory else [])],
            cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        url = f"http://127.0.0.1:{self.http}/v2/models/minilm/ready"
        for _ in range(600):
            if self.proc.poll() is not None:
                raise RuntimeError(f"triton exited; log: {self.log.name}")
            try:
                with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - loopback
                    return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"triton not ready; log: {self.log.name}")

    def stop(self) -> int:
        """SIGTERM the server, wait for it; its exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


class RepositoryProcess(TritonProcess):
    """The stock ``tritonserver`` on ``model_repository/`` (CPU config), stopped with SIGTERM."""

    def __init__(self) -> None:  # noqa: D107 - the parent's attributes, another server
        self.http, self.grpc, self.metrics = free_ports(3)
        self.work = tempfile.TemporaryDirectory(prefix="tritonserver-bench-")
        self.log = tempfile.NamedTemporaryFile(prefix="triton-repo-bench-", suffix=".log", delete=False)  # noqa: SIM115
        argv, env = standalone_command(
            Path(self.work.name), http_port=self.http, grpc_port=self.grpc, metrics_port=self.metrics
        )
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def stop(self) -> int:
        """SIGTERM tritonserver (it stops its stubs), wait for it; its exit code."""
        try:
            return super().stop()
        finally:
            self.work.cleanup()


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    base = results["torch"]
    out: dict[str, Any] = {}
    for name, row in results.items():
        if not isinstance(row, dict) or "sentences_per_s" not in row or name == "torch":
            continue
        out[f"{name}_vs_torch_sentences"] = round(row["sentences_per_s"] / base["sentences_per_s"], 2)
        if "documents_per_s" in row and "documents_per_s" in base:
            out[f"{name}_vs_torch_documents"] = round(row["documents_per_s"] / base["documents_per_s"], 2)
    for name, row in results.items():
        if isinstance(row, dict) and "overhead_1_client" in row:
            inproc = results[row["backend"]]["by_clients"]
            one, eight = row["by_clients"]["1"], row["by_clients"]["8"]
            out[f"{name}_added_p50_ms_1_client"] = row["overhead_1_client"]["added_p50_ms"]
            out[f"{name}_p50_minus_best_in_process_p50_ms"] = round(one["p50_ms"] - inproc["1"]["p50_ms"], 2)
            out[f"{name}_batching_gain_8_vs_1"] = round(eight["sentences_per_s"] / one["sentences_per_s"], 2)
    return out


def table(results: dict[str, Any]) -> Table:
    t = Table(title="Embedding backends (SciFact; sentences: 1 per request; documents: batches of 64)")
    for col in ("backend", "clients", "sentences/s", "p50 ms", "p99 ms", "vs torch", "documents/s", "vs torch"):
        t.add_column(col, justify="left" if col == "backend" else "right")
    base = results["torch"]
    for name, row in results.items():
        if not isinstance(row, dict) or "by_clients" not in row:
            continue
        label = f"{name} ({row['backend']})" if "backend" in row else name
        for clients in ("1", "8"):
            r = row["by_clients"][clients]
            ratio = r["sentences_per_s"] / base["by_clients"][clients]["sentences_per_s"]
            docs = row.get("documents_per_s") if clients == "8" else None
            doc_ratio = f"{docs / base['documents_per_s']:.2f}x" if docs and base.get("documents_per_s") else ""
            t.add_row(label if clients == "1" else "", clients, f"{r['sentences_per_s']:.1f}", f"{r['p50_ms']:.2f}",
                      f"{r['p99_ms']:.2f}", f"{ratio:.2f}x", f"{docs:.1f}" if docs else "", doc_ratio)
    return t


def markdown(results: dict[str, Any]) -> str:
    lines = ["| backend | clients | sentences/s | p50 ms | p99 ms | vs torch | documents/s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    base = results["torch"]
    for name, row in results.items():
        if not isinstance(row, dict) or "by_clients" not in row:
            continue
        label = f"{name} ({row['backend']})" if "backend" in row else name
        for clients in ("1", "8"):
            r = row["by_clients"][clients]
            ratio = r["sentences_per_s"] / base["by_clients"][clients]["sentences_per_s"]
            docs = f"{row['documents_per_s']:.1f}" if clients == "8" and "documents_per_s" in row else ""
            lines.append(f"| {label} | {clients} | {r['sentences_per_s']:.1f} | {r['p50_ms']:.2f} | "
                         f"{r['p99_ms']:.2f} | {ratio:.2f}x | {docs} |")
    return "\n".join([*lines, "", *overhead_lines(results)]) + "\n"


def overhead_lines(results: dict[str, Any]) -> list[str]:
    """One sentence per Triton wire: what it adds to one request (the side-by-side phase)."""
    lines = []
    for name, row in results.items():
        if isinstance(row, dict) and "overhead_1_client" in row:
            o = row["overhead_1_client"]
            lines.append(
                f"{name} adds {o['added_p50_ms']:.2f} ms p50 to one request ({o['triton_p50_ms']:.2f} vs "
                f"{o['in_process_p50_ms']:.2f} ms for {row['backend']} in process, {o['blocks']} alternating "
                f"blocks of {OVERHEAD_BLOCK})"
            )
    return lines


def run(args: argparse.Namespace) -> dict[str, Any]:
    sentences, documents = load_texts(args.scifact, args.documents)
    cache = args.cache_dir
    backend_key = {"onnx-fp32": "onnx_fp32", "onnx": "onnx_int8", "onnx-int8": "onnx_int8", "torch": "torch"}
    results: dict[str, Any] = {"config": {
        "cpus": len(os.sched_getaffinity(0)), "seconds_per_phase": args.seconds, "rounds": args.rounds,
        "documents": len(documents), "sentences": len(sentences), "triton_backend": args.triton_backend,
        "triton_max_batch_size": args.max_batch, "triton_max_queue_delay_us": args.delay_us,
        "triton_shared_memory": args.shared_memory, "triton_repository": args.repository,
        "load_average_start": round(os.getloadavg()[0], 2),
    }}
    backends: dict[str, Embedder] = {
        "torch": SentenceTransformerEmbedder("all-MiniLM-L6-v2", batch_size=64, device="cpu"),
        "onnx_fp32": OnnxEmbedder.from_url(BACKENDS["onnx-fp32"], cache, batch_size=64),
        "onnx_int8": OnnxEmbedder.from_url(BACKENDS["onnx"], cache, batch_size=64),
    }
    if args.batched:  # Quarry's in-process dynamic batching (what the REST query path uses)
        backends["onnx_int8_batched"] = BatchingEmbedder(backends["onnx_int8"])
    # (prefix, server, the in-process backend it wraps)
    servers: list[tuple[str, TritonProcess, str]] = []
    clients: dict[str, TritonEmbedder] = {}
    wraps: dict[str, str] = {}
    try:
        servers.append(("triton", TritonProcess(
            args.triton_backend, cache, args.max_batch, args.delay_us, args.shared_memory
        ), backend_key[args.triton_backend]))
        if args.repository:  # model_repository/'s CPU config runs sentence-transformers on torch
            servers.append(("triton_repo", RepositoryProcess(), "torch"))
        for prefix, server, wrapped in servers:
            for wire, port in (("grpc", server.grpc), ("http", server.http)):
                url = f"triton+{wire}://127.0.0.1:{port}/minilm"
                clients[f"{prefix}_{wire}"] = TritonEmbedder.from_url(url, timeout_s=60)
                wraps[f"{prefix}_{wire}"] = wrapped
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in [*backends, *clients]}
        pairs: dict[str, list[tuple[float, float]]] = {name: [] for name in clients}
        for _ in range(args.rounds):  # interleaved rounds: a burst of load elsewhere hits one round only
            for name, embedder in {**backends, **clients}.items():
                docs = [] if name.endswith("_batched") else documents
                rows[name].append(measure(name, embedder, sentences, docs, args.seconds))
            for name, client in clients.items():
                pairs[name] += paired_overhead(backends[wraps[name]], client, sentences, args.seconds)
    finally:
        for client in clients.values():  # open HTTP connections hold tritonserver's exit 10 s (exit 1)
            client.close()
        for prefix, server, _ in servers:
            results["config"][f"{prefix}_exit_code"] = server.stop()
    for name, measured in rows.items():
        results[name] = best_of(measured)
        if name in clients:
            results[name]["backend"] = wraps[name]
            results[name]["overhead_1_client"] = overhead_summary(pairs[name])
    results["config"]["load_average_end"] = round(os.getloadavg()[0], 2)
    results["ratios"] = ratios(results)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scifact", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--seconds", type=float, default=6.0, help="duration of each load phase")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; the best round is kept")
    parser.add_argument("--documents", type=int, default=128, help="SciFact documents for documents/s (0: skip)")
    parser.add_argument("--triton-backend", default="onnx-fp32", choices=["onnx-fp32", "onnx", "torch"])
    parser.add_argument("--max-batch", type=int, default=64, help="Triton max batch size")
    parser.add_argument("--delay-us", type=int, default=0, help="Triton max queue delay (microseconds)")
    parser.add_argument("--shared-memory", action="store_true",
                        help="Triton passes tensors through PyTriton's shared-memory TensorStore (its default)")
    parser.add_argument("--batched", action="store_true", help="also measure onnx_int8 behind BatchingEmbedder")
    parser.add_argument("--repository", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure the stock tritonserver on model_repository/ (torch in the stub)")
    parser.add_argument("--cache-dir", type=Path, default=REPO / "data" / "models", help="ONNX export cache")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    results = run(args)
    console.print(table(results))
    for line in overhead_lines(results):
        console.print(line)
    console.print(results["ratios"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if args.markdown:
        args.markdown.write_text(markdown(results))


if __name__ == "__main__":
    main()
