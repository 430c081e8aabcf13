"""Benchmark an unchanged-model reindex against the initial ingest of the same data, in one run.

Usage::

    python bench/reindex.py [--docs N] [--store-url URL] [--docstore-url URL] [--json FILE]

Ingests the first ``N`` SciFact documents (``../shared/data/scifact``) into a fresh collection with
the configured embedder (the packaged MiniLM by default), timing it; then reindexes the collection
with the model unchanged, timing it and counting the embedding calls the reindex made (issue 22,
acceptance 3: 0 calls and at most 0.25x the ingest time). The collection is dropped at the end.
Prints (and with ``--json`` writes) ``ingest_s``, ``reindex_s``, ``ratio``, ``embed_calls``,
``chunks``, ``recall``.
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    """Run the benchmark (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--store-url", default="")
    parser.add_argument("--docstore-url", default="")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), store=StoreSettings(url=args.store_url),
                            docstore=DocstoreSettings(url=args.docstore_url))
        model = Counting(open_embedder(settings.embedding.url, settings))
        model.warm_up()
        quarry = Quarry(settings, embedder=model)  # type: ignore[arg-type]  # an Embedder by its attributes
        name = f"bench_reindex_{uuid.uuid4().hex[:8]}"
        docs = [d for _, d in zip(range(args.docs), iter_jsonl(DATA), strict=False)]
        try:
            quarry.create_collection(name)
            started = time.perf_counter()
            quarry.upsert(name, docs)
            ingest_s = time.perf_counter() - started
            calls = model.calls
            started = time.perf_counter()
            report = quarry.reindex(name)
            reindex_s = time.perf_counter() - started
            out = {
                "docs": len(docs), "chunks": report.chunks, "ingest_s": round(ingest_s, 3),
                "reindex_s": round(reindex_s, 3), "ratio": round(reindex_s / ingest_s, 4),
                "embed_calls": model.calls - calls, "recall": report.recall, "store": args.store_url or "milvus-lite",
            }
        finally:
            quarry.drop_collection(name)
            quarry.close()
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
