"""Benchmark an unchanged-model reindex against the initial ingest of the same data, in one run.

Usage::

    python bench/reindex.py [--docs N] [--stores milvus-lite,pgvector] [--rounds R]
                            [--pg-url URL] [--docstore-url URL] [--json FILE]

For each store in turn (rounds alternate the order: a, b, b, a, ...), ingests the first ``N``
SciFact documents (``../shared/data/scifact``) into a fresh collection with the configured
embedder (the packaged MiniLM on torch by default), timing it; then reindexes the collection
with the model unchanged, timing it and counting the embedding calls the reindex made (issue 22,
acceptance 3: 0 calls and at most 0.25x the ingest time). The collection is dropped at the end.
Prints one JSON line per run (``ingest_s``, ``reindex_s``, ``ratio``, ``embed_calls``,
``copied``, ``chunks``, ``recall``) and the per-store median and worst ratio.

Measured 2026-12-03 on the shared 2-core machine (load average 13-28, torch MiniLM, SQLite
docstore in a temporary folder):

* ``--docs 400 --rounds 2``: Milvus Lite, 576 chunks: ingest 960.0 s, reindex 11.6 s, ratio
  0.012, 0 embedding calls (576 vectors copied), recall 1.0 (the pgvector run was cut by the
  command's 30-minute timeout);
* ``--docs 100 --rounds 2 --stores pgvector,milvus-lite`` (round 1; round 2 stopped for time):
  pgvector, 147 chunks: ingest 334.6 s, reindex 0.88 s, ratio 0.0026, 0 calls; Milvus Lite:
  ingest 168.4 s, reindex 3.43 s, ratio 0.020, 0 calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from embedding.base import Embedder, Embeddings  # noqa: E402
from embedding.factory import open_embedder  # noqa: E402
from indexing.sources import iter_jsonl  # noqa: E402
from quarry.service import Quarry  # noqa: E402
from quarry.settings import DocstoreSettings, Settings, StoreSettings  # noqa: E402

DATA = _HERE.parent.parent / "shared" / "data" / "scifact" / "corpus.jsonl"


class Counting:
    """The real embedder, counting the calls made to it."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """Embed ``texts`` with the real model, counting the call."""
        self.calls += 1
        return self.inner.embed(texts)


STORES = {"milvus-lite": "", "pgvector": "postgresql://postgres@127.0.0.1:5433/quarry"}


def one_run(store: str, store_url: str, docs: list[Any], docstore_url: str) -> dict[str, Any]:
    """Ingest ``docs`` into a fresh collection on ``store_url``, then reindex it unchanged; the figures."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), store=StoreSettings(url=store_url),
                            docstore=DocstoreSettings(url=docstore_url))
        model = Counting(open_embedder(settings.embedding.url, settings))
        model.warm_up()
        quarry = Quarry(settings, embedder=model)  # an Embedder by its attributes
        name = f"bench_reindex_{uuid.uuid4().hex[:8]}"
        try:
            quarry.create_collection(name)
            started = time.perf_counter()
            quarry.upsert(name, docs)
            ingest_s = time.perf_counter() - started
            calls = model.calls
            started = time.perf_counter()
            report = quarry.reindex(name)
            reindex_s = time.perf_counter() - started
            return {
                "store": store, "docs": len(docs), "chunks": report.chunks, "ingest_s": round(ingest_s, 3),
                "ingest_embed_calls": calls, "reindex_s": round(reindex_s, 3),
                "ratio": round(reindex_s / ingest_s, 4), "embed_calls": model.calls - calls,
                "copied": report.copied, "embedded": report.embedded, "recall": report.recall,
            }
        finally:
            quarry.drop_collection(name)
            quarry.close()


def main() -> None:
    """Run the benchmark (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000, help="SciFact's first N documents")
    parser.add_argument("--stores", default="milvus-lite,pgvector", help=f"comma-separated, of {sorted(STORES)}")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, each running every store in turn")
    parser.add_argument("--pg-url", default=STORES["pgvector"])
    parser.add_argument("--docstore-url", default="", help="default: SQLite in a temporary folder")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    urls = {**STORES, "pgvector": args.pg_url}
    stores = args.stores.split(",")
    docs = [d for _, d in zip(range(args.docs), iter_jsonl(DATA), strict=False)]
    runs = []
    for r in range(args.rounds):  # alternated: a, b, b, a, ... so that a drift of the machine's load cancels out
        for store in stores if r % 2 == 0 else stores[::-1]:
            runs.append({"round": r + 1, **one_run(store, urls[store], docs, args.docstore_url)})
            print(json.dumps(runs[-1]), flush=True)
    summary = {
        store: {"median_ratio": statistics.median(x["ratio"] for x in runs if x["store"] == store),
                "max_ratio": max(x["ratio"] for x in runs if x["store"] == store),
                "embed_calls": sum(x["embed_calls"] for x in runs if x["store"] == store)}
        for store in stores
    }
    out = {"runs": runs, "summary": summary}
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
