"""Reindex with another chunking (issue 22, ``--chunk-size``): chunks per version.

Real engines: Milvus Lite with the SQLite docstore, pgvector with the PostgreSQL docstore (the
shared test server), the packaged MiniLM. 30 SciFact documents cut at 128 tokens, re-cut at 32.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from indexing.chunking import count_tokens
from indexing.docstore import StoredChunk, StoredDocument, chunking_id_of
from indexing.document_rules import SourceDocument
from indexing.reindex_build import sections_of
from quarry.errors import InvalidRequest, ReindexFailed
from quarry.service import Quarry
from quarry.settings import Settings
from tests.core.conftest import CountingEmbedder

_names = itertools.count()
RUN = uuid.uuid4().hex[:6]  # the PostgreSQL server is shared: names unique to this run
DOCS = 30
OLD, NEW = (128, 16), (32, 4)




@pytest.fixture()
def filled(svc: Quarry, scifact_docs: list[SourceDocument]) -> Iterator[str]:
    """A collection of ``DOCS`` SciFact documents cut at 128 tokens (overlap 16), dropped afterwards."""
    name = f"rc{RUN}_{next(_names)}"
    svc.create_collection(name, chunk_size=OLD[0], chunk_overlap=OLD[1])
    svc.upsert(name, scifact_docs[:DOCS])
    yield name
    svc.drop_collection(name)


def _hits(service: Quarry, name: str, mode: str, query: str) -> list[tuple[str, str, str]]:
    result = service.search(name, query, top_k=10, mode=mode, group=False)  # type: ignore[arg-type]
    assert not result.degraded, result.degraded
    return [(h.document_id, h.chunk_id, h.text) for h in result.hits]


def _snapshot(service: Quarry, name: str, queries: list[str]) -> dict[tuple[str, str], list[tuple[str, str, str]]]:
    return {(m, q): _hits(service, name, m, q) for m in ("bm25", "dense", "hybrid") for q in queries}


def _texts(service: Quarry, name: str, chunking: str | None = None) -> dict[str, str]:
    """Every chunk id -> text of the collection in ``chunking`` (``None``: the live one)."""
    ids = service.docstore.document_ids(name)
    owned = service.docstore.chunk_ids_of(name, ids, chunking=chunking)
    chunks = service.docstore.get_chunks(name, [c for cs in owned.values() for c in cs], chunking=chunking)
    return {i: c.text for i, c in chunks.items()}


def test_rechunk_to_a_smaller_size(  # noqa: PLR0915 - one story, checked at each step
    svc: Quarry, filled: str, counting: CountingEmbedder, scifact_docs: list[SourceDocument]
) -> None:
    service = svc
    queries = [d.title for d in scifact_docs[:DOCS:6]]
    old_texts = _texts(service, filled)
    _, old_chunks = service.docstore.counts(filled)
    calls = counting.calls
    during: list[list[tuple[str, str, str]]] = []

    def search_while_building(phase: str, done: int) -> None:  # the old version and its chunks answer
        during.extend(_hits(service, filled, m, queries[0]) for m in ("bm25", "hybrid"))

    service.reindexer.on_batch = search_while_building
    try:
        report = service.reindex(filled, chunk_size=NEW[0], chunk_overlap=NEW[1])
    finally:
        service.reindexer.on_batch = None
    assert during and all(old_texts.get(c) == t for hits in during for _, c, t in hits)
    assert counting.calls > calls and report.embedded > 0  # new chunks: embedded
    live = service.live_version(filled)
    new_id = chunking_id_of(live.chunking)
    assert (live.version, new_id) == (2, f"v2s{NEW[0]}o{NEW[1]}")
    documents, chunks = service.docstore.counts(filled)
    assert documents == DOCS and chunks > 2 * old_chunks  # a smaller cut: more chunks
    assert report.chunks == chunks == service.store.count(live.physical_name) == report.copied + report.embedded
    new_texts = _texts(service, filled)
    assert len(new_texts) == chunks and max(count_tokens(t) for t in new_texts.values()) <= NEW[0]
    assert _texts(service, filled, "") == old_texts  # the old chunking's rows stay for rollback
    for (mode, query), hits in _snapshot(service, filled, queries).items():
        assert hits, (mode, query)
        for _doc_id, chunk_id, text in hits:  # from the new chunks, in every channel
            assert new_texts.get(chunk_id) == text and count_tokens(text) <= NEW[0], (mode, chunk_id)
    described = service.describe(filled)
    assert (described["chunk_size"], described["chunk_overlap"], described["chunks"]) == (*NEW, chunks)
    assert [(v["version"], v["state"], v["chunking"]["chunk_size"], v["chunks"]) for v in described["versions"]] == [
        (1, "retired", OLD[0], old_chunks), (2, "live", NEW[0], chunks)]
    assert service.get_collection(filled).chunk_size == NEW[0]  # new ingests cut at the new size
    late = SourceDocument(id="late", title="Late", text=scifact_docs[DOCS].text)
    service.upsert_stream(filled, iter([late]))  # `quarry ingest`'s path: the live version's store and chunking
    late_chunks = service.docstore.chunk_ids_of(filled, ["late"])["late"]
    assert late_chunks and all(count_tokens(t) <= NEW[0] for c, t in _texts(service, filled).items()
                               if c in late_chunks)
    assert len(service.store.get(live.physical_name, late_chunks)) == len(late_chunks)
    service.delete_documents(filled, ["late"])

    # an unchanged chunking on top: the rows are shared, no model call
    calls = counting.calls
    again = service.reindex(filled)
    assert counting.calls == calls and again.embedded == 0 and again.chunks == chunks
    assert chunking_id_of(service.live_version(filled).chunking) == new_id


def test_rollback_restores_the_old_chunking_and_purge_deletes_the_new(
    svc: Quarry, filled: str, scifact_docs: list[SourceDocument]
) -> None:
    service = svc
    queries = [d.title for d in scifact_docs[:DOCS:6]]
    before = _snapshot(service, filled, queries)
    old_texts = _texts(service, filled)
    service.reindex(filled, chunk_size=NEW[0], chunk_overlap=NEW[1])
    new_id = chunking_id_of(service.live_version(filled).chunking)
    assert _snapshot(service, filled, queries) != before
    service.rollback(filled)
    assert service.live_version(filled).version == 1
    assert service.describe(filled)["chunk_size"] == OLD[0] and service.get_collection(filled).chunk_size == OLD[0]
    assert service.docstore.counts(filled)[1] == len(old_texts)
    assert _texts(service, filled) == old_texts  # the old chunk count and texts
    assert _snapshot(service, filled, queries) == before
    # retention over: the retired version and its chunking's rows go
    assert service.docstore.counts(filled, chunking=new_id)[1] > 0
    assert service.reindexer.purge(filled, now=time.time() + 10 * service.settings.reindex.retention_s) == [2]
    assert service.docstore.counts(filled, chunking=new_id)[1] == 0
    assert _snapshot(service, filled, queries) == before


def test_writes_during_a_rechunk_reach_the_new_chunking(
    svc: Quarry, filled: str, scifact_docs: list[SourceDocument]
) -> None:
    service = svc
    inserted = [SourceDocument(id=d.id, title=d.title, text=f"{d.text} insmark{i:03d}")
                for i, d in enumerate(scifact_docs[DOCS : DOCS + 3])]
    changed = [SourceDocument(id=d.id, title=d.title, text=f"zebracorn quokkafish chgmark{i:03d}")
               for i, d in enumerate(scifact_docs[:3])]
    deleted = [d.id for d in scifact_docs[10:13]]
    errors: list[BaseException] = []

    def write() -> None:
        try:
            service.upsert(filled, inserted)
            service.upsert(filled, changed)
            service.delete_documents(filled, deleted)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def during(phase: str, done: int) -> None:
        if phase == "copy" and not getattr(during, "ran", False):
            during.ran = True  # type: ignore[attr-defined]
            thread = threading.Thread(target=write)  # another thread: the write lock is not the reindex's
            thread.start()
            thread.join()

    batch_size = service.settings.reindex.batch_size
    service.settings.reindex.batch_size = 16  # pages of 4 documents: the writes fall between copy batches
    service.reindexer.on_batch = during
    try:
        report = service.reindex(filled, chunk_size=NEW[0], chunk_overlap=NEW[1])
    finally:
        service.reindexer.on_batch = None
        service.settings.reindex.batch_size = batch_size
    assert not errors and getattr(during, "ran", False), errors
    assert report.replayed >= 9
    live = service.live_version(filled)
    documents, chunks = service.docstore.counts(filled)
    assert documents == DOCS + 3 - 3 and chunks == service.store.count(live.physical_name) == report.chunks
    owned = service.docstore.chunk_ids_of(filled, [*deleted, *(d.id for d in inserted + changed)])
    assert not set(owned) & set(deleted) and all(d.id in owned for d in inserted + changed)
    texts = _texts(service, filled)
    assert all(count_tokens(t) <= NEW[0] for t in texts.values())
    for i, doc in enumerate(changed):  # its final text, in the new chunking
        assert [texts[c] for c in owned[doc.id]] == [f"zebracorn quokkafish chgmark{i:03d}"]
    for doc_id in deleted:  # no deleted one returns
        title = next(d.title for d in scifact_docs if d.id == doc_id)
        for mode in ("bm25", "dense", "hybrid"):
            assert doc_id not in [h[0] for h in _hits(service, filled, mode, title)], (mode, doc_id)
    for marker, docs in (("insmark", inserted), ("chgmark", changed)):
        for i, doc in enumerate(docs):
            for mode in ("bm25", "hybrid"):
                assert doc.id in [h[0] for h in _hits(service, filled, mode, f"{marker}{i:03d}")], (mode, doc.id)
    for doc in inserted:
        assert doc.id in [h[0] for h in _hits(service, filled, "dense", doc.title)], doc.id


def test_failed_or_killed_rechunk_leaves_the_old_chunking(
    svc: Quarry, filled: str, scifact_docs: list[SourceDocument]
) -> None:
    service = svc
    queries = [d.title for d in scifact_docs[:DOCS:10]]
    before = _snapshot(service, filled, queries)
    old_texts = _texts(service, filled)
    with pytest.raises(InvalidRequest, match="overlap"):
        service.reindex(filled, chunk_size=16)  # the live overlap (16) does not fit
    floor = service.settings.reindex.recall_floor
    service.settings.reindex.recall_floor = 1.01  # no index reaches it: verification fails
    try:
        with pytest.raises(ReindexFailed, match="recall@10") as failed:
            service.reindex(filled, chunk_size=NEW[0], chunk_overlap=NEW[1])
    finally:
        service.settings.reindex.recall_floor = floor
    assert "version 1 still serves" in failed.value.message
    versions = service.docstore.list_versions(filled)
    assert versions[-1].state == "failed" and service.live_version(filled).version == 1
    assert service.docstore.counts(filled, chunking=chunking_id_of(versions[-1].chunking))[1] == 0  # rows gone
    assert _texts(service, filled) == old_texts and _snapshot(service, filled, queries) == before

    def killed(phase: str, done: int) -> None:
        raise RuntimeError("killed mid-way")

    service.reindexer.on_batch = killed
    try:
        with pytest.raises(RuntimeError):
            service.reindex(filled, chunk_size=NEW[0], chunk_overlap=NEW[1])
    finally:
        service.reindexer.on_batch = None
    left = service.docstore.list_versions(filled)[-1]
    assert left.state == "building" and service.docstore.counts(filled, chunking=chunking_id_of(left.chunking))[1] > 0
    assert service.live_version(filled).version == 1 and _snapshot(service, filled, queries) == before
    report = service.reindex(filled, chunk_size=NEW[0], chunk_overlap=NEW[1])  # the re-run completes
    assert service.docstore.counts(filled, chunking=chunking_id_of(left.chunking))[1] == 0  # the killed run's rows
    assert service.live_version(filled).version == report.version and report.chunks > len(old_texts)


def test_rest_reindex_with_a_chunk_size(svc: Quarry, filled: str) -> None:
    from fastapi.testclient import TestClient

    from quarry.api import create_app

    with TestClient(create_app(svc)) as client:
        bad = client.post(f"/v1/collections/{filled}/reindex", json={"chunk_size": 64, "chunk_overlap": 64})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "InvalidRequest", bad.text
        started = client.post(f"/v1/collections/{filled}/reindex", json={"chunk_size": NEW[0], "chunk_overlap": 4})
        assert started.status_code == 202, started.text
        job_id = started.json()["id"]
        for _ in range(1200):
            job = client.get(f"/v1/jobs/{job_id}").json()
            if job["state"] in ("done", "failed"):
                break
            time.sleep(0.1)
        assert job["state"] == "done", job
        described = client.get(f"/v1/collections/{filled}").json()
        assert (described["chunk_size"], described["chunk_overlap"]) == NEW
        assert [v["chunking"]["chunk_size"] for v in described["versions"]] == [OLD[0], NEW[0]]


def test_sections_are_recovered_from_the_live_chunks() -> None:
    text = "alpha beta gamma delta\n\nepsilon zeta eta theta"
    doc = StoredDocument("d", "h", "T", text, {"lang": "en"})
    chunks = [
        StoredChunk("d:0:a", "d", 0, "alpha beta gamma", [], {"document_id": "d", "lang": "en", "page": 1}),
        StoredChunk("d:1:b", "d", 1, "gamma delta", [], {"document_id": "d", "lang": "en", "page": 1}),
        StoredChunk("d:2:c", "d", 2, "epsilon zeta eta", [], {"document_id": "d", "lang": "en", "page": 2}),
        StoredChunk("d:3:d", "d", 3, "eta theta", [], {"document_id": "d", "lang": "en", "page": 2}),
    ]
    sections = sections_of(doc, chunks)
    assert [(s.start, s.metadata) for s in sections] == [(0, {"page": 1}), (text.index("epsilon"), {"page": 2})]
    plain = [StoredChunk("d:0:a", "d", 0, "alpha beta", [], {"document_id": "d", "lang": "en"})]
    assert sections_of(doc, plain) == ()


def test_model_and_chunking_change_in_one_reindex(
    svc: Quarry, filled: str, projected_model: Path, scifact_docs: list[SourceDocument]
) -> None:
    service = svc
    query = scifact_docs[7].title
    before = _hits(service, filled, "dense", query)
    report = service.reindex(filled, model=f"torch://{projected_model}", chunk_size=NEW[0], chunk_overlap=NEW[1])
    assert report.copied == 0 and report.embedded == report.chunks > 0  # another model: every chunk embedded
    described = service.describe(filled)
    assert (described["dim"], described["chunk_size"]) == (128, NEW[0])
    hits = _hits(service, filled, "dense", query)
    assert scifact_docs[7].id in [h[0] for h in hits] and all(count_tokens(h[2]) <= NEW[0] for h in hits)
    service.rollback(filled)
    assert (service.describe(filled)["dim"], service.describe(filled)["chunk_size"]) == (384, OLD[0])
    assert _hits(service, filled, "dense", query) == before


def test_a_restarted_replica_serves_bm25_from_the_live_chunking(
    svc: Quarry, filled: str, scifact_docs: list[SourceDocument]
) -> None:
    """A snapshot of the old chunking is never followed by the new one's rows (after a swap and a write)."""
    from indexing.bm25_registry import BM25Registry

    service = svc
    folder = service.settings.data_dir / "bm25"
    BM25Registry(service.docstore, folder, service.settings.bm25).get(filled)  # a snapshot of the old cut
    service.reindex(filled, chunk_size=NEW[0], chunk_overlap=NEW[1])
    service.upsert(filled, [SourceDocument(id="late", title="Late", text=scifact_docs[DOCS].text)])
    live = set(_texts(service, filled))
    fresh = BM25Registry(service.docstore, folder, service.settings.bm25)  # as a replica that starts
    view = fresh.get(filled)
    assert {c for c, alive in zip(view.chunk_ids, view.alive.tolist(), strict=False) if alive} == live
    service.rollback(filled)
    view = BM25Registry(service.docstore, folder, service.settings.bm25).get(filled)
    assert {c for c, alive in zip(view.chunk_ids, view.alive.tolist(), strict=False) if alive} == set(
        _texts(service, filled))


def test_reindex_in_a_fresh_process_warms_its_model(tmp_path: Path, scifact_docs: list[SourceDocument]) -> None:
    """`quarry reindex` opens a service whose model is not loaded yet: it failed with "dim=0" before."""
    settings = Settings(data_dir=tmp_path)
    first = Quarry(settings)
    try:
        first.create_collection("fresh", chunk_size=OLD[0], chunk_overlap=OLD[1])
        first.upsert("fresh", scifact_docs[:5])
    finally:
        first.close()
    again = Quarry(settings)  # as the CLI's: nothing warmed
    try:
        report = again.reindex("fresh", chunk_size=NEW[0], chunk_overlap=NEW[1])
        assert report.version == 2 and report.chunks == again.docstore.counts("fresh")[1] > 0
        unchanged = again.reindex("fresh")
        assert unchanged.embedded == 0 and unchanged.copied == report.chunks  # the fingerprint is known: copied
    finally:
        again.close()


def test_rollback_in_a_fresh_process_keeps_the_collection_usable(
    tmp_path: Path, scifact_docs: list[SourceDocument]
) -> None:
    """`quarry rollback` in a fresh process wrote ``dim: 0`` into the config (its model was cold):
    every later command then failed to load the collection (found by a new-user walkthrough)."""
    settings = Settings(data_dir=tmp_path)
    first = Quarry(settings)
    try:
        first.create_collection("fresh", chunk_size=OLD[0], chunk_overlap=OLD[1])
        first.upsert("fresh", scifact_docs[:5])
        before = first.docstore.counts("fresh")
        first.reindex("fresh", chunk_size=NEW[0], chunk_overlap=NEW[1])
    finally:
        first.close()
    cold = Quarry(settings)  # as the CLI's: nothing warmed
    try:
        report = cold.rollback("fresh")
        assert report.version == 1
    finally:
        cold.close()
    after = Quarry(settings)
    try:
        cfg = after.get_collection("fresh")
        assert cfg.dim == 384 and (cfg.chunk_size, cfg.chunk_overlap) == OLD
        assert after.docstore.counts("fresh") == before
        hits = after.search("fresh", scifact_docs[0].title or "cells", top_k=3, mode="hybrid").hits
        assert hits
    finally:
        after.close()
