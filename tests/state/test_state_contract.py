"""The state-of-record contract (docs/design-state.md), run on SQLite and on PostgreSQL.

Every backend of :class:`indexing.docstore.StateStore` passes the same tests: the document write
path with its seq and change log, physical versions, leases, jobs, tenants, API keys and the
audit log; two processes writing one collection never share or skip a seq; a writer killed
inside its transaction leaves nothing.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from indexing.docstore import (
    ApiKeyRecord,
    AuditEntry,
    CollectionVersion,
    StateStore,
    StoredChunk,
    StoredDocument,
    open_docstore,
)
from quarry.errors import CollectionNotFound, Conflict, NotFound, StoreUnavailable


def _chunk(doc: str, pos: int, text: str = "some words", **payload: Any) -> StoredChunk:
    return StoredChunk(f"{doc}:{pos}:h", doc, pos, text, text.split(), {"document_id": doc, **payload})


def _doc(doc: str, digest: str = "h1", text: str = "some words") -> StoredDocument:
    return StoredDocument(doc, digest, f"title {doc}", text, {"k": 1, "big": 2**70})


# --- collections and the write path ------------------------------------------------------
def test_a_collection_is_created_configured_and_dropped_with_all_its_rows(state: StateStore) -> None:
    state.put_collection("c", {"dim": 3})
    state.put_collection("c", {"dim": 4})
    cs = state.collection_state("c")
    assert cs is not None
    assert (cs.name, cs.tenant_id, cs.seq, cs.live_version, cs.shared) == ("c", "default", 0, 0, False)
    assert state.collection_config("c") == {"dim": 4} and state.list_collections() == ["c"]
    state.write_batch("c", [_doc("a")], [_chunk("a", 0)], [], pending=["old"])
    state.create_version("c", CollectionVersion(1, "c__v1", "building"))
    state.drop_collection("c")
    assert state.collection_config("c") is None and state.collection_state("c") is None
    state.put_collection("c", {"dim": 4})  # a new collection under the old name inherits nothing
    again = state.collection_state("c")
    assert again is not None and again.id != cs.id and again.seq == 0
    assert state.counts("c") == (0, 0) and state.pending_deletes("c") == [] and state.list_versions("c") == []
    assert state.change_log_since("c", 0) == []


def test_every_write_takes_the_next_seq_and_logs_each_document(state: StateStore) -> None:
    state.put_collection("c", {})
    assert state.write_batch("c", [_doc("a"), ("b", "hb")], [_chunk("a", 0), _chunk("b", 0)], []) == 1
    assert state.write_batch("c", [_doc("a", "h2")], [], [], deleted_document_ids=["b"]) == 2
    assert state.write_batch("c", [], [], [], config={"schema": 1}) == 3  # a config-only write moves too
    assert state.version("c") == 3 and state.collection_config("c") == {"schema": 1}
    log = [(c.seq, c.op, c.document_id, c.content_hash) for c in state.change_log_since("c", 0)]
    assert log == [
        (1, "upsert", "a", "h1"), (1, "upsert", "b", "hb"), (2, "upsert", "a", "h2"), (2, "delete", "b", None)
    ]
    assert [c.seq for c in state.change_log_since("c", 1)] == [2, 2]
    docs = state.get_documents("c", ["a", "b"])
    assert list(docs) == ["a"]
    assert docs["a"] == StoredDocument("a", "h2", "title a", "some words", {"k": 1, "big": str(2**70)}, 2)
    assert state.document_hashes("c", ["a", "b", "x"]) == {"a": "h2"}
    assert state.counts("c") == (1, 1)


def test_a_write_to_a_missing_collection_writes_nothing(state: StateStore) -> None:
    with pytest.raises(CollectionNotFound):
        state.write_batch("nope", [_doc("a")], [_chunk("a", 0)], [])
    state.put_collection("nope", {})
    assert state.counts("nope") == (0, 0) and state.version("nope") == 0


def test_the_change_log_pages_by_whole_seqs(state: StateStore) -> None:
    state.put_collection("c", {})
    state.write_batch("c", [_doc(f"d{i}") for i in range(5)], [], [])
    state.write_batch("c", [_doc("e")], [], [])
    head = state.change_log_since("c", 0, limit=2)
    assert [c.document_id for c in head] == ["d0", "d1", "d2", "d3", "d4"]  # seq 1 whole
    assert [c.document_id for c in state.change_log_since("c", head[-1].seq, limit=2)] == ["e"]
    assert state.change_log_since("c", 2) == []


def test_documents_page_in_id_order_with_their_full_text(state: StateStore) -> None:
    state.put_collection("c", {})
    state.write_batch("c", [_doc(d) for d in "dbca"], [], [])
    first = state.list_documents("c", limit=3)
    assert [d.document_id for d in first] == ["a", "b", "c"] and first[0].text == "some words"
    assert [d.document_id for d in state.list_documents("c", after="c")] == ["d"]


def test_chunks_keep_insertion_order_and_a_replaced_chunk_moves_last(state: StateStore) -> None:
    state.put_collection("c", {})
    state.write_batch("c", [_doc("a"), _doc("b")], [_chunk("a", 0), _chunk("b", 0), _chunk("a", 1, "")], [])
    seq, rows = state.bm25_rows("c")
    assert seq == 1 and [r[0] for r in rows] == ["a:0:h", "b:0:h", "a:1:h"]
    assert state.bm25_chunk_ids("c") == (1, ["a:0:h", "b:0:h"])  # the chunk without tokens is not BM25's
    state.write_batch("c", [_doc("a", "h2")], [_chunk("a", 0, k=2)], ["a:1:h"])
    assert state.bm25_chunk_ids("c") == (2, ["b:0:h", "a:0:h"])
    assert state.chunk_ids_of("c", ["a", "b", "x"]) == {"a": ["a:0:h"], "b": ["b:0:h"]}
    got = state.get_chunks("c", ["a:0:h", "zz"], with_tokens=True)
    assert list(got) == ["a:0:h"] and got["a:0:h"].payload == {"document_id": "a", "k": 2}
    assert got["a:0:h"].tokens == ["some", "words"] and state.get_chunks("c", ["a:0:h"])["a:0:h"].tokens == []


def test_pending_deletes_are_recorded_with_the_write_and_cleared(state: StateStore) -> None:
    state.put_collection("c", {})
    state.write_batch("c", [], [], [], pending=["x", "y"])
    assert sorted(state.pending_deletes("c")) == ["x", "y"]
    state.write_batch("c", [_doc("a")], [StoredChunk("x", "a", 0, "t", ["t"], {})], [])  # x is back
    assert state.pending_deletes("c") == ["y"]
    state.clear_pending("c", ["y"])
    assert state.pending_deletes("c") == []


def test_a_reopened_state_keeps_everything_and_its_schema_steps(opened: Callable[[], StateStore]) -> None:
    first = opened()
    first.put_collection("c", {"a": 1})
    first.write_batch("c", [_doc("a")], [_chunk("a", 0)], [])
    first.close()
    again = opened()
    assert again.version("c") == 1 and again.get_documents("c", ["a"])["a"].text == "some words"


# --- versions -------------------------------------------------------------------------------
def test_versions_are_created_listed_and_swapped_live(state: StateStore) -> None:
    state.put_collection("c", {})
    v1 = CollectionVersion(1, "c__v1", "building", "fp1", "minilm", 384, {"size": 200}, "en", {"kind": "hnsw"}, 7)
    state.create_version("c", v1)
    with pytest.raises(Conflict):
        state.create_version("c", v1)
    got = state.get_version("c", 1)
    assert got is not None and got.physical_name == "c__v1" and got.chunking == {"size": 200} and got.created_at > 0
    assert got.built_from_seq == 7 and got.index_plan == {"kind": "hnsw"}
    state.set_version_state("c", 1, "verifying")
    state.set_live_version("c", 1)
    live = state.get_version("c", 1)
    assert live is not None and live.state == "live" and live.swapped_at is not None
    cs = state.collection_state("c")
    assert cs is not None and cs.live_version == 1
    state.create_version("c", CollectionVersion(2, "c__v2", "building"))
    state.set_live_version("c", 2, retire_after=123.0)
    assert [(v.version, v.state, v.retire_after) for v in state.list_versions("c")] == [
        (1, "retired", 123.0), (2, "live", None)
    ]
    with pytest.raises(NotFound):
        state.set_live_version("c", 9)
    with pytest.raises(NotFound):
        state.set_version_state("c", 9, "failed")
    with pytest.raises(CollectionNotFound):
        state.create_version("nope", v1)


def test_chunks_belong_to_a_chunking_and_reads_follow_the_live_versions(state: StateStore) -> None:
    """A re-chunking reindex writes another chunking beside the live one; the live version picks it."""
    state.put_collection("c", {})
    state.write_batch("c", [_doc("a"), _doc("b")], [_chunk("a", 0), _chunk("b", 0)], [])
    state.create_version("c", CollectionVersion(1, "c", "live", chunking={"chunk_size": 8, "chunk_overlap": 1}))
    state.set_live_version("c", 1)
    new = {"chunk_size": 4, "chunk_overlap": 0, "id": "v2s4o0"}
    state.create_version("c", CollectionVersion(2, "c__v2", "building", chunking=new))
    state.replace_chunks("c", "v2s4o0", ["a", "b"], [_chunk("a", 0, "x y"), _chunk("a", 1, "z"), _chunk("b", 0)])
    seq = state.version("c")
    assert state.version("c") == seq and state.change_log_since("c", seq) == []  # no seq, no change-log row
    cs = state.collection_state("c")
    assert cs is not None and cs.chunking_id == ""
    assert state.counts("c") == (2, 2) and state.counts("c", chunking="v2s4o0") == (2, 3)
    assert state.chunk_ids_of("c", ["a"], chunking="v2s4o0") == {"a": ["a:0:h", "a:1:h"]}
    assert state.get_chunks("c", ["a:0:h"], chunking="v2s4o0")["a:0:h"].text == "x y"
    assert state.get_chunks("c", ["a:0:h"])["a:0:h"].text == "some words"
    assert [r[0] for r in state.bm25_rows("c", chunking="v2s4o0")[1]] == ["a:0:h", "a:1:h", "b:0:h"]
    state.replace_chunks("c", "v2s4o0", ["b"], [])  # a deleted document leaves the chunking
    state.set_live_version("c", 2)
    cs = state.collection_state("c")
    assert cs is not None and cs.chunking_id == "v2s4o0"
    assert state.counts("c") == (2, 2) and state.bm25_chunk_ids("c")[1] == ["a:0:h", "a:1:h"]
    state.write_batch("c", [_doc("d")], [_chunk("d", 0)], [])  # writes go to the live chunking
    assert state.chunk_ids_of("c", ["d"]) == {"d": ["d:0:h"]} and state.chunk_ids_of("c", ["d"], chunking="") == {}
    state.write_batch("c", [], [], [], deleted_document_ids=["a"])
    assert state.chunk_ids_of("c", ["a"]) == {} and state.chunk_ids_of("c", ["a"], chunking="") == {"a": ["a:0:h"]}
    assert state.drop_chunking("c", "") == 2 and state.counts("c", chunking="") == (2, 0)
    assert state.counts("c") == (2, 1)


# --- leases ---------------------------------------------------------------------------------
def test_a_lease_has_one_holder_until_it_lapses(state: StateStore) -> None:
    # 2 s leases: long enough that a loaded 2-core machine checks the refusals before they lapse
    assert state.acquire_lease("reindex:c", "a", ttl_s=2.0)
    assert not state.acquire_lease("reindex:c", "b", ttl_s=30)
    assert state.acquire_lease("reindex:c", "a", ttl_s=2.0)  # the holder renews by acquiring again
    assert state.renew_lease("reindex:c", "a", ttl_s=2.0) and not state.renew_lease("reindex:c", "b", ttl_s=5)
    time.sleep(2.2)  # the holder crashed: nobody renews
    assert state.acquire_lease("reindex:c", "b", ttl_s=30)
    lease = state.get_lease("reindex:c")
    assert lease is not None and lease.owner == "b" and lease.expires_at > time.time() + 20
    assert not state.renew_lease("reindex:c", "a", ttl_s=5) and not state.release_lease("reindex:c", "a")
    assert state.release_lease("reindex:c", "b") and state.get_lease("reindex:c") is None
    assert state.acquire_lease("reindex:c", "a", ttl_s=5)


# --- jobs -----------------------------------------------------------------------------------
def test_jobs_are_created_updated_listed_and_claimed(state: StateStore) -> None:
    state.put_collection("c", {})
    job = state.create_job("ingest", collection="c", params={"source": "x.jsonl"})
    assert (job.kind, job.collection, job.state, job.params, job.counters, job.cursor) == (
        "ingest", "c", "queued", {"source": "x.jsonl"}, {}, None
    )
    other = state.create_job("reindex", job_id="j2", state="running")
    with pytest.raises(Conflict):
        state.create_job("reindex", job_id="j2")
    with pytest.raises(CollectionNotFound):
        state.create_job("ingest", collection="nope")
    done = state.update_job(job.id, state="running", cursor="line:120", counters={"added": 120})
    assert (done.state, done.cursor, done.counters) == ("running", "line:120", {"added": 120})
    assert state.update_job(job.id, error="boom").cursor == "line:120"  # None keeps a field
    with pytest.raises(NotFound):
        state.update_job("nope", state="failed")
    assert {j.id for j in state.list_jobs()} == {job.id, other.id}
    assert [j.id for j in state.list_jobs(collection="c")] == [job.id]
    assert {j.id for j in state.list_jobs(state="running")} == {job.id, "j2"}
    assert state.claim_job(job.id, "w1", ttl_s=2.0) and not state.claim_job(job.id, "w2", ttl_s=5)
    claimed = state.get_job(job.id)
    assert claimed is not None and claimed.lease_owner == "w1"
    time.sleep(2.2)
    assert state.claim_job(job.id, "w2", ttl_s=5)  # w1 died: its lease lapsed
    assert not state.release_job(job.id, "w1") and state.release_job(job.id, "w2")
    assert state.get_job("nope") is None


# --- tenants, API keys, audit -------------------------------------------------------------------
def test_tenants_api_keys_and_audit_are_plain_records(state: StateStore) -> None:
    assert state.list_tenants() == [("default", "default")]
    state.create_tenant("acme", "Acme")
    with pytest.raises(Conflict):
        state.create_tenant("acme", "Acme")
    key = ApiKeyRecord("k1", "acme", "qk_ab12", "scrypt$...", "ci", ["read"], ["docs"], 5.0, 1, expires_at=2e9)
    state.insert_api_key(key)
    state.insert_api_key(ApiKeyRecord("k2", "default", "qk_cd34", "scrypt$2"))
    with pytest.raises(Conflict):
        state.insert_api_key(key)
    got = state.get_api_key("k1")
    assert got is not None and got.scopes == ["read"] and got.collections == ["docs"] and got.created_at > 0
    assert (got.rate, got.priority, got.expires_at, got.revoked_at) == (5.0, 1, 2e9, None)
    assert [k.id for k in state.find_api_keys("qk_ab12")] == ["k1"] and state.find_api_keys("qk_zz") == []
    assert [k.id for k in state.list_api_keys()] == ["k1", "k2"]
    assert [k.id for k in state.list_api_keys("default")] == ["k2"]
    assert state.revoke_api_key("k1") and not state.revoke_api_key("k1") and not state.revoke_api_key("zz")
    revoked = state.get_api_key("k1")
    assert revoked is not None and revoked.revoked_at is not None
    first = state.append_audit(AuditEntry("key.create", "k1", "acme", "k2", {"scopes": ["read"]}))
    second = state.append_audit(AuditEntry("collection.drop", None, "default", "c", at=time.time() + 1))
    assert second > first
    assert [(a.id, a.action, a.detail) for a in state.list_audit()] == [
        (first, "key.create", {"scopes": ["read"]}), (second, "collection.drop", {})
    ]
    assert [a.action for a in state.list_audit(tenant_id="default")] == ["collection.drop"]
    assert state.list_audit(since=time.time() + 100) == []


# --- more than one process ------------------------------------------------------------------------
_WRITES = 25


def _write_many(url: str, folder: str, who: str) -> list[int]:
    """A second process's writer: ``_WRITES`` one-document batches to collection ``c``."""
    store = open_docstore(url, Path(folder))
    try:
        return [store.write_batch("c", [_doc(f"{who}{i}")], [_chunk(f"{who}{i}", 0)], []) for i in range(_WRITES)]
    finally:
        store.close()


def test_two_processes_writing_one_collection_never_share_or_skip_a_seq(
    state: StateStore, state_url: str, tmp_path: Path
) -> None:
    state.put_collection("c", {})
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(2) as pool:
        runs = pool.starmap(_write_many, [(state_url, str(tmp_path), "p"), (state_url, str(tmp_path), "q")])
    seqs = sorted(runs[0] + runs[1])
    assert seqs == list(range(1, 2 * _WRITES + 1))  # none twice, none lost
    assert state.version("c") == 2 * _WRITES and state.counts("c") == (2 * _WRITES, 2 * _WRITES)
    log = state.change_log_since("c", 0, limit=1000)
    assert sorted(c.seq for c in log) == seqs
    written = [f"p{i}" for i in range(_WRITES)] + [f"q{i}" for i in range(_WRITES)]
    by_seq = dict(zip(runs[0] + runs[1], written, strict=True))
    assert all(by_seq[c.seq] == c.document_id for c in log)  # each seq logs its own batch


def _hang_inside_a_write(url: str, folder: str, marker: str) -> None:
    """Start a write and stop inside its transaction (after its rows, before the commit) for good."""
    from sqlalchemy import event

    store = open_docstore(url, Path(folder), timeout_s=600)

    def stall(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("INSERT INTO change_log"):
            Path(marker).touch()
            time.sleep(600)

    event.listen(store._engine, "after_cursor_execute", stall)  # type: ignore[attr-defined]
    store.write_batch("c", [_doc("half")], [_chunk("half", 0)], [], pending=["p"])


def test_a_write_killed_inside_its_transaction_leaves_nothing(
    state: StateStore, state_url: str, tmp_path: Path
) -> None:
    state.put_collection("c", {})
    state.write_batch("c", [_doc("a")], [_chunk("a", 0)], [])
    marker = tmp_path / "inside"
    child = multiprocessing.get_context("spawn").Process(
        target=_hang_inside_a_write, args=(state_url, str(tmp_path), str(marker))
    )
    child.start()
    try:
        for _ in range(600):
            if marker.exists() or not child.is_alive():
                break
            time.sleep(0.05)
        assert marker.exists(), "the child never got inside its transaction"
        os.kill(child.pid or 0, signal.SIGKILL)
    finally:
        child.join(10)
    assert child.exitcode == -signal.SIGKILL
    assert state.version("c") == 1 and state.counts("c") == (1, 1)
    assert state.document_hashes("c", ["half"]) == {} and state.pending_deletes("c") == []
    assert [c.document_id for c in state.change_log_since("c", 0)] == ["a"]
    started = time.monotonic()
    assert state.write_batch("c", [_doc("b")], [_chunk("b", 0)], []) == 2  # its lock is gone, no seq lost
    assert time.monotonic() - started < 5


# --- the cross-process write lock ------------------------------------------------------------------
def _try_lock(url: str, folder: str, timeout_s: float) -> str:
    """Another process: take collection ``C``'s write lock (names fold case) within ``timeout_s``."""
    store = open_docstore(url, Path(folder))
    try:
        with store.write_lock("C", timeout_s=timeout_s):
            return "taken"
    except StoreUnavailable as exc:
        return f"refused: {exc}"
    finally:
        store.close()


def _hold_lock_for_good(url: str, folder: str, marker: str) -> None:
    store = open_docstore(url, Path(folder))
    with store.write_lock("c"):
        Path(marker).touch()
        time.sleep(600)


def test_the_write_lock_holds_other_processes_off_and_lapses_with_its_holder(
    state: StateStore, state_url: str, tmp_path: Path
) -> None:
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(1) as pool:
        with state.write_lock("c"), state.write_lock("c", timeout_s=0.1):  # re-entrant in its thread
            refused = pool.apply(_try_lock, (state_url, str(tmp_path), 0.3))
            assert refused.startswith("refused: collection write lock 'default.c'"), refused
            assert pool.apply(_try_lock_other, (state_url, str(tmp_path))) == "taken"  # other collections: free
        assert pool.apply(_try_lock, (state_url, str(tmp_path), 5.0)) == "taken"
    marker = tmp_path / "holding"
    child = spawn.Process(target=_hold_lock_for_good, args=(state_url, str(tmp_path), str(marker)))
    child.start()
    try:
        for _ in range(600):
            if marker.exists() or not child.is_alive():
                break
            time.sleep(0.05)
        assert marker.exists(), "the child never took the lock"
        with pytest.raises(StoreUnavailable):
            with state.write_lock("c", timeout_s=0.2):
                pass
        os.kill(child.pid or 0, signal.SIGKILL)
    finally:
        child.join(10)
    with state.write_lock("c", timeout_s=10):  # released by the holder's death
        pass


def _try_lock_other(url: str, folder: str) -> str:
    store = open_docstore(url, Path(folder))
    try:
        with store.write_lock("other", timeout_s=0.3):
            return "taken"
    finally:
        store.close()


def test_a_tenant_view_sees_only_its_own_collections(state: StateStore) -> None:
    state.create_tenant("acme", "Acme")
    acme = state.for_tenant("acme")
    state.put_collection("c", {"who": "default"})
    acme.put_collection("c", {"who": "acme"})
    acme.write_batch("c", [_doc("a")], [_chunk("a", 0)], [])
    assert state.collection_config("c") == {"who": "default"} and acme.collection_config("c") == {"who": "acme"}
    assert (state.version("c"), acme.version("c")) == (0, 1)
    assert state.counts("c") == (0, 0) and acme.counts("c") == (1, 1)
    assert [j.tenant_id for j in [acme.create_job("ingest", collection="c")]] == ["acme"]
    assert state.list_jobs() == [] and len(acme.list_jobs()) == 1
    acme.drop_collection("c")
    assert acme.list_collections() == [] and state.list_collections() == ["c"]


# --- query-drift references --------------------------------------------------------------
def test_a_query_reference_is_kept_once_per_version_and_signal_and_goes_with_its_version(state: StateStore) -> None:
    state.put_collection("c", {"dim": 2})
    state.create_version("c", CollectionVersion(1, "c__v1", "live"))
    assert state.get_query_references("c", "c__v1") == {}
    first = {"sum": [0.5, 1.5], "n": 2}
    assert state.put_query_reference("c", "c__v1", "centroid", first) == first
    # a second process completing its own reference later adopts the first one's
    assert state.put_query_reference("c", "c__v1", "centroid", {"sum": [9.0, 9.0], "n": 2}) == first
    state.put_query_reference("c", "c__v1", "oov", {"sum": [0.25], "n": 2})
    assert state.get_query_references("c", "c__v1") == {"centroid": first, "oov": {"sum": [0.25], "n": 2}}
    # a version no longer listed loses its rows at the next insert
    state.put_query_reference("c", "c__gone", "centroid", first)
    state.create_version("c", CollectionVersion(2, "c__v2", "building"))
    state.put_query_reference("c", "c__v2", "centroid", first)
    assert state.get_query_references("c", "c__gone") == {} and state.get_query_references("c", "c__v1") != {}
    with pytest.raises(CollectionNotFound):
        state.put_query_reference("nope", "x", "centroid", first)
    state.drop_collection("c")
    state.put_collection("c", {"dim": 2})
    assert state.get_query_references("c", "c__v1") == {}
