"""Versions behind a name and reindex (issue 22): the real Milvus Lite (SQLite docstore) and the
real pgvector (PostgreSQL docstore, the shared test server), with the packaged MiniLM.

A second, real model of another dimension (MiniLM with a seeded 384 -> 128 dense layer, built
here as the rerank tests build their tiny cross-encoder) stands for a model change.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from indexing.document_rules import SourceDocument
from indexing.reindex_build import lease_name
from quarry.errors import ReindexRunning, UnsupportedIndex
from quarry.service import Quarry
from tests.core.conftest import PG_URL, CountingEmbedder

_names = itertools.count()
RUN = uuid.uuid4().hex[:6]  # the PostgreSQL server is shared: names unique to this run
DOCS = 150




@pytest.fixture()
def filled(svc: Quarry, scifact_docs: list[SourceDocument]) -> Iterator[str]:
    """A collection holding the first ``DOCS`` SciFact documents, dropped afterwards."""
    service = svc
    name = f"rx{RUN}_{next(_names)}"
    service.create_collection(name)
    service.upsert(name, scifact_docs[:DOCS])
    yield name
    service.drop_collection(name)


def _top(service: Quarry, name: str, mode: str, query: str) -> list[str]:
    result = service.search(name, query, top_k=10, mode=mode)  # type: ignore[arg-type]
    assert not result.degraded, result.degraded
    return [h.document_id for h in result.hits]


def _chunks(service: Quarry, name: str) -> int:
    return service.docstore.counts(name)[1]


def test_collection_made_before_versions_becomes_v1(svc: Quarry, scifact_docs: list[SourceDocument]) -> None:
    service = svc
    name = f"rx{RUN}_{next(_names)}"
    service.create_collection(name)
    try:
        state = service.docstore.collection_state(name)
        assert state is not None and state.live_version == 0  # as a collection of the previous release
        assert service.docstore.list_versions(name) == []
        service.upsert(name, scifact_docs[:5])
        live = service.live_version(name)
        assert (live.version, live.physical_name, live.state) == (1, name, "live")
        assert live.model_fingerprint == service.embedder.fingerprint and live.dim == 384
        described = service.describe(name)
        assert described["live_version"] == 1 and [v["version"] for v in described["versions"]] == [1]
        assert described["vectors"] == _chunks(service, name)
    finally:
        service.drop_collection(name)


def test_unchanged_model_reindex_copies_vectors_and_rolls_back(
    svc: Quarry, filled: str, counting: CountingEmbedder, scifact_docs: list[SourceDocument]
) -> None:
    service = svc
    queries = [d.title for d in scifact_docs[:DOCS:15]]
    before = {(m, q): _top(service, filled, m, q) for m in ("bm25", "dense", "hybrid") for q in queries}
    calls = counting.calls
    seen: list[tuple[int, int]] = []
    report = service.reindex(filled, progress=lambda done, total: seen.append((done, total)))
    assert counting.calls == calls and report.embedded == 0  # 0 embedding calls
    assert report.copied == report.chunks == _chunks(service, filled)
    assert seen and seen[-1][0] == seen[-1][1]
    assert report.recall is not None and report.recall >= 0.9
    described = service.describe(filled)
    assert described["live_version"] == 2
    assert [(v["version"], v["state"]) for v in described["versions"]] == [(1, "retired"), (2, "live")]
    assert described["vectors"] == described["chunks"]
    after = {(m, q): _top(service, filled, m, q) for m in ("bm25", "dense", "hybrid") for q in queries}
    assert after == before  # FLAT on both sides: no ANN ties to allow for at this size
    service.rollback(filled)
    assert service.describe(filled)["live_version"] == 1
    assert {(m, q): _top(service, filled, m, q) for m in ("bm25", "dense", "hybrid") for q in queries} == before


def test_writes_during_reindex_reach_the_new_version(
    svc: Quarry, filled: str, scifact_docs: list[SourceDocument]
) -> None:
    service = svc
    extra = scifact_docs[DOCS : DOCS + 40]
    changed = [SourceDocument(id=d.id, title=d.title, text=f"zebracorn {i} quokkafish") for i, d in
               enumerate(scifact_docs[:20])]
    deleted = [d.id for d in scifact_docs[100:120]]
    writer_errors: list[BaseException] = []

    def writer() -> None:
        try:
            service.upsert(filled, extra)
            service.upsert(filled, changed)
            service.delete_documents(filled, deleted)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            writer_errors.append(exc)

    def during(phase: str, done: int) -> None:
        if phase == "copy" and not getattr(during, "ran", False):
            during.ran = True  # type: ignore[attr-defined]
            thread = threading.Thread(target=writer)  # another thread: the write lock is not the reindex's
            thread.start()
            thread.join()

    service.reindexer.on_batch = during
    try:
        report = service.reindex(filled)
    finally:
        service.reindexer.on_batch = None
    assert not writer_errors and report.replayed >= 80
    live = service.live_version(filled)
    assert live.version >= 2
    assert service.store.count(live.physical_name) == _chunks(service, filled)
    assert service.docstore.counts(filled)[0] == DOCS + 40 - 20
    for mode in ("bm25", "dense", "hybrid"):
        for doc_id in deleted:
            title = next(d.title for d in scifact_docs if d.id == doc_id)
            assert doc_id not in _top(service, filled, mode, title), (mode, doc_id)
        for doc in extra[:5]:
            assert doc.id in _top(service, filled, mode, doc.title), (mode, doc.id)
    hits = _top(service, filled, "bm25", "zebracorn quokkafish")
    assert set(hits) == {d.id for d in changed[:10]} or len(set(hits) & {d.id for d in changed}) == 10


def test_writes_during_the_recall_check_return_without_waiting_for_it(
    svc: Quarry, filled: str, scifact_docs: list[SourceDocument]
) -> None:
    """The build holds no write lock while it checks recall: a write made then returns and reaches the new version.

    The writer runs while the reindex waits in its ``verify`` hook; had the check held the
    collection's write lock, the writer would wait for the hook to return, and the hook gives up
    after 120 s (a bound on a deadlock, not a timing).
    """
    service = svc
    extra = scifact_docs[DOCS : DOCS + 3]
    doomed = scifact_docs[0].id
    written = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            service.upsert(filled, extra)
            service.delete_documents(filled, [doomed])
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            written.set()

    def during(phase: str, done: int) -> None:
        if phase == "verify":
            threading.Thread(target=write).start()
            assert written.wait(120), "a write waited for the reindex's recall check"

    service.reindexer.on_batch = during
    try:
        report = service.reindex(filled)
    finally:
        service.reindexer.on_batch = None
    assert not errors and written.is_set()
    live = service.live_version(filled)
    assert live.version == report.version
    owned = service.docstore.chunk_ids_of(filled, [d.id for d in extra] + [doomed])
    assert doomed not in owned and all(d.id in owned for d in extra)
    chunks = [c for cs in owned.values() for c in cs]
    assert len(service.store.get(live.physical_name, chunks)) == len(chunks)  # replayed onto the new version
    assert service.store.count(live.physical_name) == _chunks(service, filled)


def test_writes_that_never_stop_do_not_keep_the_build_replaying(
    svc: Quarry, filled: str, scifact_docs: list[SourceDocument]
) -> None:
    """A write after every replay batch (a writer faster than the replay): the build still ends, in bounded passes.

    The replay used to run until it found the change log empty, so writes arriving faster than
    it replayed kept it going for as long as they came (here: up to the cap of 100 writes).
    """
    service = svc
    doc = scifact_docs[1]
    writes: list[int] = []
    errors: list[BaseException] = []

    def write(turn: int) -> None:  # delete, write back, delete, ...: each one a change
        try:
            if turn % 2:
                service.upsert(filled, [doc])
            else:
                service.delete_documents(filled, [doc.id])
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def during(phase: str, done: int) -> None:
        if phase == "copy" and not writes or phase == "replay" and len(writes) < 100:
            thread = threading.Thread(target=write, args=(len(writes),))  # the write lock is not the reindex's
            writes.append(done)
            thread.start()
            thread.join()

    service.reindexer.on_batch = during
    try:
        report = service.reindex(filled)
    finally:
        service.reindexer.on_batch = None
    assert not errors
    assert len(writes) <= 1 + 2 * 3, writes  # one write after the copy, then one per replay batch: 2 x 3 passes
    live = service.live_version(filled)
    assert live.version == report.version
    present = doc.id in service.docstore.chunk_ids_of(filled, [doc.id])
    assert present == (len(writes) % 2 == 0)  # the last write won, on the new version too
    assert service.store.count(live.physical_name) == _chunks(service, filled)


def _all_chunk_ids(service: Quarry, name: str, document_ids: list[str]) -> dict[str, list[str]]:
    return service.docstore.chunk_ids_of(name, document_ids)


def test_writes_during_reindex_at_full_size(  # noqa: C901 - the writer, then one check per channel
    svc: Quarry, scifact_docs: list[SourceDocument], shared_data: Path
) -> None:
    """Acceptance 2: 200 inserted, 100 changed, 100 deleted in four rounds between copy batches."""
    from indexing.sources import iter_jsonl

    service = svc
    name = f"rx{RUN}_{next(_names)}"
    known = {d.id for d in scifact_docs}
    originals = scifact_docs[:250]
    fresh = [d for d in itertools.islice(iter_jsonl(shared_data / "scifact" / "corpus.jsonl"), 2000)
             if d.id not in known][:200]
    inserted = [SourceDocument(id=d.id, title=d.title, text=f"{d.text} insmark{i:03d}") for i, d in enumerate(fresh)]
    changed = [SourceDocument(id=d.id, title=d.title, text=f"zebracorn quokkafish chgmark{i:03d}")
               for i, d in enumerate(originals[:100])]
    deleted = [d.id for d in originals[100:200]]
    service.create_collection(name)
    try:
        service.upsert(name, originals)
        old_chunks = _all_chunk_ids(service, name, [d.id for d in originals[:200]])
        rounds = [(inserted[i * 50 : (i + 1) * 50], changed[i * 25 : (i + 1) * 25], deleted[i * 25 : (i + 1) * 25])
                  for i in range(4)]
        errors: list[BaseException] = []

        def write(part: tuple[list[SourceDocument], list[SourceDocument], list[str]]) -> None:
            try:
                service.upsert(name, part[0])
                service.upsert(name, part[1])
                service.delete_documents(name, part[2])
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

        def during(phase: str, done: int) -> None:
            if phase == "copy" and rounds:  # another thread: the write lock is not the reindex's
                thread = threading.Thread(target=write, args=(rounds.pop(0),))
                thread.start()
                thread.join()

        batch_size = service.settings.reindex.batch_size
        service.settings.reindex.batch_size = 64  # pages of 16 documents: the rounds fall between copy batches
        service.reindexer.on_batch = during
        try:
            report = service.reindex(name)
        finally:
            service.reindexer.on_batch = None
            service.settings.reindex.batch_size = batch_size
        assert not errors and not rounds, errors
        assert report.replayed >= 400 and report.embedded == 0
        live = service.live_version(name)
        documents, chunks = service.docstore.counts(name)
        assert live.version >= 2 and documents == 250 + 200 - 100
        assert service.store.count(live.physical_name) == chunks == report.chunks

        # dense: the live version holds exactly the docstore's chunks; none of a changed or deleted one's old ones
        current = _all_chunk_ids(service, name, [d.id for d in originals] + [d.id for d in inserted])
        ids = [c for cs in current.values() for c in cs]
        assert len(ids) == chunks and len(service.store.get(live.physical_name, ids)) == chunks
        stale = [c for doc_id, cs in old_chunks.items() for c in cs if c not in set(current.get(doc_id, []))]
        assert len(stale) >= 200 and service.store.get(live.physical_name, stale) == []
        assert not set(current) & set(deleted) and all(d.id in current for d in inserted + changed)
        # searches: every document in BM25 (no model call); a fifth in dense and hybrid, whose
        # vectors the exact check above covers whole (each query is a model call: ~1 s on 2 busy cores)
        for j, doc_id in enumerate(deleted):  # no deleted one returns
            title = next(d.title for d in originals if d.id == doc_id)
            for mode in ("bm25", "dense", "hybrid") if j % 5 == 0 else ("bm25",):
                assert doc_id not in _top(service, name, mode, title), (mode, doc_id)
        for marker, docs in (("insmark", inserted), ("chgmark", changed)):
            for i, doc in enumerate(docs):  # each in its final text
                for mode in ("bm25", "hybrid") if i % 5 == 0 else ("bm25",):
                    assert doc.id in _top(service, name, mode, f"{marker}{i:03d}"), (mode, doc.id)
        for doc in inserted[::10]:  # and found by its own title in the dense channel
            assert doc.id in _top(service, name, "dense", doc.title), doc.id
    finally:
        service.drop_collection(name)


def test_failed_verification_and_killed_run_leave_the_live_version(
    svc: Quarry, filled: str, scifact_docs: list[SourceDocument]
) -> None:
    service = svc
    query = scifact_docs[3].title
    before = _top(service, filled, "hybrid", query)
    # A weak index refused by the recall check (at the live search depth, on pgvector and the Milvus
    # server): tests/monitoring/test_recall_versions.py. At this size pgvector re-runs the short
    # answers of a weak IVF exactly, so at the live depth (200) it serves exact answers and passes.

    def killed(phase: str, done: int) -> None:
        raise RuntimeError("killed mid-way")

    service.reindexer.on_batch = killed
    try:
        with pytest.raises(RuntimeError):
            service.reindex(filled)
    finally:
        service.reindexer.on_batch = None
    assert service.docstore.list_versions(filled)[-1].state == "building"
    assert service.live_version(filled).version == 1
    assert _top(service, filled, "hybrid", query) == before
    # a crashed holder's lease: refused while it lasts, taken once it lapsed
    # (3 s, not less: on a loaded 2-core machine the refusal below must come before it lapses)
    assert service.docstore.acquire_lease(f"reindex:{filled}", "dead-process", 3.0)
    with pytest.raises(ReindexRunning):
        service.reindex(filled)
    time.sleep(3.1)
    report = service.reindex(filled)
    assert service.live_version(filled).version == report.version
    assert [v.state for v in service.docstore.list_versions(filled)][-2:] == ["failed", "live"]
    killed_version = [v for v in service.docstore.list_versions(filled) if v.state == "failed"][-1]
    assert not service.store.has_collection(killed_version.physical_name)  # the killed run's leftover: dropped
    assert _top(service, filled, "hybrid", query) == before


def test_model_change_of_dimension(
    svc: Quarry, filled: str, projected_model: Path, scifact_docs: list[SourceDocument]
) -> None:
    service = svc
    query = scifact_docs[7].title
    before = _top(service, filled, "dense", query)
    during: list[list[str]] = []

    def search_while_building(phase: str, done: int) -> None:
        during.append(_top(service, filled, "dense", query))  # the old version and model answer
        versions = service.describe(filled)["versions"]
        assert {v["dim"] for v in versions} == {384, 128}  # both models shown while it runs

    service.reindexer.on_batch = search_while_building
    try:
        report = service.reindex(filled, model=f"torch://{projected_model}")
    finally:
        service.reindexer.on_batch = None
    assert during and all(hits == before for hits in during)
    assert report.embedded == report.chunks > 0
    described = service.describe(filled)
    assert described["dim"] == 128 and described["live_version"] == report.version
    assert described["embedding_fingerprint"] != service.embedder.fingerprint
    after = _top(service, filled, "dense", query)
    assert scifact_docs[7].id in after  # the new space answers (its own title is near)
    result = service.search(filled, query, mode="hybrid")
    assert not result.degraded
    service.rollback(filled)
    assert service.describe(filled)["dim"] == 384
    assert _top(service, filled, "dense", query) == before


def _cli(args: list[str], data_dir: Path, **env: str) -> subprocess.Popen[str]:
    full = {**os.environ, "QUARRY_DATA_DIR": str(data_dir), "QUARRY_STORE__URL": PG_URL,
            "QUARRY_DOCSTORE__URL": PG_URL, "QUARRY_EMBEDDING__DEVICE": "cpu", **env}
    return subprocess.Popen([sys.executable, "-m", "quarry.cli", *args], env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.integration
def test_processes_sharing_pgvector_reindex_once_and_a_killed_one_leaves_the_live_version(
    svc: Quarry, filled: str, projected_model: Path, scifact_docs: list[SourceDocument], tmp_path: Path
) -> None:
    service = svc
    if service.store.capabilities().engine != "pgvector":
        pytest.skip("two processes share pgvector and the PostgreSQL docstore (a Milvus Lite file is one process's)")
    query = scifact_docs[3].title
    before = _top(service, filled, "hybrid", query)
    model = f"torch://{projected_model}"  # re-embedding: long enough for the runs to overlap
    runs = [_cli(["reindex", filled, "--model", model], tmp_path / f"p{i}") for i in range(2)]
    outcomes = [(p.wait(timeout=600), p.communicate()[1]) for p in runs]
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 2], outcomes
    assert any("ReindexRunning" in stderr for _, stderr in outcomes)
    assert [v.state for v in service.docstore.list_versions(filled)] == ["retired", "live"]
    service.rollback(filled)
    assert _top(service, filled, "hybrid", query) == before

    # SIGKILL mid-build: the live version serves unchanged; the lease lapses; a re-run completes
    killed = _cli(["reindex", filled, "--model", model], tmp_path / "k", QUARRY_REINDEX__LEASE_TTL_S="30",
                  QUARRY_REINDEX__BATCH_SIZE="16")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        building = [v for v in service.docstore.list_versions(filled) if v.state == "building"]
        if building and service.store.has_collection(building[0].physical_name) and \
                service.store.count(building[0].physical_name) > 0:
            break
        time.sleep(0.2)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=60)
    # the dead holder's lease holds until it lapses: checked first, at once. The lease is renewed per
    # batch, so its time left at the kill is the TTL less one batch: a CI run on a loaded machine saw
    # 20 s between a renewal and this check, past an 8 s TTL; 30 s keeps the refusal expected.
    lease = service.docstore.get_lease(lease_name(filled))
    assert lease is not None and lease.expires_at > time.time()
    with pytest.raises(ReindexRunning):
        service.reindex(filled)
    assert [v.state for v in service.docstore.list_versions(filled)][-1] == "building"
    assert service.live_version(filled).version == 1
    assert _top(service, filled, "hybrid", query) == before
    time.sleep(max(0.0, lease.expires_at - time.time()) + 0.5)
    report = service.reindex(filled)
    assert service.live_version(filled).version == report.version
    assert _top(service, filled, "hybrid", query) == before


def test_an_unknown_index_kind_is_refused_before_a_job_starts(svc: Quarry, filled: str) -> None:
    jobs = len(svc.docstore.list_jobs(collection=filled, limit=50))
    with pytest.raises(UnsupportedIndex, match="unknown index kind 'annoy'"):
        svc.start_reindex(filled, index="annoy")
    assert len(svc.docstore.list_jobs(collection=filled, limit=50)) == jobs
    assert svc.docstore.get_lease(lease_name(filled)) is None


def test_rest_reindex_job_and_rollback(svc: Quarry, filled: str) -> None:
    from fastapi.testclient import TestClient

    from quarry.api import create_app

    with TestClient(create_app(svc)) as client:
        started = client.post(f"/v1/collections/{filled}/reindex", json={})
        assert started.status_code == 202, started.text
        job_id = started.json()["id"]
        for _ in range(600):
            job = client.get(f"/v1/jobs/{job_id}").json()
            if job["state"] in ("done", "failed"):
                break
            time.sleep(0.1)
        assert job["state"] == "done", job
        assert job["counters"]["embedded"] == 0 and job["counters"]["done"] == job["counters"]["total"] > 0
        described = client.get(f"/v1/collections/{filled}").json()
        assert described["live_version"] == job["counters"]["version"]
        assert {v["state"] for v in described["versions"]} == {"live", "retired"}
        rolled = client.post(f"/v1/collections/{filled}/rollback")
        assert rolled.status_code == 200 and rolled.json()["version"] == 1
        missing = client.get("/v1/jobs/nope")
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFound"
        assert client.post("/v1/collections/absent/reindex", json={}).status_code == 404
        fresh = f"fresh_{uuid.uuid4().hex[:6]}"
        assert client.post("/v1/collections", json={"name": fresh}).status_code == 201
        try:  # nothing kept to roll back to: the collection exists, it is in no state for it (409, not 404)
            nothing = client.post(f"/v1/collections/{fresh}/rollback")
            assert nothing.status_code == 409 and nothing.json()["error"]["type"] == "Conflict", nothing.text
        finally:
            client.delete(f"/v1/collections/{fresh}")


@pytest.mark.integration
def test_reindex_to_an_index_kind_takes_the_planners_parameters_on_the_milvus_server(
    tmp_path: Path, counting: CountingEmbedder, scifact_docs: list[SourceDocument]
) -> None:
    """``quarry reindex --index ivf_flat|hnsw``: the kind gets the planner's parameters for it (not ``{}``)."""
    from quarry.settings import Settings, StoreSettings

    url = os.environ.get("QUARRY_TEST_MILVUS_URL", "milvus://127.0.0.1:19530")
    service = Quarry(Settings(data_dir=tmp_path, store=StoreSettings(url=url)), embedder=counting)
    name = f"rxk{RUN}_{next(_names)}"
    service.create_collection(name)
    try:
        service.upsert(name, scifact_docs[:40])
        query = scifact_docs[5].title
        before = _top(service, name, "dense", query)
        for kind, params in (("ivf_flat", {"nlist"}), ("hnsw", {"M", "efConstruction"})):
            report = service.reindex(name, index=kind)
            live = service.live_version(name)
            assert live.version == report.version and report.recall is not None and report.recall >= 0.9
            plan = live.index_plan
            assert plan["kind"] == kind.upper() and set(plan["params"]) == params, plan
            built = service.store.describe_index(live.physical_name)
            assert built is not None and built.kind == kind.upper(), built
            assert _top(service, name, "dense", query) == before, kind
    finally:
        service.drop_collection(name)
        service.close()

