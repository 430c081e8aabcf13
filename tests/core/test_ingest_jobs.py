"""Issue 23: ingestion jobs over REST (``POST /v1/collections/{name}/jobs``, ``GET``/``DELETE /v1/jobs/{id}``).

In this process, on the real Milvus Lite and the packaged MiniLM (the session's memo of its
vectors, counted by :class:`CountingEmbedder`): the source confinement (no roots, outside, ``..``,
links out, a folder's file that links out), progress with errors by path, scopes and tenants,
cancel, and a resume from a checkpoint left by a "dead" server (a job row with a lapsed lease).
The SIGKILL of a real ``quarry serve`` is ``test_ingest_jobs_kill.py``.
"""

from __future__ import annotations

import io
import json
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from rich.console import Console

from embedding.base import Embeddings
from indexing.bm25_registry import BM25Registry
from indexing.docstore import open_docstore
from indexing.document_rules import parse_document
from indexing.sources import Source
from quarry.api import create_app
from quarry.api.keys import new_key
from quarry.errors import Forbidden, InvalidDocument
from quarry.ingest_jobs import confine
from quarry.ingest_progress import Checkpoint
from quarry.ingest_remote import RemoteError, RemoteIngest
from quarry.ingest_run import EXIT_BAD_INPUT, EXIT_OK, EXIT_PARTIAL, Options
from quarry.service import Quarry
from quarry.settings import BM25Settings, IngestSettings, Settings
from tests.core.conftest import CountingEmbedder, write_jsonl
from tests.state.test_bm25_follow import _write as bm25_write


class GatedEmbedder(CountingEmbedder):
    """The counting embedder, paused inside a call while ``gate`` is clear (a job caught mid-batch)."""

    def __init__(self, inner: CountingEmbedder) -> None:
        super().__init__(inner.inner)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def embed(self, texts: Sequence[str]) -> Embeddings:
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return super().embed(texts)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, counting: CountingEmbedder) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp("jobs-data")
    root = tmp_path_factory.mktemp("jobs-root")
    outside = tmp_path_factory.mktemp("jobs-outside")
    embedder = GatedEmbedder(counting)
    settings = Settings(data_dir=data, ingest=IngestSettings(roots=[root], batch_size=2, job_lease_s=3.0))
    quarry = Quarry(settings, embedder=embedder)
    with TestClient(create_app(quarry)) as client:
        yield {"client": client, "quarry": quarry, "root": root, "outside": outside, "embedder": embedder}
    quarry.close()


def _docs(n: int, prefix: str = "d") -> list[dict[str, str]]:
    return [{"id": f"{prefix}{i:03d}", "text": f"Document {i} of {prefix}: notes on topic number {i} and rivers."}
            for i in range(n)]


def _wait(client: TestClient, job_id: str, states: tuple[str, ...] = ("done", "partial", "failed", "cancelled"),
          headers: dict[str, str] | None = None) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        body: dict[str, Any] = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
        if body["state"] in states:
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


def _collection(client: TestClient, headers: dict[str, str] | None = None) -> str:
    name = f"jobs_{secrets.token_hex(3)}"
    assert client.post("/v1/collections", json={"name": name}, headers=headers).status_code == 201
    return name


def test_a_jsonl_job_runs_to_done_with_progress(env: dict[str, Any]) -> None:
    client, root, embedder = env["client"], env["root"], env["embedder"]
    name = _collection(client)
    write_jsonl(root / "seven.jsonl", _docs(7))  # 4 batches of 2
    before = embedder.texts
    resp = client.post(f"/v1/collections/{name}/jobs", json={"path": "seven.jsonl"})
    assert resp.status_code == 202, resp.text
    job = resp.json()
    assert job["kind"] == "ingest" and job["collection"] == name and job["params"]["path"].endswith("seven.jsonl")
    done = _wait(client, job["id"])
    assert done["state"] == "done", done
    c = done["counters"]
    assert (c["done"], c["total"], c["read"], c["added"], c["skipped"], c["resumed"]) == (7, 7, 7, 7, 0, 0)
    assert c["embedded"] == embedder.texts - before == client.get(f"/v1/collections/{name}").json()["chunks"]
    assert done["errors"] == [] and done["rate_docs_s"] > 0 and done["eta_s"] is None
    # the same job again: every document unchanged by its hash, nothing embedded
    again = _wait(client, client.post(f"/v1/collections/{name}/jobs", json={"path": "seven.jsonl"}).json()["id"])
    assert (again["counters"]["unchanged"], again["counters"]["embedded"]) == (7, 0)


def test_source_confinement_fails_closed(env: dict[str, Any]) -> None:
    client, root, outside = env["client"], env["root"], env["outside"]
    name = _collection(client)
    write_jsonl(outside / "secret.jsonl", _docs(2, "s"))
    (root / "link.jsonl").unlink(missing_ok=True)
    (root / "link.jsonl").symlink_to(outside / "secret.jsonl")
    cases = {
        str(outside / "secret.jsonl"): 403,  # absolute, outside
        "../" + outside.name + "/secret.jsonl": 403,  # traversal out of the root
        "link.jsonl": 403,  # a link in the root to a file outside
        "missing.jsonl": 400,  # inside, but not there
        "": 400,
    }
    for path, status in cases.items():
        resp = client.post(f"/v1/collections/{name}/jobs", json={"path": path})
        assert resp.status_code == status, (path, resp.text)
        assert resp.json()["error"]["type"] == ("Forbidden" if status == 403 else "InvalidRequest")
        assert str(outside) not in resp.json()["error"]["message"] or path.startswith("/")
    assert client.post("/v1/collections/nope_x/jobs", json={"path": "x"}).status_code == 404
    # no roots configured: every source is refused, whatever it is
    with pytest.raises(Forbidden, match="QUARRY_INGEST__ROOTS"):
        confine(str(root / "seven.jsonl"), [])


def test_a_path_jobs_body_is_validated_as_a_declared_json_body(env: dict[str, Any]) -> None:
    """The route reads its body itself (an upload is streamed): a JSON body still gets FastAPI's 422s."""
    client = env["client"]
    name = _collection(client)
    url = f"/v1/collections/{name}/jobs"
    form = client.post(url, content=b'{"path": "x.jsonl"}', headers={"content-type": "text/plain"})
    assert form.status_code == 422 and "Content-Type: application/json" in form.json()["error"]["message"]
    broken = client.post(url, content=b'{"path": ', headers={"content-type": "application/json"})
    assert broken.status_code == 422 and "not valid JSON" in broken.json()["error"]["message"], broken.text
    for body, said in (({}, "path: Field required"), ({"path": "x", "prune": 1}, "prune: Input should be a valid"),
                       ({"path": "x", "extra": 1}, "extra: Extra inputs")):
        resp = client.post(url, json=body)
        assert resp.status_code == 422 and said in resp.json()["error"]["message"], resp.text


def test_a_folder_job_names_skipped_files_and_links_out(env: dict[str, Any]) -> None:
    client, root, outside = env["client"], env["root"], env["outside"]
    name = _collection(client)
    folder = root / f"folder_{name}"
    folder.mkdir()
    (folder / "a.txt").write_text("Alpha notes about glaciers and ice.", encoding="utf-8")
    (folder / "b.md").write_text("Beta notes about deserts and sand.", encoding="utf-8")
    (folder / "bad.txt").write_bytes(b"\xff\xfe not utf-8 \xff")
    (outside / "private.txt").write_text("A private file beyond the root.", encoding="utf-8")
    (folder / "escape.txt").symlink_to(outside / "private.txt")
    done = _wait(client, client.post(f"/v1/collections/{name}/jobs", json={"path": folder.name}).json()["id"])
    assert done["state"] == "partial", done
    assert done["counters"]["read"] == 2 and done["counters"]["skipped"] == 2
    by_path = {Path(e["path"]).name: e["reason"] for e in done["errors"]}
    assert set(by_path) == {"bad.txt", "escape.txt"}
    assert "outside the allowed ingest roots" in by_path["escape.txt"] and "UTF-8" in by_path["bad.txt"]
    ids = [d["id"] for d in client.get(f"/v1/collections/{name}/documents").json()["documents"]]
    assert ids == ["a.txt", "b.md"]


def test_cancel_stops_after_the_batch_in_flight(env: dict[str, Any]) -> None:
    client, root, embedder = env["client"], env["root"], env["embedder"]
    name = _collection(client)
    write_jsonl(root / "cancel.jsonl", _docs(6, "c"))
    embedder.gate.clear()
    embedder.entered.clear()
    try:
        job_id = client.post(f"/v1/collections/{name}/jobs", json={"path": "cancel.jsonl"}).json()["id"]
        assert embedder.entered.wait(30)  # the first batch is being embedded
        resp = client.delete(f"/v1/jobs/{job_id}")
        assert resp.status_code == 202 and resp.json()["state"] == "cancelling", resp.text
        assert client.post(f"/v1/collections/{name}/jobs", json={"path": "cancel.jsonl"}).status_code == 409
    finally:
        embedder.gate.set()
    done = _wait(client, job_id)
    assert done["state"] == "cancelled" and done["counters"]["read"] == 2, done  # the batch in flight kept
    assert client.get(f"/v1/collections/{name}").json()["documents"] == 2
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 409  # finished


def test_a_lapsed_job_resumes_from_its_checkpoint(env: dict[str, Any]) -> None:
    """A job left ``running`` by a dead server (lapsed lease, checkpoint at 4 of 8) is resumed by the scan."""
    client, quarry, root, embedder = env["client"], env["quarry"], env["root"], env["embedder"]
    name = _collection(client)
    docs = _docs(8, "r")
    write_jsonl(root / "resume.jsonl", docs)
    # what the dead server committed: the first 4 documents, then its checkpoint
    quarry.upsert(name, [parse_document(d) for d in docs[:4]])
    embedded_before_kill = embedder.texts
    job = quarry.docstore.create_job("ingest", collection=name, state="running",
                                     params={"path": str(root / "resume.jsonl"), "on_error": "skip", "prune": False})
    cp = Checkpoint(position=4, run_started=time.time() - 5)
    quarry.docstore.update_job(job.id, cursor=cp.dump(), counters={"done": 4, "total": 8, "embedded": 4})
    assert quarry.docstore.claim_job(job.id, "deadhost:1:dead", 0.5)
    time.sleep(0.6)  # its lease lapses; the server's scan (every job_lease_s / 3 = 1 s) claims it
    done = _wait(client, job.id)
    assert done["state"] == "done", done
    c = done["counters"]
    assert (c["read"], c["added"], c["unchanged"], c["resumed"]) == (8, 4, 0, 1), c
    assert embedder.texts - embedded_before_kill == c["embedded"] - 4 == 4  # only the 4 not written
    assert client.get(f"/v1/collections/{name}").json()["documents"] == 8


def test_remote_ingest_follows_the_job_with_the_local_exit_codes(env: dict[str, Any]) -> None:
    """``quarry ingest --server``'s follower over the app's client: 0 done, 4 partial, 2 refused."""
    client, root = env["client"], env["root"]
    name = _collection(client)
    write_jsonl(root / "remote.jsonl", _docs(5, "m"))
    out, err = io.StringIO(), io.StringIO()
    consoles = {"out": Console(file=out, width=300), "err": Console(file=err, width=300)}
    run = RemoteIngest(client, name, "remote.jsonl", Options(as_json=True), **consoles, poll_s=0.05)
    assert run.execute() == EXIT_OK
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert events[-1]["event"] == "report" and events[-1]["added"] == 5 and events[-1]["status"] == "ok"
    assert all(e["event"] == "progress" for e in events[:-1]) and events[-2]["done"] == 5
    folder = root / f"remote_{name}"
    folder.mkdir()
    (folder / "ok.txt").write_text("Readable notes about lakes.", encoding="utf-8")
    (folder / "bad.txt").write_bytes(b"\xff\xfe")
    partial = RemoteIngest(client, name, folder.name, Options(), **consoles, poll_s=0.05)
    assert partial.execute() == EXIT_PARTIAL
    assert "skipped " in err.getvalue() and "bad.txt" in err.getvalue()
    with pytest.raises(RemoteError) as refused:
        RemoteIngest(client, name, "/etc/passwd", Options(), **consoles).execute()
    assert refused.value.code == EXIT_BAD_INPUT and "Forbidden" in str(refused.value)


# --- upload jobs: the body is the source (NDJSON), spooled to <data_dir>/jobs -----------------------------------
NDJSON = {"Content-Type": "application/x-ndjson"}


def _chunked(data: bytes, size: int = 100) -> Iterator[bytes]:
    """A body streamed in pieces (no Content-Length: the server counts the bytes as they come)."""
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _spools(quarry: Quarry) -> list[str]:
    folder = Path(quarry.settings.data_dir) / "jobs"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _spool_gone(quarry: Quarry, job_id: str) -> bool:
    """Whether the job's spool is removed (by its worker as it lets the job go, just after the final state)."""
    deadline = time.monotonic() + 10
    while f"{job_id}.jsonl" in _spools(quarry):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_an_upload_job_ingests_what_a_path_job_does(env: dict[str, Any]) -> None:
    """N documents uploaded as NDJSON: the same documents and chunk ids as the same .jsonl by path; spool gone."""
    client, quarry, root = env["client"], env["quarry"], env["root"]
    by_path, by_upload = _collection(client), _collection(client)
    docs = [*_docs(6, "u"), {"id": "u_meta", "text": "Cedar and pine forests.", "title": "Trees", "lang": "en",
                             "metadata": {"year": 2020}}]
    write_jsonl(root / "upload.jsonl", docs)
    path_job = _wait(client, client.post(f"/v1/collections/{by_path}/jobs", json={"path": "upload.jsonl"}).json()["id"])
    resp = client.post(f"/v1/collections/{by_upload}/jobs", headers=NDJSON,
                       content=_chunked((root / "upload.jsonl").read_bytes()))
    assert resp.status_code == 202, resp.text
    job = resp.json()
    assert job["params"]["upload_bytes"] == (root / "upload.jsonl").stat().st_size and "path" not in job["params"]
    done = _wait(client, job["id"])
    assert done["state"] == path_job["state"] == "done", done
    for key in ("total", "read", "added", "embedded", "chunks_written"):
        assert done["counters"][key] == path_job["counters"][key], key
    ids = [d["id"] for d in docs]
    assert quarry.docstore.chunk_ids_of(by_upload, ids) == quarry.docstore.chunk_ids_of(by_path, ids)
    got = client.get(f"/v1/collections/{by_upload}/documents/u_meta").json()
    want = client.get(f"/v1/collections/{by_path}/documents/u_meta").json()
    assert got == want and got["metadata"] == {"year": 2020, "lang": "en"}, got
    assert _spool_gone(quarry, job["id"]) and not any(n.endswith(".part") for n in _spools(quarry))
    # options as query parameters; a bad one is a 400 before anything is spooled
    assert client.post(f"/v1/collections/{by_upload}/jobs?on_error=maybe", headers=NDJSON,
                       content=b"{}").status_code == 400
    pruned = client.post(f"/v1/collections/{by_upload}/jobs?prune=true", headers=NDJSON,
                         content=json.dumps(docs[0]).encode() + b"\n")
    done = _wait(client, pruned.json()["id"])
    assert done["params"]["prune"] is True and done["counters"]["pruned"] == 6, done
    assert client.get(f"/v1/collections/{by_upload}").json()["documents"] == 1


def test_an_upload_over_the_limit_is_413_and_leaves_no_spool(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    client, quarry = env["client"], env["quarry"]
    name = _collection(client)
    monkeypatch.setattr(quarry.settings.ingest, "max_upload_bytes", 1000)
    body = "".join(json.dumps(d) + "\n" for d in _docs(30, "big")).encode()
    assert len(body) > 1000
    before = _spools(quarry)
    for content in (body, _chunked(body)):  # Content-Length says so / the streamed bytes pass the limit
        resp = client.post(f"/v1/collections/{name}/jobs", headers=NDJSON, content=content)
        assert resp.status_code == 413, resp.text
        error = resp.json()["error"]
        assert error["type"] == "PayloadTooLarge" and "QUARRY_INGEST__MAX_UPLOAD_BYTES" in error["message"], error
        assert set(_spools(quarry)) <= set(before)  # nothing new (an earlier job's may go meanwhile)
    assert quarry.docstore.list_jobs(collection=name) == []
    # the upload limit, not QUARRY_API__MAX_BODY_BYTES, bounds an upload (and only an upload)
    monkeypatch.setattr(quarry.settings.ingest, "max_upload_bytes", 1 << 20)
    monkeypatch.setattr(quarry.settings.api, "max_body_bytes", 1000)
    ok = client.post(f"/v1/collections/{name}/jobs", headers=NDJSON, content=_chunked(body))
    assert ok.status_code == 202, ok.text
    assert _wait(client, ok.json()["id"])["counters"]["added"] == 30


def test_an_upload_with_a_malformed_line_fails_naming_the_line(env: dict[str, Any]) -> None:
    client, quarry = env["client"], env["quarry"]
    name = _collection(client)
    lines = [json.dumps(d) for d in _docs(2, "m")] + ['{"id": "m9", "text": ', json.dumps(_docs(1, "z")[0])]
    resp = client.post(f"/v1/collections/{name}/jobs?on_error=skip", headers=NDJSON,
                       content="\n".join(lines).encode())
    assert resp.status_code == 202, resp.text
    done = _wait(client, resp.json()["id"])
    assert done["state"] == "failed" and "uploaded body:line 3: invalid JSON" in done["error"], done
    assert str(quarry.settings.data_dir) not in done["error"]
    assert client.get(f"/v1/collections/{name}").json()["documents"] == 0  # validated before anything is written
    assert _spool_gone(quarry, done["id"])


def test_a_cancelled_upload_job_removes_its_spool(env: dict[str, Any]) -> None:
    client, quarry, embedder = env["client"], env["quarry"], env["embedder"]
    name = _collection(client)
    body = "".join(json.dumps(d) + "\n" for d in _docs(6, "x")).encode()
    embedder.gate.clear()
    embedder.entered.clear()
    try:
        job_id = client.post(f"/v1/collections/{name}/jobs", headers=NDJSON, content=body).json()["id"]
        assert embedder.entered.wait(30)  # the first batch is being embedded; the spool is there
        assert f"{job_id}.jsonl" in _spools(quarry)
        assert client.delete(f"/v1/jobs/{job_id}").status_code == 202
    finally:
        embedder.gate.set()
    done = _wait(client, job_id)
    assert done["state"] == "cancelled" and done["counters"]["read"] == 2, done
    assert _spool_gone(quarry, job_id)


def test_a_lapsed_upload_job_resumes_from_its_spool(env: dict[str, Any]) -> None:
    """A job left ``running`` by a dead server, its spool on this server's disk: resumed at 4 of 8, spool removed.

    The same job whose spool this server cannot see (another replica's data dir) fails, saying so.
    """
    client, quarry, embedder = env["client"], env["quarry"], env["embedder"]
    name = _collection(client)
    docs = _docs(8, "p")
    quarry.upsert(name, [parse_document(d) for d in docs[:4]])  # what the dead server committed
    embedded_before_kill = embedder.texts
    folder = Path(quarry.settings.data_dir) / "jobs"
    folder.mkdir(exist_ok=True)
    jobs = []
    for spooled in (True, False):
        job_id = secrets.token_hex(16)
        spool = write_jsonl(folder / f"{job_id}.jsonl", docs) if spooled else folder / f"{job_id}.jsonl"
        job = quarry.docstore.create_job(
            "ingest", collection=name if spooled else _collection(client), state="running", job_id=job_id,
            params={"upload": str(spool), "upload_bytes": 1, "on_error": "skip", "prune": False},
        )
        quarry.docstore.update_job(job.id, cursor=Checkpoint(position=4, run_started=time.time() - 5).dump(),
                                   counters={"done": 4, "total": 8, "embedded": 4})
        assert quarry.docstore.claim_job(job.id, "deadhost:1:dead", 0.5)
        jobs.append(job.id)
    time.sleep(0.6)  # the leases lapse; the server's scan claims both
    done = _wait(client, jobs[0])
    assert done["state"] == "done", done
    c = done["counters"]
    assert (c["read"], c["added"], c["unchanged"], c["resumed"]) == (8, 4, 0, 1), c
    assert embedder.texts - embedded_before_kill == c["embedded"] - 4 == 4  # only the 4 not written
    assert client.get(f"/v1/collections/{name}").json()["documents"] == 8
    assert _spool_gone(quarry, jobs[0])
    lost = _wait(client, jobs[1])
    assert lost["state"] == "failed" and "is not on this server's disk" in lost["error"], lost


def test_remote_ingest_uploads_a_local_source(env: dict[str, Any], tmp_path: Path) -> None:
    """``quarry ingest LOCAL --server``: read here (a folder, files skipped here named), streamed as NDJSON."""
    client = env["client"]
    name = _collection(client)
    folder = tmp_path / "local"
    folder.mkdir()
    (folder / "a.txt").write_text("Local notes about harbours and tides.", encoding="utf-8")
    (folder / "b.md").write_text("---\nauthor: Kim\n---\nLocal notes about ferries.", encoding="utf-8")
    (folder / "bad.txt").write_bytes(b"\xff\xfe not utf-8")
    out, err = io.StringIO(), io.StringIO()
    consoles = {"out": Console(file=out, width=300), "err": Console(file=err, width=300)}
    source = Source(folder)
    run = RemoteIngest(client, name, str(folder), Options(as_json=True), **consoles, poll_s=0.05, upload=source)
    assert run.execute() == EXIT_PARTIAL
    report = json.loads(out.getvalue().splitlines()[-1])
    assert report["status"] == "partial" and report["added"] == 2 and report["skipped"] == 1, report
    assert [Path(e["path"]).name for e in report["errors"]] == ["bad.txt"]
    ids = [d["id"] for d in client.get(f"/v1/collections/{name}/documents").json()["documents"]]
    assert ids == ["a.txt", "b.md"]
    meta = client.get(f"/v1/collections/{name}/documents/b.md").json()["metadata"]
    assert meta == {"author": "Kim", "source": "b.md", "format": "md"}, meta  # as a local run of the folder
    jsonl = write_jsonl(tmp_path / "local.jsonl", _docs(3, "l"))
    again = RemoteIngest(client, name, str(jsonl), Options(), **consoles, poll_s=0.05, upload=Source(jsonl))
    assert again.execute() == EXIT_OK
    assert client.get(f"/v1/collections/{name}").json()["documents"] == 5


def test_an_uploaded_folder_of_formats_keeps_pages_and_matches_a_path_job(env: dict[str, Any]) -> None:
    """PDF pages and DOCX headings travel as ``sections``: the same chunk ids, hashes and payloads (``page``)."""
    pytest.importorskip("fpdf")
    pytest.importorskip("docx")
    from tests.core.test_ingest_formats import make_sources

    client, quarry, root = env["client"], env["quarry"], env["root"]
    by_path, by_upload = _collection(client), _collection(client)
    folder = make_sources(root / f"formats_{by_path}")
    path_job = _wait(client, client.post(f"/v1/collections/{by_path}/jobs", json={"path": folder.name}).json()["id"])
    out, err = io.StringIO(), io.StringIO()
    consoles = {"out": Console(file=out, width=300), "err": Console(file=err, width=300)}
    run = RemoteIngest(client, by_upload, str(folder), Options(), **consoles, poll_s=0.05, upload=Source(folder))
    assert run.execute() == EXIT_PARTIAL == {"partial": EXIT_PARTIAL}[path_job["state"]]  # the same files skipped
    docs = {name: {d.document_id: d.content_hash for d in quarry.docstore.list_documents(name)}
            for name in (by_path, by_upload)}
    assert docs[by_upload] == docs[by_path] and "guide.pdf" in docs[by_path]
    owned = quarry.docstore.chunk_ids_of(by_upload, list(docs[by_upload]))
    assert owned == quarry.docstore.chunk_ids_of(by_path, list(docs[by_path]))
    ids = [c for cs in owned.values() for c in cs]
    payloads = {name: {c: (s.text, s.payload) for c, s in quarry.docstore.get_chunks(name, ids).items()}
                for name in (by_path, by_upload)}
    assert payloads[by_upload] == payloads[by_path]
    pages = [p["page"] for c, (_, p) in payloads[by_upload].items() if c in owned["guide.pdf"]]
    assert sorted(pages) == [1, 2, 3], pages


def test_a_lines_sections_are_checked() -> None:
    text = "first page text. second page text."
    doc = parse_document({"id": "s", "text": text, "sections": [{"start": 0, "metadata": {"page": 1}},
                                                                {"start": 17, "metadata": {"page": 2}}]})
    assert [(s.start, s.metadata) for s in doc.sections] == [(0, {"page": 1}), (17, {"page": 2})]
    assert parse_document({"id": "s", "text": text}).sections == ()
    for bad in ([{"start": 3}], [{"start": 0}, {"start": 0}], [{"start": 0}, {"start": len(text)}],
                [{"start": 0, "page": 1}], ["0"], {"start": 0}, [{"start": True}]):
        with pytest.raises(InvalidDocument, match="'sections'"):
            parse_document({"id": "s", "text": text, "sections": bad})


def test_checkpoint_round_trip() -> None:
    cp = Checkpoint(position=3, errors=[["a", "b"]], errors_total=1, run_started=1.5, run_position=2)
    assert Checkpoint.parse(cp.dump()) == cp and Checkpoint.parse(None) == Checkpoint()


def test_scopes_and_tenants(env: dict[str, Any]) -> None:
    """Last in this module: once a key exists, this server requires one."""
    client, quarry, root = env["client"], env["quarry"], env["root"]
    tenant = f"tj{secrets.token_hex(2)}"
    quarry.docstore.create_tenant(tenant, tenant)
    keys = {}
    for scopes in (["read"], ["write"], ["admin"], ["read", "write", "admin"]):
        key, record = new_key(tenant, scopes)
        quarry.docstore.insert_api_key(record)
        keys[",".join(scopes)] = {"Authorization": f"Bearer {key}"}
    other, record = new_key("default", ["read", "write", "admin"])
    quarry.docstore.insert_api_key(record)
    name = _collection(client, keys["read,write,admin"])
    write_jsonl(root / "three.jsonl", _docs(3))
    assert client.post(f"/v1/collections/{name}/jobs", json={"path": "three.jsonl"},
                       headers=keys["read"]).status_code == 403
    resp = client.post(f"/v1/collections/{name}/jobs", json={"path": "three.jsonl"}, headers=keys["write"])
    assert resp.status_code == 202, resp.text
    job_id = resp.json()["id"]
    assert _wait(client, job_id, headers=keys["write"])["state"] == "done"
    upload = json.dumps(_docs(1, "k")[0]).encode()
    assert client.post(f"/v1/collections/{name}/jobs", headers={**keys["read"], **NDJSON},
                       content=upload).status_code == 403
    up = client.post(f"/v1/collections/{name}/jobs", headers={**keys["write"], **NDJSON}, content=upload)
    assert up.status_code == 202, up.text
    assert _wait(client, up.json()["id"], headers=keys["write"])["state"] == "done"
    assert client.get(f"/v1/jobs/{job_id}", headers=keys["read"]).status_code == 403
    assert client.get(f"/v1/jobs/{job_id}", headers=keys["admin"]).status_code == 200
    # another tenant's key: the job is not there (404, as a missing one), nor cancellable
    foreign = {"Authorization": f"Bearer {other}"}
    assert client.get(f"/v1/jobs/{job_id}", headers=foreign).status_code == 404
    assert client.delete(f"/v1/jobs/{job_id}", headers=foreign).status_code == 404
    # a reindex job needs admin, even to look at
    reindex = client.post(f"/v1/collections/{name}/reindex", json={}, headers=keys["admin"]).json()["id"]
    assert client.get(f"/v1/jobs/{reindex}", headers=keys["write"]).status_code == 403
    assert _wait(client, reindex, ("done", "failed"), keys["admin"])["state"] == "done"
    assert client.delete(f"/v1/jobs/{reindex}", headers=keys["admin"]).status_code == 409


def test_remote_ingest_of_an_unreachable_server_is_exit_3(tmp_path: Path) -> None:
    """A server path (``--server-path``) or a local file to upload: exit 3; a local path not there: exit 2."""
    code = "import sys; from quarry.cli import main; sys.argv[0] = 'quarry'; sys.exit(main())"
    local = write_jsonl(tmp_path / "corpus.jsonl", _docs(2))
    cases = {("corpus.jsonl", "--server-path"): 3, (str(local),): 3, (str(tmp_path / "missing.jsonl"),): 2}
    for args, status in cases.items():
        argv = ["ingest", *args, "-c", "c1", "--server", "http://127.0.0.1:9", "--json"]
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode == status, (args, done.stderr)
        assert json.loads(done.stdout.splitlines()[-1])["exit_code"] == status
        if status == 2:
            assert "--server-path" in done.stderr


def test_a_lazy_registry_leaves_an_unloaded_index_to_the_next_reader(tmp_path: Path) -> None:
    """Issue 23, bounded memory: ``quarry ingest`` built the whole collection's BM25 index at its end.

    A lazy registry (the ingest process's) does not load an index it never followed when a write
    asks it to catch up; the next reader builds it from the docstore and sees every write, and an
    index it does follow keeps catching up (read-your-writes).
    """
    store = open_docstore("", tmp_path)
    try:
        name = "lazy"
        store.put_collection(name, {"name": name, "language": "en"})
        bm25_write(store, name, "d0", "heron egret")
        writer = BM25Registry(store, tmp_path / "writer", BM25Settings())
        writer.lazy = True
        writer.invalidate(name)
        assert not (tmp_path / "writer" / name).exists()  # nothing built, nothing saved
        reader = BM25Registry(store, tmp_path / "reader", BM25Settings())
        assert reader.get(name).document_ids == ["d0"]
        writer.get(name)  # now it follows the collection
        bm25_write(store, name, "d1", "egret crane")
        writer.invalidate(name)
        assert writer.get(name).document_ids == ["d0", "d1"]
    finally:
        store.close()
