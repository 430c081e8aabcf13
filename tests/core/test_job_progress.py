"""Jobs you can watch: progress inside a batch, cancel between embedding sub-batches, the listing, the audit log.

In this process, on Milvus Lite and the packaged MiniLM (the session's memo of its vectors). The
cadence and the cancel latency are counted in embedding sub-batches, not timed: a recording
embedder reads the job's record at each model call, so each call shows what the job had written
after the one before it. The wall-clock figures on a 2,000-document job are ``bench/job_progress.py``.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from embedding.base import Embeddings
from quarry.api import create_app
from quarry.api.keys import new_key
from quarry.ingest_progress import progress_of
from quarry.service import Quarry
from quarry.settings import EmbeddingSettings, IngestSettings, Settings
from tests.core.conftest import CountingEmbedder, write_jsonl

SUB_BATCH = 4  # texts per model call (QUARRY_EMBEDDING__BATCH_SIZE)
BATCH = 12  # documents per job batch (QUARRY_INGEST__BATCH_SIZE): 3 sub-batches of one-chunk documents


class RecordingEmbedder(CountingEmbedder):
    """The real embedder; before each call it runs ``on_call(call_number)`` (reads the job, cancels it...)."""

    def __init__(self, inner: CountingEmbedder) -> None:
        super().__init__(inner.inner)
        self.on_call: Callable[[int], None] | None = None
        self.lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> Embeddings:
        hook = self.on_call
        if hook is not None:
            with self.lock:
                hook(self.calls)
        return super().embed(texts)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, counting: CountingEmbedder) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("progress-root")
    embedder = RecordingEmbedder(counting)
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("progress-data"),
        ingest=IngestSettings(roots=[root], batch_size=BATCH, job_lease_s=5.0, progress_interval_s=0.0),
        embedding=EmbeddingSettings(batch_size=SUB_BATCH),
    )
    quarry = Quarry(settings, embedder=embedder)
    with TestClient(create_app(quarry)) as client:
        yield {"client": client, "quarry": quarry, "root": root, "embedder": embedder}
    quarry.close()


def _docs(n: int, prefix: str) -> list[object]:
    return [{"id": f"{prefix}{i:03d}", "text": f"Short note {i} of {prefix} about rivers and {secrets.token_hex(4)}."}
            for i in range(n)]


def _wait(client: TestClient, job_id: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        body: dict[str, Any] = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
        if body["state"] in ("done", "partial", "failed", "cancelled"):
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


def _collection(client: TestClient, headers: dict[str, str] | None = None, **extra: str) -> str:
    name = f"prog_{secrets.token_hex(3)}"
    resp = client.post("/v1/collections", json={"name": name, **extra}, headers=headers)
    assert resp.status_code == 201, resp.text
    return name


def _running(quarry: Quarry, name: str) -> Any:
    jobs = [j for j in quarry.docstore.list_jobs(collection=name, limit=5) if j.state in ("running", "cancelling")]
    assert len(jobs) == 1, jobs
    return jobs[0]


def test_progress_moves_after_every_embedding_sub_batch(env: dict[str, Any]) -> None:
    client, quarry, root, embedder = env["client"], env["quarry"], env["root"], env["embedder"]
    name = _collection(client)
    write_jsonl(root / "two-batches.jsonl", _docs(2 * BATCH, "p"))  # 2 batches x 3 sub-batches
    seen: list[dict[str, Any]] = []

    def record(_: int) -> None:
        job = _running(quarry, name)
        seen.append({**job.counters, "rate": progress_of(job)["rate_docs_s"]})

    embedder.on_call = record
    try:
        job_id = client.post(f"/v1/collections/{name}/jobs", json={"path": "two-batches.jsonl"}).json()["id"]
        done = _wait(client, job_id)
    finally:
        embedder.on_call = None
    assert done["state"] == "done" and done["counters"]["done"] == 2 * BATCH, done
    per_batch = BATCH // SUB_BATCH
    assert len(seen) == 2 * per_batch, seen
    for i, c in enumerate(seen):
        batch, sub = divmod(i, per_batch)
        # what the job had written before this model call: the chunks planned and those embedded
        assert (c["done"], c["parsed"], c["batch_documents"]) == (batch * BATCH, (batch + 1) * BATCH, BATCH), c
        assert (c["batch_chunks"], c["batch_embedded"]) == (BATCH, sub * SUB_BATCH), c
    assert seen[1]["rate"] is not None  # a rate inside the very first batch, not only after it
    # between batches the in-flight counters are back to 0, and the final record says so
    assert (done["counters"]["batch_documents"], done["counters"]["batch_embedded"]) == (0, 0)
    assert done["counters"]["parsed"] == 2 * BATCH


def test_cancel_stops_at_the_next_sub_batch_and_drops_that_batch(env: dict[str, Any]) -> None:
    client, quarry, root, embedder = env["client"], env["quarry"], env["root"], env["embedder"]
    name = _collection(client)
    write_jsonl(root / "cancel-mid.jsonl", _docs(3 * BATCH, "c"))
    per_batch = BATCH // SUB_BATCH
    cancel_at = per_batch + 1  # the second sub-batch of the second batch
    calls: list[int] = []

    def cancel(call: int) -> None:
        calls.append(call)
        if len(calls) == cancel_at + 1:  # cancelled as this sub-batch starts: the next one must not
            job = client.app.state.ingest_jobs.cancel(quarry, _running(quarry, name).id)  # DELETE /v1/jobs/{id}
            assert job.state == "cancelling"

    embedder.on_call = cancel
    try:
        job_id = client.post(f"/v1/collections/{name}/jobs", json={"path": "cancel-mid.jsonl"}).json()["id"]
        done = _wait(client, job_id)
    finally:
        embedder.on_call = None
    assert done["state"] == "cancelled", done
    assert len(calls) == cancel_at + 1, calls  # no model call after the cancel: effective within one sub-batch
    # the first batch stays; the second, cancelled mid-embedding, wrote nothing
    c = done["counters"]
    assert (c["done"], c["read"], c["added"], c["batch_documents"]) == (BATCH, BATCH, BATCH, 0), c
    assert client.get(f"/v1/collections/{name}").json()["documents"] == BATCH


def test_a_cancel_seen_in_the_record_stops_too(env: dict[str, Any]) -> None:
    """A cancel asked on another replica only sets the record: the next progress write finds it."""
    client, quarry, root, embedder = env["client"], env["quarry"], env["root"], env["embedder"]
    name = _collection(client)
    write_jsonl(root / "cancel-record.jsonl", _docs(BATCH, "r"))
    calls: list[int] = []

    def cancel_elsewhere(call: int) -> None:
        calls.append(call)
        if len(calls) == 1:
            quarry.docstore.update_job(_running(quarry, name).id, state="cancelling")  # not through this process

    embedder.on_call = cancel_elsewhere
    try:
        job_id = client.post(f"/v1/collections/{name}/jobs", json={"path": "cancel-record.jsonl"}).json()["id"]
        done = _wait(client, job_id)
    finally:
        embedder.on_call = None
    assert done["state"] == "cancelled" and done["counters"]["done"] == 0, done
    assert len(calls) == 1, calls  # progress written after that call carried the cancel back
    assert client.get(f"/v1/collections/{name}").json()["documents"] == 0


def test_listing_and_audit_are_the_tenants_own(env: dict[str, Any]) -> None:
    """Last in this module: once a key exists, this server requires one."""
    client, quarry, root = env["client"], env["quarry"], env["root"]
    tenants = [f"tp{secrets.token_hex(2)}" for _ in range(2)]
    keys: dict[str, dict[str, str]] = {}
    for tenant in tenants:
        quarry.docstore.create_tenant(tenant, tenant)
    for who, tenant, scopes in (("op", "default", ["read", "write", "admin"]), ("a", tenants[0], ["read", "write"]),
                                ("a_admin", tenants[0], ["admin"]), ("b", tenants[1], ["read", "write", "admin"])):
        key, record = new_key(tenant, scopes)
        quarry.docstore.insert_api_key(record)
        keys[who] = {"Authorization": f"Bearer {key}"}
    shared = _collection(client, keys["op"], tenancy="shared")
    write_jsonl(root / "shared.jsonl", _docs(3, "s"))
    job_a = client.post(f"/v1/collections/{shared}/jobs", json={"path": "shared.jsonl"}, headers=keys["a"])
    assert job_a.status_code == 202, job_a.text
    assert _wait(client, job_a.json()["id"], keys["a"])["state"] == "done"
    job_b = client.post(f"/v1/collections/{shared}/jobs", json={"path": "shared.jsonl"}, headers=keys["b"])
    assert _wait(client, job_b.json()["id"], keys["b"])["state"] == "done"
    own_b = _collection(client, keys["b"])
    job_b2 = client.post(f"/v1/collections/{own_b}/jobs", json={"path": "shared.jsonl"}, headers=keys["b"])
    assert _wait(client, job_b2.json()["id"], keys["b"])["state"] == "done"

    def listed(who: str, **params: str) -> list[str]:
        resp = client.get("/v1/jobs", params=params, headers=keys[who])
        assert resp.status_code == 200, resp.text
        return [j["id"] for j in resp.json()["jobs"]]

    # a tenant's job of a shared collection is recorded with the shared ones, and listed as its own
    assert listed("a") == [job_a.json()["id"]]
    assert listed("b") == [job_b2.json()["id"], job_b.json()["id"]]  # newest first
    assert listed("b", collection=shared) == [job_b.json()["id"]]
    assert listed("b", state="running") == []
    assert {job_a.json()["id"], job_b.json()["id"]} <= set(listed("op", collection=shared))  # the operator's
    assert job_b2.json()["id"] not in listed("op")

    # the audit log: admin only, the key's tenant only, paged without gap or repeat
    assert client.get("/v1/audit", headers=keys["a"]).status_code == 403
    first = client.get("/v1/audit", params={"limit": 1}, headers=keys["b"])
    assert first.status_code == 200, first.text
    page = first.json()
    assert len(page["entries"]) == 1 and page["next_cursor"] is not None
    rest = client.get("/v1/audit", params={"cursor": page["next_cursor"], "limit": 1000}, headers=keys["b"]).json()
    entries = page["entries"] + rest["entries"]
    assert rest["next_cursor"] is None
    assert {e["tenant"] for e in entries} == {tenants[1]}
    assert [e["action"] for e in entries] == ["ingest.submit", "collection.create", "ingest.submit"]
    assert [e["id"] for e in entries] == sorted(e["id"] for e in entries)
    assert entries[1]["target"] == own_b and entries[0]["key_id"] is not None
    assert [e["tenant"] for e in client.get("/v1/audit", headers=keys["a_admin"]).json()["entries"]] == [
        tenants[0]]
    bad = client.get("/v1/audit", params={"cursor": "x1"}, headers=keys["b"])
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "InvalidRequest", bad.text


def test_ingest_settings_know_the_progress_interval(tmp_path: Path) -> None:
    assert IngestSettings().progress_interval_s == 1.0
    with pytest.raises(ValueError, match="progress_interval_s"):
        IngestSettings(progress_interval_s=-1)


def test_a_watched_batch_sizes_its_model_calls_to_the_interval(
    tmp_path: Path, counting: CountingEmbedder,
) -> None:
    """With a watch, each model call is sized from the last one's seconds per text (8 texts first)."""
    from indexing.document_rules import SourceDocument

    docs = [SourceDocument(f"w{i:02d}", f"Short note {i} about estuaries.", "", {}) for i in range(20)]
    sizes: dict[str, list[int]] = {}
    for label, call_s in (("tiny", 1e-9), ("ample", 1e6), ("off", 0.0)):
        embedder = RecordingEmbedder(counting)
        seen: list[int] = []
        embedder.on_call = lambda _, seen=seen, embedder=embedder: seen.append(embedder.texts)
        settings = Settings(data_dir=tmp_path / label, ingest=IngestSettings(progress_interval_s=call_s),
                            embedding=EmbeddingSettings(batch_size=16))
        quarry = Quarry(settings, embedder=embedder)
        try:
            quarry.create_collection("w")
            before = embedder.texts
            quarry.upsert_batch("w", docs, lambda *_: None)
            marks = [*seen, embedder.texts]
            sizes[label] = [b - a for a, b in zip(marks, marks[1:], strict=False) if b > before]
        finally:
            quarry.close()
    assert sizes["tiny"] == [8] + [1] * 12  # every call over the limit: one text at a time
    assert sizes["ample"] == [8, 12]  # fast calls: up to the model batch size (16)
    assert sizes["off"] == [16, 4]  # progress_interval_s 0: the model batch size throughout
