"""quarry_client against a live ``quarry serve`` (Milvus Lite, SQLite state, the packaged MiniLM), one per module.

Three keys made before the server starts: ``admin`` (read,write,admin), ``reader`` (read) and
``slow`` (read, 1 request/s: its second request in a second is a 429 with ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import quarry.errors
from quarry_client import AsyncQuarry, Quarry, errors
from tests.serve import QuarryServer

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    {"id": "d1", "title": "tides", "text": "Tides follow the moon and the sun.", "metadata": {"year": 2001}},
    {"id": "d2", "title": "ferries", "text": "Ferries cross the harbour every hour.", "metadata": {"year": 2005}},
    {"id": "d3", "text": "Hybrid retrieval fuses BM25 and dense rankings.", "metadata": {"year": 2010}},
]


def _key(env: dict[str, str], *args: str) -> str:
    made = subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "quarry.cli", "keys", "create", *args], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=300, check=True,
    )
    return made.stdout.strip()


ROOTS: list[Path] = []  # the live server's QUARRY_INGEST__ROOTS (one folder)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    data = tmp_path_factory.mktemp("client")
    roots = tmp_path_factory.mktemp("client-roots")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("QUARRY_") or k.endswith("CACHE_DIR")},
           "QUARRY_DATA_DIR": str(data), "PYTHONPATH": str(REPO), "QUARRY_INGEST__BATCH_SIZE": "50",
           "QUARRY_INGEST__ROOTS": json.dumps([str(roots)])}
    ROOTS[:] = [roots]
    keys = {
        "admin": _key(env, "--scopes", "read,write,admin"),
        "reader": _key(env, "--scopes", "read"),
        "slow": _key(env, "--scopes", "read", "--rate", "1/s"),
        "other": _key(env, "--tenant", "other", "--scopes", "read,write,admin"),
    }
    with QuarryServer(env, log=data / "server.log", cwd=REPO).wait_ready() as server:
        with Quarry(server.url, keys["admin"]) as q:
            q.create_collection("notes", language="en")
            q.upsert("notes", DOCS, batch_size=2)
        yield server.url, keys


def test_every_server_error_has_a_client_class_of_the_same_name_and_parent() -> None:
    for cls in vars(quarry.errors).values():
        if isinstance(cls, type) and issubclass(cls, quarry.errors.QuarryError):
            mine = getattr(errors, cls.__name__)
            assert mine.__mro__[1].__name__ == cls.__mro__[1].__name__, cls


def test_the_client_imports_none_of_the_server() -> None:
    code = "import sys, quarry_client; print(sorted(m for m in sys.modules if m.split('.')[0] in " \
           "{'quarry', 'fastapi', 'numpy', 'torch', 'indexing'}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout


def test_sync_collections_documents_search(live: tuple[str, dict[str, str]]) -> None:
    url, keys = live
    with Quarry(url, keys["admin"]) as q:
        assert "notes" in [c.name for c in q.list_collections()]
        assert q.describe("notes").documents == 3
        page = q.list_documents("notes", limit=2)
        assert [d.id for d in page.documents] == ["d1", "d2"] and page.next_cursor is not None
        assert [d.id for d in q.iter_documents("notes", page_size=2)] == ["d1", "d2", "d3"]
        assert q.get_document("notes", "d2").title == "ferries"
        result = q.search("notes", "moon tides", top_k=2, filters={"year": {"$lte": 2005}})
        assert result.hits[0].document_id == "d1" and "bm25" in result.hits[0].explain
        with pytest.raises(errors.CollectionNotFound) as missing:
            q.search("nope", "moon")
        assert missing.value.status == 404 and not missing.value.retryable
        with pytest.raises(errors.InvalidFilter):
            q.search("notes", "moon", filters={"yeer": 1})
        with pytest.raises(errors.NotFound):
            q.get_document("notes", "absent/id with spaces")
        assert q.ensure_collection("notes").name == "notes"


def test_auth_errors_are_typed(live: tuple[str, dict[str, str]]) -> None:
    url, keys = live
    with Quarry(url) as anonymous, pytest.raises(errors.Unauthenticated) as none:
        anonymous.list_collections()
    assert none.value.status == 401
    with Quarry(url, "qk_not_a_real_key") as wrong, pytest.raises(errors.Unauthenticated):
        wrong.list_collections()
    with Quarry(url, keys["reader"]) as reader, pytest.raises(errors.Forbidden):
        reader.create_collection("forbidden_one")


def test_async_search_and_upsert(live: tuple[str, dict[str, str]]) -> None:
    url, keys = live

    async def run() -> tuple[str, int]:
        async with AsyncQuarry(url, keys["admin"]) as q:
            await q.ensure_collection("async_notes", language="en")
            report = await q.upsert("async_notes", DOCS)
            hits = (await q.search("async_notes", "harbour ferries", top_k=1)).hits
            with pytest.raises(errors.CollectionNotFound):
                await q.describe("nope")
            return hits[0].document_id, report.added

    assert asyncio.run(run()) == ("d2", 3)


def test_feedback_rates_a_search_by_its_request_id_for_the_key_that_was_served(
    live: tuple[str, dict[str, str]],
) -> None:
    url, keys = live
    with Quarry(url, keys["reader"]) as reader, Quarry(url, keys["admin"]) as admin:
        result = reader.search("notes", "moon tides", top_k=2)
        assert result.request_id and result.version == 1 and result.rollout is None
        first = result.hits[0].document_id
        given = reader.feedback("notes", result.request_id, rating="down", clicked=[first])
        assert given == {"request_id": result.request_id, "collection": "notes", "version": 1, "rollout": None,
                         "rating": "down", "clicks": 1}
        assert reader.feedback("notes", result.request_id, rating="down", clicked=[first]) == given  # idempotent
        with pytest.raises(errors.NotFound):  # another key of the same tenant may not rate it
            admin.feedback("notes", result.request_id, rating="up")
        with pytest.raises(errors.InvalidRequest):
            reader.feedback("notes", result.request_id, clicked=["d-not-returned"])

    async def rate() -> dict[str, Any]:
        async with AsyncQuarry(url, keys["admin"]) as q:
            found = await q.search("notes", "harbour ferries", top_k=1)
            assert found.request_id is not None
            return await q.feedback("notes", found.request_id, rating="up")

    assert asyncio.run(rate())["rating"] == "up"


def test_an_answer_streams_its_events(live: tuple[str, dict[str, str]]) -> None:
    url, keys = live
    with Quarry(url, keys["admin"]) as q:
        events = list(q.answer_stream("notes", "what do tides follow?", top_k=2))
        assert events[0].event == "sources", events
        assert events[-1].event in ("done", "error"), events
        if events[-1].event == "error":  # this server has no LLM: the typed error ends the stream
            assert isinstance(events[-1].error(), errors.GenerationError)
        with pytest.raises(errors.CollectionNotFound):
            list(q.answer_stream("nope", "anything"))

    async def first_async() -> str:
        async with AsyncQuarry(url, keys["admin"]) as q:
            async for event in q.answer_stream("notes", "what crosses the harbour?"):
                return event.event
        return ""

    assert asyncio.run(first_async()) == "sources"


def test_a_job_is_submitted_listed_and_waited_for(live: tuple[str, dict[str, str]]) -> None:
    url, keys = live
    seen: list[str] = []
    with Quarry(url, keys["admin"]) as q:
        q.ensure_collection("jobs_notes", language="en")
        docs = [{"id": f"j{i}", "text": f"Note {i} about harbours, tides and ferry {i}."} for i in range(120)]
        job = q.submit_job("jobs_notes", documents=docs)
        assert job.id in [j.id for j in q.list_jobs(collection="jobs_notes")]
        done = q.wait_job(job.id, timeout_s=300, poll_s=0.2, progress=lambda j: seen.append(j.state))
        assert (done.state, done.counters["added"], done.counters["total"]) == ("done", 120, 120), done
        assert seen[-1] == "done"
        assert [j.id for j in q.list_jobs(state="done", collection="jobs_notes")] == [job.id]
        with pytest.raises(errors.Conflict):
            q.cancel_job(job.id)
    with Quarry(url, keys["reader"]) as reader, pytest.raises(errors.Forbidden):
        reader.list_jobs()
    with Quarry(url, keys["other"]) as other:  # another tenant: none of these jobs, and 404 for its id
        assert other.list_jobs() == []
        with pytest.raises(errors.NotFound):
            other.get_job(job.id)


def test_a_429_is_retried_after_its_retry_after(live: tuple[str, dict[str, str]]) -> None:
    url, keys = live
    with Quarry(url, keys["slow"], max_retries=0) as impatient:
        impatient.list_collections()
        with pytest.raises(errors.RateLimited) as limited:
            impatient.list_collections()
        assert limited.value.retryable and limited.value.retry_after_s is not None
    with Quarry(url, keys["slow"], max_retries=3) as patient:
        for _ in range(3):  # each one past the first in its second waits for Retry-After, then passes
            assert "notes" in [c.name for c in patient.list_collections()]


def _cli(url: str, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items()
              if (not k.startswith("QUARRY_") or k.endswith("CACHE_DIR")) and k not in ("COLUMNS", "LINES")},
           "PYTHONPATH": str(REPO), "QUARRY_URL": url, "QUARRY_API_KEY": key}
    return subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "quarry.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        check=False,
    )


def test_the_cli_goes_through_the_server_with_quarry_url(live: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    url, keys = live
    listed = _cli(url, keys["admin"], "collections", "list")
    assert listed.returncode == 0 and "notes\ten" in listed.stdout, listed.stderr
    found = _cli(url, keys["admin"], "search", "moon tides", "-c", "notes", "--json", "-k", "1")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["hits"][0]["document_id"] == "d1"
    docs = _cli(url, keys["admin"], "docs", "list", "-c", "notes", "--json")
    assert [d["id"] for d in json.loads(docs.stdout)["documents"]] == ["d1", "d2", "d3"]
    got = _cli(url, keys["admin"], "docs", "get", "d2", "-c", "notes")
    assert "Ferries cross the harbour" in got.stdout
    missing = _cli(url, keys["admin"], "search", "x", "-c", "nope")
    assert missing.returncode == 2 and "CollectionNotFound" in missing.stderr
    denied = _cli(url, "qk_wrong", "collections", "list")
    assert denied.returncode == 2 and "Unauthenticated" in denied.stderr
    source = tmp_path / "fresh.jsonl"
    source.write_text("".join(json.dumps(d) + "\n" for d in DOCS), encoding="utf-8")
    ingested = _cli(url, keys["admin"], "ingest", str(source), "-c", "fresh_by_cli", "--json")
    assert ingested.returncode == 0, ingested.stderr
    report = json.loads(ingested.stdout.splitlines()[-1])
    assert (report["status"], report["added"]) == ("ok", 3), report
    assert "warning" not in ingested.stderr, ingested.stderr


def _folder(root: Path) -> Path:
    """A folder with what a report names: two documents, a damaged file, a format not read, an empty file."""
    root.mkdir(parents=True)
    (root / "a.md").write_text("# Granite\n\nGranite is an igneous rock.", encoding="utf-8")
    (root / "b.txt").write_text("Marble is a metamorphic rock.", encoding="utf-8")
    (root / "bad.txt").write_bytes(b"\xff\xfe not text")
    (root / "data.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    (root / "empty.txt").write_text("   \n", encoding="utf-8")
    return root


def _report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.stdout.strip(), done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert report["event"] == "report", report
    return report


def test_local_server_and_job_runs_report_the_same_fields(live: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    """One report shape: a local run, a run through the server (upload) and a server-side path job."""
    url, keys = live
    folder = _folder(tmp_path / "rocks")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("QUARRY_") or k.endswith("CACHE_DIR")},
           "PYTHONPATH": str(REPO), "QUARRY_DATA_DIR": str(tmp_path / "local-data")}
    local = _report(subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "quarry.cli", "ingest", str(folder), "-c", "rocks", "--json"], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=600, check=False,
    ))
    served = _report(_cli(url, keys["admin"], "ingest", str(folder), "-c", "rocks_up", "--json"))
    shutil.copytree(folder, ROOTS[0] / "rocks")
    job = _report(_cli(url, keys["admin"], "ingest", "rocks", "-c", "rocks_job", "--server-path", "--json"))
    for report in (local, served, job):
        assert report["status"] == "partial" and report["exit_code"] == 4, report
        assert (report["read"], report["skipped"], report["added"], report["written"]) == (2, 1, 2, 2), report
        assert report["not_read"] == ["data.csv"] and report["empty"] == ["empty.txt"], report
        assert [Path(e["path"]).name for e in report["errors"]] == ["bad.txt"], report
        assert report["pruned"] == 0 and report["embedded"] == 2, report
    shape = {k: type(v).__name__ for k, v in local.items() if k not in ("job", "error")}
    for report in (served, job):
        assert set(report) == set(local), set(report) ^ set(local)
        assert {k: type(v).__name__ for k, v in report.items() if k not in ("job", "error")} == shape
    assert local["job"] is None and isinstance(served["job"], str) and served["engine"] == "server"
    # the job's own record names them too (GET /v1/jobs/{id})
    with Quarry(url, keys["admin"]) as q:
        record = q.get_job(job["job"])
    assert record.not_read == ["data.csv"] and record.empty == ["empty.txt"], record


def test_collections_through_the_server_and_plain_output_when_piped(live: tuple[str, dict[str, str]]) -> None:
    url, keys = live
    created = _cli(url, keys["admin"], "collections", "create", "made_by_cli", "--language", "en")
    assert created.returncode == 0, created.stderr
    described = _cli(url, keys["admin"], "collections", "describe", "made_by_cli", "--json")
    assert described.returncode == 0, described.stderr
    assert json.loads(described.stdout)["name"] == "made_by_cli" and json.loads(described.stdout)["documents"] == 0
    listed = _cli(url, keys["admin"], "collections", "list", "--json")
    assert "made_by_cli" in [c["name"] for c in json.loads(listed.stdout)["collections"]]
    dropped = _cli(url, keys["admin"], "collections", "drop", "made_by_cli")
    assert dropped.returncode == 0 and "dropped made_by_cli" in dropped.stdout, dropped.stderr
    gone = _cli(url, keys["admin"], "collections", "describe", "made_by_cli")
    assert gone.returncode == 2 and "CollectionNotFound" in gone.stderr
    # a table piped (stdout not a terminal, no COLUMNS): whole, not cut to 80 columns
    found = _cli(url, keys["admin"], "search", "moon tides", "-c", "notes")
    assert found.returncode == 0, found.stderr
    assert "…" not in found.stdout and "Tides follow the moon and the sun." in found.stdout, found.stdout
    assert max(len(line) for line in found.stdout.splitlines()) > 80
