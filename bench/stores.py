"""Benchmark every vector store on GloVe-100k at the index planner's parameters, with hnswlib.

Usage::

    python bench/stores.py [--json FILE] [--markdown FILE] [--backends milvus-lite ...] [--n-base N]

Per backend: ingest the 100k L2-normalised GloVe vectors (``../shared/data/glove-50-angular-100k``),
build the index :func:`indexing.planner.plan_for_store` picks for (100k, 50) under 16 GiB, then
time a single-query loop (one client, one query per call, ``top_k`` 10, after a warm-up) and
measure recall@10 against the exact ground truth. ``hnswlib`` runs on the same data in the same
process with ``M``/``efConstruction``/``ef`` equal to the planner's HNSW parameters, and once more
over an ``ef`` sweep so each backend can be compared at equal recall: ``x hnswlib`` is the
backend's QPS over hnswlib's QPS at the smallest swept ``ef`` whose recall is at least the
backend's (hnswlib's best recall when no ``ef`` reaches it), re-measured right after the
backend's loop so both run under the same machine load. hnswlib searches with one thread, and so
does qdrant-edge (``?search_threads=1``: one query needs no hand-off to the shard's search pool). ``batch QPS`` is one
``search`` call with all 1k queries (the engine may use its threads; hnswlib uses one), which
shows the engine's throughput without the per-call round trip.

``--json FILE`` writes ``{"<backend>": {"recall@10", "qps", "build_s", ...}, "hnswlib": {...}}``.
Server backends must be running (``bash scripts/services.sh start``); their URLs are options.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# Run as ``python bench/stores.py``: this file's folder would shadow the ``stores`` package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import hnswlib  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from indexing.ann_data import AnnDataset, load_ann_dataset, recall_at_k  # noqa: E402
from indexing.index_sizing import GIB, hnsw_ef, hnsw_m  # noqa: E402
from indexing.planner import plan_for_store  # noqa: E402
from stores.base import VectorRecord, VectorStore  # noqa: E402
from stores.factory import open_store  # noqa: E402

REPO = _HERE.parent
DEFAULT_DATA = REPO.parent / "shared" / "data" / "glove-50-angular-100k"
TOP_K = 10
WARMUP = 50
BATCH = 10_000
EF_SWEEP = (10, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass
class Result:
    """One row of the table (and of the JSON file)."""

    kind: str
    params: str
    ingest_s: float
    build_s: float
    qps: float
    recall: float
    batch_qps: float = 0.0
    vs_hnswlib: float | None = None
    hnswlib_ef: int | None = None
    hnswlib_recall: float | None = None
    hnswlib_qps: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form: ``recall@10``, ``qps``, ``build_s`` and the other fields."""
        data = asdict(self)
        data["recall@10"] = data.pop("recall")
        return data


def backend_urls(args: argparse.Namespace, tmp: Path) -> dict[str, str]:
    return {
        "milvus-lite": f"milvus://{tmp}/bench.db",
        "milvus-server": args.milvus_url,
        "qdrant-edge": f"qdrant://{tmp}/qdrant?search_threads=1",  # one thread, as hnswlib here
        "qdrant-local": f"qdrant+local://{tmp}/qdrant-local",
        "pgvector": args.pg_url,
    }


def query_loop(search: Any, queries: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.int64], float]:
    """Run one query per call; return ``(q, TOP_K)`` ids (``-1`` padded) and queries/second."""
    for q in queries[:WARMUP]:
        search(q)
    found = np.full((len(queries), TOP_K), -1, dtype=np.int64)
    t0 = time.perf_counter()
    for row, q in enumerate(queries):
        ids = search(q)
        found[row, : len(ids)] = ids
    return found, len(queries) / (time.perf_counter() - t0)


def bench_store(url: str, data: AnnDataset) -> Result:
    store = open_store(url)
    name = f"bench_{uuid.uuid4().hex[:8]}"
    try:
        return _bench_open_store(store, name, data)
    finally:
        store.drop_collection(name)
        store.close()


def _bench_open_store(store: VectorStore, name: str, data: AnnDataset) -> Result:
    store.create_collection(name, data.dim, "cosine")
    t0 = time.perf_counter()
    for start in range(0, len(data.base), BATCH):
        rows = range(start, min(start + BATCH, len(data.base)))
        store.upsert(name, [VectorRecord(str(i), data.base[i]) for i in rows])
    ingest_s = time.perf_counter() - t0
    plan = plan_for_store(store, len(data.base), data.dim, 16 * GIB, top_k=TOP_K)
    t0 = time.perf_counter()
    store.build_index(name, plan.spec, timeout_s=1800)
    build_s = time.perf_counter() - t0

    def search(q: npt.NDArray[np.float32]) -> list[int]:
        return [int(h.id) for h in store.search(name, q[None, :], TOP_K)[0]]

    found, qps = query_loop(search, data.queries)
    t0 = time.perf_counter()
    store.search(name, data.queries, TOP_K)
    batch_qps = len(data.queries) / (time.perf_counter() - t0)
    params = {**plan.spec.params, **plan.spec.search_params}
    return Result(
        kind=plan.spec.kind,
        params=", ".join(f"{k}={v}" for k, v in params.items()),
        ingest_s=ingest_s,
        build_s=build_s,
        qps=qps,
        recall=recall_at_k(found, data.groundtruth, TOP_K),
        batch_qps=batch_qps,
    )


class HnswBaseline:
    """hnswlib on the same data: built once, re-measured next to each backend (same load)."""

    def __init__(self, data: AnnDataset) -> None:
        """Build the index with the planner's HNSW ``M``/``efConstruction`` for this data size."""
        n, dim = data.base.shape
        self.data, self.m, self.ef = data, hnsw_m(n, dim), hnsw_ef(n, TOP_K)
        t0 = time.perf_counter()
        self.index = hnswlib.Index(space="ip", dim=dim)
        self.index.init_index(max_elements=n, M=self.m, ef_construction=200, random_seed=100)
        self.index.add_items(data.base, np.arange(n))
        self.build_s = time.perf_counter() - t0
        self.index.set_num_threads(1)
        self.sweep = [(e, *self.run(e)) for e in EF_SWEEP]

    def run(self, ef: int) -> tuple[float, float]:
        """``(recall@10, QPS)`` of a single-query loop at ``ef``."""
        self.index.set_ef(ef)
        found, qps = query_loop(lambda q: self.index.knn_query(q, k=TOP_K)[0][0], self.data.queries)
        return recall_at_k(found, self.data.groundtruth, TOP_K), qps

    def result(self) -> Result:
        """The baseline row at the planner's parameters."""
        recall, qps = self.run(self.ef)
        self.index.set_num_threads(1)
        t0 = time.perf_counter()
        self.index.knn_query(self.data.queries, k=TOP_K)
        batch_qps = len(self.data.queries) / (time.perf_counter() - t0)
        params = f"M={self.m}, efConstruction=200, ef={self.ef}"
        return Result("HNSW", params, 0.0, self.build_s, qps, recall, batch_qps)

    def attach_ratio(self, result: Result) -> None:
        """Compare with hnswlib, measured now, at the smallest swept ``ef`` reaching the recall."""
        reaching = [point for point in self.sweep if point[1] >= result.recall]
        ef = (reaching[0] if reaching else max(self.sweep, key=lambda p: (p[1], p[2])))[0]
        recall, qps = self.run(ef)
        result.hnswlib_ef, result.hnswlib_recall, result.hnswlib_qps = ef, recall, qps
        result.vs_hnswlib = result.qps / qps


def render(results: dict[str, Result], data: AnnDataset) -> Table:
    n, dim = data.base.shape
    title = f"{n:,} x {dim} (cosine), top_k={TOP_K}, single-query loop, 1 client"
    table = Table(title=title)
    cols = ("backend", "index", "params", "ingest s", "build s", "QPS", "batch QPS", "recall@10")
    for col in cols:
        table.add_column(col, justify="left" if col in ("backend", "index", "params") else "right")
    table.add_column("x hnswlib", justify="right")
    table.add_column("hnswlib at equal recall", justify="right")
    for name, r in results.items():
        ratio, ref = "-", "-"
        if r.vs_hnswlib is not None:
            ratio = f"{r.vs_hnswlib:.2f}x"
            ref = f"ef={r.hnswlib_ef}: {r.hnswlib_recall:.4f}, {r.hnswlib_qps:,.0f} QPS"
        table.add_row(
            name,
            r.kind,
            r.params,
            f"{r.ingest_s:.1f}",
            f"{r.build_s:.1f}",
            f"{r.qps:,.0f}",
            f"{r.batch_qps:,.0f}",
            f"{r.recall:.4f}",
            ratio,
            ref,
        )
    return table


def markdown(results: dict[str, Result]) -> str:
    """A GitHub table of the results (for the README)."""
    lines = [
        "| backend | index | params | build s | QPS | batch QPS | recall@10 | x hnswlib (equal recall) |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        ratio = f"{r.vs_hnswlib:.2f}x (ef={r.hnswlib_ef})" if r.vs_hnswlib is not None else "-"
        lines.append(
            f"| {name} | {r.kind} | {r.params} | {r.build_s:.1f} | {r.qps:,.0f} | {r.batch_qps:,.0f} | "
            f"{r.recall:.4f} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    parser.add_argument(
        "--backends",
        nargs="+",
        default=["milvus-lite", "milvus-server", "qdrant-edge", "pgvector"],
        choices=["milvus-lite", "milvus-server", "qdrant-edge", "qdrant-local", "pgvector"],
    )
    parser.add_argument("--markdown", type=Path, help="write a Markdown table to this file")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="texmex-format ANN set")
    parser.add_argument("--n-base", type=int, help="use only the first N base vectors (quick runs)")
    parser.add_argument(
        "--milvus-url",
        default="milvus://127.0.0.1:19530",
        help="add ?consistency=Session to skip Strong's ~200 ms wait for the next time tick per search",
    )
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5433/quarry")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 170)
    data = load_ann_dataset(args.data, n_base=args.n_base)
    console.print(f"data: {len(data.base):,} x {data.dim}, {len(data.queries):,} queries")
    baseline = HnswBaseline(data)
    results: dict[str, Result] = {}
    with tempfile.TemporaryDirectory(prefix="quarry-bench-") as tmp:
        urls = backend_urls(args, Path(tmp))
        for name in args.backends:
            console.print(f"[bold]{name}[/bold]: {urls[name]}")
            results[name] = bench_store(urls[name], data)
            baseline.attach_ratio(results[name])
    results["hnswlib"] = baseline.result()
    baseline.attach_ratio(results["hnswlib"])
    console.print(render(results, data))
    if args.markdown:
        args.markdown.write_text(markdown(results))
    if args.json:
        payload: dict[str, Any] = {name: r.to_json() for name, r in results.items()}
        payload["hnswlib"]["ef_sweep"] = [{"ef": ef, "recall@10": rec, "qps": qps} for ef, rec, qps in baseline.sweep]
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
