"""A replica started after 10,000 writes catches up: snapshot + change-log tail (issue 25, point 4).

On the shared PostgreSQL docstore (a schema of its own): replica A follows from the start and
saves a snapshot at seq 1; 10,000 single-document writes (upserts of 2,000 ids with new texts,
and deletes) follow; replica B starts from A's old snapshot and replays the tail, replica C has no
snapshot and reads the rows whole. All three then answer with the same N, avgdl, df and ranking.
"""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

import pytest

from indexing.docstore import StoredChunk, StoredDocument, open_docstore
from quarry.settings import BM25Settings
from indexing.bm25_registry import BM25Registry
from tests.state.conftest import pg_schema

pytestmark = pytest.mark.integration

WORDS = "heron egret otter badger lynx marten stoat vole shrew mole finch wren lark rook crane ibis".split()


def _write(store, name: str, doc: str, text: str | None) -> None:  # type: ignore[no-untyped-def]
    if text is None:
        store.write_batch(name, [], [], [], deleted_document_ids=[doc])
        return
    tokens = text.split()
    store.write_batch(
        name, [StoredDocument(doc, str(hash(text)), None, text, {})],
        [StoredChunk(f"{doc}#0", doc, 0, text, tokens, {})], [],
    )


def test_a_replica_started_after_10000_writes_catches_up(tmp_path: Path) -> None:
    rng = random.Random(3)
    with pg_schema() as url:
        store = open_docstore(url, tmp_path)
        try:
            name = "follow"
            store.put_collection(name, {"name": name, "language": "en"})
            _write(store, name, "d0", "heron egret")
            a = BM25Registry(store, tmp_path / "a", BM25Settings())
            a.get(name)  # follows from seq 1; its snapshot is saved there
            shutil.copytree(tmp_path / "a", tmp_path / "b")
            started = time.perf_counter()
            for _ in range(10_000):
                doc = f"d{rng.randrange(2000)}"
                text = None if rng.random() < 0.1 else " ".join(rng.choices(WORDS, k=rng.randrange(3, 12)))
                _write(store, name, doc, text)
            wrote_s = time.perf_counter() - started
            a.invalidate(name)
            assert store.version(name) == 10_001
            t = time.perf_counter()
            b = BM25Registry(store, tmp_path / "b", BM25Settings())  # old snapshot + 10,000-write tail
            view_b = b.get(name)
            tail_s = time.perf_counter() - t
            t = time.perf_counter()
            c = BM25Registry(store, tmp_path / "c", BM25Settings())  # no snapshot: the rows whole
            view_c = c.get(name)
            fresh_s = time.perf_counter() - t
            view_a = a.get(name)
            assert view_a.version == view_b.version == view_c.version == 10_001
            stats = view_a.statistics(WORDS)
            assert view_b.statistics(WORDS) == stats and view_c.statistics(WORDS) == stats
            assert stats[0] == store.counts(name)[1]
            for q in (["heron"], ["lynx", "vole", "vole"], ["crane", "ibis", "wren"]):
                ranked = []
                for view in (view_a, view_b, view_c):
                    rows, scores = view.top(q, 10_000)  # every scoring row: ties fall in row order, which differs
                    pairs = zip(rows.tolist(), scores.tolist(), strict=True)
                    ranked.append(sorted((view.chunk_ids[r], round(s, 4)) for r, s in pairs))
                assert ranked[0] == ranked[1] == ranked[2]
            print(f"\n10,000 writes in {wrote_s:.1f} s; catch-up: snapshot + tail {tail_s:.2f} s, "
                  f"no snapshot (rows whole) {fresh_s:.2f} s")
        finally:
            store.close()

