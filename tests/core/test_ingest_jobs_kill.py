"""Issue 23, acceptance 2: a REST ingest job over SciFact survives a SIGKILL of ``quarry serve``.

Two real servers (``python -m quarry.cli serve``: Milvus Lite, SQLite docstore, the packaged
MiniLM in torch), each on a data dir of its own, ingest the same SciFact subset through
``POST /v1/collections/{name}/jobs``. The first runs uninterrupted. The second is killed with
SIGKILL (its whole process group: the Milvus Lite server too, as a machine that dies) once its
progress has moved past a few batches, then started again: it finds the job's lease lapsed,
resumes from the checkpoint and ends with the same documents (ids and content hashes), chunks and
vectors as the first, and the texts it sent to the model after the restart are exactly the
chunks that were not committed at the kill: 0 embedding calls for what was already written.
"""

from __future__ import annotations

import json
import os
import time
from itertools import islice
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from indexing.docstore import open_docstore
from stores.factory import open_store
from tests.embedding_cache import MODEL_CACHE_ENV
from tests.serve import QuarryServer

REPO = Path(__file__).resolve().parents[2]
DOCS = 120  # SciFact documents (about 175 chunks): 12 batches of 10, some seconds of embedding each
BATCH = 10
NAME = "scifact_job"


class Server:
    """A ``quarry serve`` child in a session of its own (so a SIGKILL takes its Milvus Lite too)."""

    def __init__(self, data_dir: Path, root: Path, log: Path) -> None:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("QUARRY_") or k == MODEL_CACHE_ENV},
            "QUARRY_DATA_DIR": str(data_dir), "QUARRY_INGEST__ROOTS": json.dumps([str(root)]),
            "QUARRY_INGEST__BATCH_SIZE": str(BATCH), "QUARRY_INGEST__JOB_LEASE_S": "3",
            "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false",
            # the torch encoder, not the (several times faster) ONNX int8 default: its batches take
            # long enough for the kill to land mid-job on any machine
            "QUARRY_EMBEDDING__URL": "torch://all-MiniLM-L6-v2",
        }
        self.server = QuarryServer(env, log=log, cwd=REPO).wait_ready()
        self.client = httpx.Client(base_url=self.server.url, timeout=60)

    def job(self, job_id: str) -> dict[str, Any]:
        resp = self.client.get(f"/v1/jobs/{job_id}")
        assert resp.status_code == 200, resp.text
        body: dict[str, Any] = resp.json()
        return body

    def wait(self, job_id: str) -> dict[str, Any]:
        deadline = time.monotonic() + 600
        while (body := self.job(job_id))["state"] not in ("done", "partial", "failed", "cancelled"):
            assert time.monotonic() < deadline, body
            time.sleep(0.3)
        return body

    def stop(self) -> None:
        self.client.close()
        self.server.stop(timeout_s=120)

    def kill(self) -> None:
        self.client.close()
        self.server.kill()


def _state(data_dir: Path) -> dict[str, Any]:
    """Documents (id -> hash), chunk ids and vectors of the collection, read from the files of a stopped server."""
    docstore = open_docstore("", data_dir)
    store = open_store(f"milvus://{data_dir.resolve()}/quarry.db")
    try:
        docs = {d.document_id: d.content_hash for d in docstore.list_documents(NAME, limit=100_000)}
        owned = docstore.chunk_ids_of(NAME, list(docs))
        chunks = sorted(c for ids in owned.values() for c in ids)
        vectors = {r.id: np.asarray(r.vector) for r in store.get(NAME, chunks)}
        return {"docs": docs, "chunks": chunks, "vectors": vectors, "count": store.count(NAME)}
    finally:
        store.close()
        docstore.close()


def _submit(server: Server) -> str:
    assert server.client.post("/v1/collections", json={"name": NAME}).status_code == 201
    resp = server.client.post(f"/v1/collections/{NAME}/jobs", json={"path": "scifact.jsonl"})
    assert resp.status_code == 202, resp.text
    return str(resp.json()["id"])


def test_a_killed_server_resumes_its_job_with_nothing_lost_or_embedded_twice(
    tmp_path: Path, shared_data: Path
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with (shared_data / "scifact" / "corpus.jsonl").open(encoding="utf-8") as src:
        (root / "scifact.jsonl").write_text("".join(islice(src, DOCS)), encoding="utf-8")
    log = tmp_path / "servers.log"

    # uninterrupted
    whole_dir = tmp_path / "whole"
    server = Server(whole_dir, root, log)
    try:
        whole = server.wait(_submit(server))
    finally:
        server.stop()
    assert whole["state"] == "done", whole
    assert whole["counters"]["read"] == DOCS

    # killed mid-job, then restarted
    killed_dir = tmp_path / "killed"
    server = Server(killed_dir, root, log)
    seen_done = set()
    try:
        job_id = _submit(server)
        while (body := server.job(job_id))["counters"].get("read", 0) < DOCS // 3:
            assert body["state"] in ("queued", "running"), body
            seen_done.add(body["counters"].get("done", 0))
            time.sleep(0.2)
        seen_done.add(body["counters"]["done"])
    finally:
        server.kill()
    assert len(seen_done - {0}) >= 2, seen_done  # progress moved while it ran
    docstore = open_docstore("", killed_dir)
    try:
        at_kill = docstore.get_job(job_id)
        committed_chunks = docstore.counts(NAME)[1]
    finally:
        docstore.close()
    assert at_kill is not None and at_kill.state == "running" and at_kill.counters["read"] < DOCS, at_kill

    server = Server(killed_dir, root, log)  # finds the lease lapsed (3 s) and resumes
    try:
        resumed = server.wait(job_id)
    finally:
        server.stop()
    assert resumed["state"] == "done" and resumed["counters"]["resumed"] == 1, resumed

    a, b = _state(whole_dir), _state(killed_dir)
    assert a["docs"] == b["docs"] and len(a["docs"]) == DOCS
    assert a["chunks"] == b["chunks"] and a["count"] == b["count"] == len(a["chunks"])
    assert set(a["vectors"]) == set(b["vectors"]) == set(a["chunks"])
    worst = max(float(np.abs(a["vectors"][c] - b["vectors"][c]).max()) for c in a["chunks"])
    assert worst < 1e-5, worst
    # the model calls: every chunk once in the uninterrupted run; after the restart, only the
    # chunks not committed at the kill (a batch committed after its checkpoint is unchanged by hash)
    assert whole["counters"]["embedded"] == len(a["chunks"])
    after_restart = resumed["counters"]["embedded"] - at_kill.counters.get("embedded", 0)
    assert after_restart == len(b["chunks"]) - committed_chunks, (after_restart, committed_chunks)
    assert committed_chunks > 0
    print(f"kill at {at_kill.counters['read']}/{DOCS} documents ({committed_chunks} chunks committed); "
          f"{after_restart} texts embedded after the restart, {len(b['chunks'])} chunks in all, max |dv| {worst:.1e}")
