"""Tenant isolation over REST: two tenants, the same collection name, overlapping document ids and texts.

On the embedded default (Milvus Lite) and on pgvector, tenant A's key never sees, counts or
deletes B's data on any path (list, describe, BM25, dense, hybrid, the answer path's retrieval,
delete by id), a foreign collection is 404 like a missing one, and a key whose tenant is not
known fails closed (403), never unscoped.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient

from indexing.docstore import DEFAULT_TENANT, StateStore
from quarry import metrics
from quarry.api import create_app
from quarry.api.keys import new_key
from quarry.errors import Forbidden
from quarry.service import Quarry
from quarry.services.namespace import refuse_tenant_field
from quarry.services.view import Engines, scoped
from quarry.settings import Settings, StoreSettings
from quarry.tenancy import SHARED
from rerank.cross_encoder import CrossEncoderReranker
from rerank.tiny import build_tiny_cross_encoder
from tests.core.conftest import CountingEmbedder
from tests.llama import llama_settings, require_llama

PG_URL = os.environ.get("QUARRY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5433/quarry")
A_TEXT = "Apples and apricots: the orchard report of tenant alpha about apple harvests."
B_TEXT = "Bananas and blueberries: the plantation report of tenant beta about banana harvests."
SAME = "A shared sentence about weather forecasts that both tenants stored under the same id."


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> CrossEncoderReranker:
    model = CrossEncoderReranker(str(build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-ce"), seed=0)))
    model.warm_up()
    return model


@pytest.fixture(scope="module", params=["milvus-lite", pytest.param("pgvector", marks=pytest.mark.integration)])
def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, counting: CountingEmbedder,
    reranker: CrossEncoderReranker,
) -> Iterator[tuple[TestClient, dict[str, str], str]]:
    data: Path = tmp_path_factory.mktemp("tenants")
    store = StoreSettings(url=PG_URL) if request.param == "pgvector" else StoreSettings()
    # every dense search is re-run exactly by the recall monitor (sample rate 1): its figures show the scope
    settings = Settings(data_dir=data, store=store, monitor={"sample_rate": 1.0}, rerank={"budget_ms": 60_000})
    quarry = Quarry(settings, embedder=counting, reranker=reranker)
    suffix = secrets.token_hex(3)
    keys = {t: _admin(quarry.docstore, f"{t}{suffix}") for t in ("ta", "tb")}
    keys["op"] = _key(quarry.docstore, DEFAULT_TENANT)  # the operator: creates shared collections
    name = f"docs_{suffix}"  # unique: the pgvector database is shared with other runs
    try:
        with TestClient(create_app(quarry)) as c:
            yield c, keys, name
            for key in keys.values():
                c.delete(f"/v1/collections/{name}", headers=_h(key))
            c.delete(f"/v1/collections/only_b_{suffix}", headers=_h(keys["tb"]))
            c.delete(f"/v1/collections/shared_{suffix}", headers=_h(keys["op"]))
    finally:
        quarry.close()


def _admin(state: StateStore, tenant: str) -> str:
    state.create_tenant(tenant, tenant)
    return _key(state, tenant)


def _key(state: StateStore, tenant: str) -> str:
    key, record = new_key(tenant, ["read", "write", "admin"])
    state.insert_api_key(record)
    return key


def _h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _texts(resp: object) -> list[str]:
    assert resp.status_code == 200, resp.text  # type: ignore[attr-defined]
    return [h["text"] for h in resp.json()["hits"]]  # type: ignore[attr-defined]


def test_two_tenants_same_names_every_path(client: tuple[TestClient, dict[str, str], str]) -> None:
    c, keys, name = client
    a, b = _h(keys["ta"]), _h(keys["tb"])
    suffix = name.removeprefix("docs_")
    for headers, text in ((a, A_TEXT), (b, B_TEXT)):
        assert c.post("/v1/collections", json={"name": name}, headers=headers).status_code == 201
        docs = [{"id": "d1", "text": text, "metadata": {"year": 2020}}, {"id": "d2", "text": SAME}]
        resp = c.post(f"/v1/collections/{name}/documents", json={"documents": docs}, headers=headers)
        assert resp.status_code == 200, resp.text
    only_b = f"only_b_{suffix}"
    assert c.post("/v1/collections", json={"name": only_b}, headers=b).status_code == 201

    # list, describe: A sees its own only; B's private collection is 404 like a missing one
    listed = [x["name"] for x in c.get("/v1/collections", headers=a).json()["collections"]]
    assert listed == [name]
    assert c.get(f"/v1/collections/{name}", headers=a).json()["documents"] == 2
    missing = c.get(f"/v1/collections/nope_{suffix}", headers=a)
    foreign = c.get(f"/v1/collections/{only_b}", headers=a)
    assert foreign.status_code == missing.status_code == 404
    assert foreign.json()["error"]["type"] == "CollectionNotFound"
    assert c.post(f"/v1/collections/{only_b}/search", json={"query": "x"}, headers=a).status_code == 404

    # every retrieval mode: A's query for B's words finds A's documents only, and the reverse
    for mode in ("bm25", "dense", "hybrid"):
        for headers, mine, theirs in ((a, A_TEXT, B_TEXT), (b, B_TEXT, A_TEXT)):
            body = {"query": "bananas blueberries plantation apples orchard weather", "mode": mode, "top_k": 10}
            texts = _texts(c.post(f"/v1/collections/{name}/search", json=body, headers=headers))
            assert texts and theirs not in texts and set(texts) <= {mine, SAME}, (mode, texts)
            filtered = {**body, "filters": {"year": 2020}}
            assert _texts(c.post(f"/v1/collections/{name}/search", json=filtered, headers=headers)) == [mine]

    # the recall monitor's exact re-runs of the dense searches, each in its tenant's collection
    # (TenantStore had no search_exact: every re-run failed and the figures stayed empty)
    for headers in (a, b):
        assert _recalls(c, f"/v1/collections/{name}/recall", headers) == [1.0]

    # rerank: the cross-encoder rescoring the fused candidates sees the tenant's only
    for headers, mine in ((a, A_TEXT), (b, B_TEXT)):
        body = {"query": "bananas apples weather", "mode": "hybrid", "top_k": 5, "rerank": {"top_n": 10}}
        resp = c.post(f"/v1/collections/{name}/search", json=body, headers=headers)
        assert resp.json()["reranked"] is True, resp.text
        assert set(_texts(resp)) == {mine, SAME}

    # the answer path's retrieval (no LLM configured: sources only)
    resp = c.post(f"/v1/collections/{name}/answer", json={"query": "banana plantation report"}, headers=a)
    assert resp.status_code == 200, resp.text
    assert B_TEXT not in resp.text

    # documents by id and listed, recall, reindex and its job: each tenant its own
    for headers, mine in ((a, A_TEXT), (b, B_TEXT)):
        doc = c.get(f"/v1/collections/{name}/documents/d1", headers=headers)
        assert doc.status_code == 200 and doc.json()["text"] == mine, doc.text
        listed_docs = c.get(f"/v1/collections/{name}/documents", headers=headers).json()["documents"]
        assert [d["id"] for d in listed_docs] == ["d1", "d2"]
    for path in (f"/v1/collections/{only_b}/documents/d1", f"/v1/collections/{only_b}/recall"):
        assert c.get(path, headers=a).status_code == 404, path
    assert c.post(f"/v1/collections/{only_b}/reindex", json={}, headers=a).status_code == 404
    job = c.post(f"/v1/collections/{only_b}/reindex", json={}, headers=b)
    assert job.status_code == 202, job.text
    job_url = f"/v1/jobs/{job.json()['id']}"
    assert c.get(job_url, headers=a).status_code == 404  # another tenant's job is not there for A
    deadline = time.monotonic() + 120
    while c.get(job_url, headers=b).json()["state"] not in ("done", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)

    # delete by id: A's delete of d1 leaves B's d1
    resp = c.post(f"/v1/collections/{name}/documents/delete", json={"ids": ["d1"]}, headers=a)
    assert resp.status_code == 200 and resp.json()["deleted"] == 1
    assert c.get(f"/v1/collections/{name}", headers=a).json()["documents"] == 1
    assert c.get(f"/v1/collections/{name}", headers=b).json()["documents"] == 2
    body = {"query": "bananas plantation", "mode": "hybrid"}
    assert B_TEXT in _texts(c.post(f"/v1/collections/{name}/search", json=body, headers=b))
    # delete by filter: A's filter deletes A's matching documents only; naming a tenant is no way out
    _error(c.post(f"/v1/collections/{name}/documents/delete", json={"filters": {"tenant_id": "x"}}, headers=a),
           400, "InvalidFilter")
    resp = c.post(f"/v1/collections/{name}/documents/delete", json={"filters": {"year": {"$gte": 0}}}, headers=b)
    assert resp.status_code == 200 and resp.json()["deleted"] == 1, resp.text  # B's d1
    assert c.get(f"/v1/collections/{name}", headers=a).json()["documents"] == 1
    assert [d["id"] for d in c.get(f"/v1/collections/{name}/documents", headers=b).json()["documents"]] == ["d2"]
    resp = c.post(f"/v1/collections/{name}/documents/delete", json={"filters": {"document_id": "d2"}}, headers=a)
    assert resp.status_code == 200 and resp.json()["deleted"] == 1, resp.text
    assert c.get(f"/v1/collections/{name}", headers=a).json()["documents"] == 0
    assert c.get(f"/v1/collections/{name}", headers=b).json()["documents"] == 1
    # drop: A's drop leaves B's collection of the same name
    assert c.delete(f"/v1/collections/{name}", headers=a).status_code == 200
    assert c.get(f"/v1/collections/{name}", headers=b).json()["documents"] == 1


def test_a_key_of_an_unknown_tenant_fails_closed(client: tuple[TestClient, dict[str, str], str]) -> None:
    c = client[0]
    quarry: Quarry = c.app.state.quarry  # type: ignore[attr-defined]
    key, record = new_key(f"ghost{secrets.token_hex(2)}", ["read"])
    quarry.docstore.insert_api_key(record)  # a key whose tenant row does not exist
    resp = c.get("/v1/collections", headers=_h(key))
    assert resp.status_code == 403 and resp.json()["error"]["type"] == "Forbidden"
    assert "not known" in resp.json()["error"]["message"]


def test_a_shared_collection_hit_explains_with_the_caller_ids(client: tuple[TestClient, dict[str, str], str]) -> None:
    """A hit's ``explain`` named each channel's chunk by its stored id (``T/d1:0:…``), unlike the hit itself.

    Found 2026-12-03 (h-attack): ``ScopedQuarry._hit`` took the tenant prefix off ``document_id`` and
    ``chunk_id`` but not off ``explain.dense.chunk_id``/``explain.bm25.chunk_id``, so a hybrid hit
    showed the storage scheme (``ta…/d1:0:…``) the docs say a tenant never sees.
    """
    c, keys, name = client
    a, op = _h(keys["ta"]), _h(keys["op"])
    shared = f"explain_{name.removeprefix('docs_')}"
    url = f"/v1/collections/{shared}"
    assert c.post("/v1/collections", json={"name": shared, "tenancy": "shared"}, headers=op).status_code == 201
    try:
        resp = c.post(f"{url}/documents", json={"documents": [{"id": "d1", "text": A_TEXT}]}, headers=a)
        assert resp.status_code == 200, resp.text
        for mode in ("bm25", "dense", "hybrid"):
            body = {"query": "apple orchard harvests", "mode": mode}
            hits = c.post(f"{url}/search", json=body, headers=a).json()["hits"]
            assert hits and hits[0]["document_id"] == "d1", (mode, hits)
            channels = {k: v for k, v in hits[0]["explain"].items() if isinstance(v, dict) and "chunk_id" in v}
            assert channels and {v["chunk_id"] for v in channels.values()} == {hits[0]["chunk_id"]}, (mode, hits[0])
            assert hits[0]["chunk_id"].startswith("d1:"), hits[0]
    finally:
        c.delete(url, headers=op)


def _recalls(c: TestClient, url: str, headers: dict[str, str]) -> list[float]:
    """The mean recall of each selectivity bucket with samples, once the monitor's queue is empty."""
    deadline = time.monotonic() + 60
    while (figures := c.get(url, headers=headers).json())["queued"] or not any(
        bucket["samples"] for bucket in figures["buckets"].values()
    ):
        assert time.monotonic() < deadline, figures
        time.sleep(0.2)
    return sorted({bucket["mean_recall"] for bucket in figures["buckets"].values() if bucket["samples"]})


def _error(resp: object, status: int, kind: str) -> str:
    assert resp.status_code == status, resp.text  # type: ignore[attr-defined]
    error = resp.json()["error"]  # type: ignore[attr-defined]
    assert error["type"] == kind, error
    return str(error["message"])


def test_a_shared_collection_scopes_every_path_to_the_key_tenant(  # noqa: C901, PLR0915 - one scenario, in order
    client: tuple[TestClient, dict[str, str], str],
) -> None:
    c, keys, name = client
    a, b, op = _h(keys["ta"]), _h(keys["tb"]), _h(keys["op"])
    suffix = name.removeprefix("docs_")
    shared, tenant_b = f"shared_{suffix}", f"tb{suffix}"
    url = f"/v1/collections/{shared}"

    # only the operator's tenant creates one; its name is then nobody's own
    _error(c.post("/v1/collections", json={"name": shared, "tenancy": "shared"}, headers=a), 403, "Forbidden")
    created = c.post("/v1/collections", json={"name": shared, "tenancy": "shared"}, headers=op)
    assert created.status_code == 201 and created.json()["tenancy"] == "shared", created.text
    _error(c.post("/v1/collections", json={"name": shared}, headers=a), 409, "CollectionExists")

    # writes: the same ids and a shared text in both tenants; a document naming a tenant is refused
    for headers, text in ((a, A_TEXT), (b, B_TEXT)):
        docs = [{"id": "d1", "text": text, "metadata": {"year": 2020}}, {"id": "d2", "text": SAME}]
        resp = c.post(f"{url}/documents", json={"documents": docs}, headers=headers)
        assert resp.status_code == 200 and resp.json()["added"] == 2, resp.text
    forged = [{"id": "d9", "text": B_TEXT, "metadata": {"tenant_id": tenant_b}}]
    _error(c.post(f"{url}/documents", json={"documents": forged}, headers=a), 400, "InvalidDocument")
    # an ingest job writes through the key's scope too (its tenant is kept in the job for a resume)
    upload = c.post(f"{url}/jobs", content=b'{"id": "d7", "text": "Seven sailors share one raft at dusk."}\n',
                    headers={**a, "Content-Type": "application/x-ndjson"})
    assert upload.status_code == 202, upload.text
    job_id = upload.json()["id"]
    deadline = time.monotonic() + 120
    while (job := c.get(f"/v1/jobs/{job_id}", headers=a).json())["state"] not in ("done", "partial", "failed"):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    assert job["state"] == "done" and job["counters"]["added"] == 1, job
    _error(c.get(f"/v1/jobs/{job_id}", headers=b), 404, "NotFound")  # another tenant's job
    seven = c.get(f"{url}/documents/d7", headers=a)
    assert seven.status_code == 200 and seven.json()["metadata"] == {}, seven.text  # no tenant_id shown
    _error(c.get(f"{url}/documents/d7", headers=b), 404, "NotFound")
    assert c.delete(f"{url}/documents/d7", headers=a).json()["deleted"] == 1

    # list and describe: both see it, each counts its own documents, chunks and vectors
    for headers in (a, b):
        listed = {x["name"]: x["tenancy"] for x in c.get("/v1/collections", headers=headers).json()["collections"]}
        assert listed[shared] == "shared"
        described = c.get(url, headers=headers).json()
        assert (described["documents"], described["chunks"], described["vectors"]) == (2, 2, 2), described

    # every retrieval mode: A's query for B's words finds A's documents only, ids as A wrote them
    words = "bananas blueberries plantation apples orchard weather"
    for mode in ("bm25", "dense", "hybrid"):
        for headers, mine, theirs in ((a, A_TEXT, B_TEXT), (b, B_TEXT, A_TEXT)):
            body = {"query": words, "mode": mode, "top_k": 10}
            resp = c.post(f"{url}/search", json=body, headers=headers)
            texts = _texts(resp)
            assert texts and theirs not in texts and set(texts) <= {mine, SAME}, (mode, texts)
            assert {h["document_id"] for h in resp.json()["hits"]} <= {"d1", "d2"}
            assert all("tenant_id" not in h["metadata"] for h in resp.json()["hits"])
            filtered = {**body, "filters": {"year": 2020}}
            assert _texts(c.post(f"{url}/search", json=filtered, headers=headers)) == [mine]
            by_id = {**body, "filters": {"document_id": "d1"}}
            assert _texts(c.post(f"{url}/search", json=by_id, headers=headers)) == [mine]

    # rerank within the tenant
    for headers, mine in ((a, A_TEXT), (b, B_TEXT)):
        body = {"query": "bananas apples weather", "mode": "hybrid", "top_k": 5, "rerank": {"top_n": 10}}
        resp = c.post(f"{url}/search", json=body, headers=headers)
        assert resp.json()["reranked"] is True, resp.text
        assert set(_texts(resp)) == {mine, SAME}
    # the recall monitor re-ran each dense search exactly, within its tenant: an unscoped re-run
    # would find the other tenant's two chunks too, and recall@10 would read 0.5
    assert _recalls(c, f"{url}/recall", op) == [1.0]

    # a filter naming the tenant field, to widen or to switch tenant, is refused in every form
    for flt in ({"tenant_id": tenant_b}, {"$or": [{"year": 2020}, {"tenant_id": {"$exists": True}}]},
                {"tenant_id": {"$ne": "nobody"}}):
        for mode in ("bm25", "hybrid"):
            body = {"query": words, "mode": mode, "filters": flt}
            _error(c.post(f"{url}/search", json=body, headers=a), 403, "Forbidden")
        _error(c.post(f"{url}/documents/delete", json={"filters": flt}, headers=a), 403, "Forbidden")

    # the answer path's retrieval (no LLM here: sources only)
    resp = c.post(f"{url}/answer", json={"query": "banana plantation report"}, headers=a)
    assert resp.status_code == 200 and B_TEXT not in resp.text, resp.text

    # get and list by id: each tenant its own d1; the operator's tenant sees none of theirs
    for headers, mine in ((a, A_TEXT), (b, B_TEXT)):
        doc = c.get(f"{url}/documents/d1", headers=headers)
        assert doc.status_code == 200 and doc.json()["text"] == mine and doc.json()["id"] == "d1", doc.text
        assert "tenant_id" not in doc.json()["metadata"]
        assert [d["id"] for d in c.get(f"{url}/documents", headers=headers).json()["documents"]] == ["d1", "d2"]
    page = c.get(f"{url}/documents", params={"limit": 1}, headers=a).json()
    assert [d["id"] for d in page["documents"]] == ["d1"] and page["next_cursor"] == "d1"
    nxt = c.get(f"{url}/documents", params={"limit": 1, "cursor": "d1"}, headers=a).json()
    assert [d["id"] for d in nxt["documents"]] == ["d2"] and nxt["next_cursor"] is None
    assert c.get(url, headers=op).json()["documents"] == 0
    assert c.get(f"{url}/documents", headers=op).json()["documents"] == []
    _error(c.get(f"{url}/documents/d1", headers=op), 404, "NotFound")

    # reindex, rollback, drop and the recall figures are the operator's
    for method, path in (("post", "/reindex"), ("post", "/rollback"), ("delete", ""), ("get", "/recall")):
        _error(getattr(c, method)(f"{url}{path}", headers=a), 403, "Forbidden")
    assert c.get(f"{url}/recall", headers=op).status_code == 200

    # delete by id and by filter: A's deletes never touch B's documents of the same ids
    resp = c.post(f"{url}/documents/delete", json={"ids": ["d1"]}, headers=a)
    assert resp.status_code == 200 and resp.json()["deleted"] == 1, resp.text
    assert c.get(f"{url}/documents/d1", headers=b).json()["text"] == B_TEXT
    _error(c.get(f"{url}/documents/d1", headers=a), 404, "NotFound")
    resp = c.post(f"{url}/documents/delete", json={"filters": {"document_id": {"$in": ["d1", "d2"]}}}, headers=a)
    assert resp.status_code == 200 and resp.json()["deleted"] == 1, resp.text
    assert c.get(url, headers=a).json()["documents"] == 0
    assert c.get(url, headers=b).json()["documents"] == 2
    for mode in ("bm25", "dense", "hybrid"):
        assert _texts(c.post(f"{url}/search", json={"query": words, "mode": mode}, headers=a)) == []
        assert set(_texts(c.post(f"{url}/search", json={"query": words, "mode": mode}, headers=b))) == {B_TEXT, SAME}
    resp = c.post(f"{url}/documents/delete", json={"filters": {"year": 2020}}, headers=b)
    assert resp.status_code == 200 and resp.json()["deleted"] == 1, resp.text
    assert [d["id"] for d in c.get(f"{url}/documents", headers=b).json()["documents"]] == ["d2"]

    # the operator reindexes it for everyone: each tenant still sees only its own afterwards
    job = c.post(f"{url}/reindex", json={}, headers=op)
    assert job.status_code == 202, job.text
    deadline = time.monotonic() + 120
    while (state := c.get(f"/v1/jobs/{job.json()['id']}", headers=op).json()["state"]) not in ("done", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert state == "done"
    assert _texts(c.post(f"{url}/search", json={"query": words, "mode": "dense"}, headers=b)) == [SAME]
    assert _texts(c.post(f"{url}/search", json={"query": words, "mode": "dense"}, headers=a)) == []


ASK = {"top_k": 2, "max_tokens": 8, "temperature": 0, "seed": 3, "context_tokens": 200}
QUESTION = "What does the report say about the harvests?"


@pytest.fixture(scope="module")
def answering(
    tmp_path_factory: pytest.TempPathFactory, counting: CountingEmbedder
) -> Iterator[tuple[TestClient, dict[str, str], str]]:
    """Milvus Lite and the real llama.cpp server: the semantic cache is in-process, whatever the store."""
    require_llama()
    llm = llama_settings(structured="off")  # free text: a few tokens of answer (JSON would spend them on its keys)
    quarry = Quarry(Settings(data_dir=tmp_path_factory.mktemp("tenants-llm"), llm=llm), embedder=counting)
    suffix = secrets.token_hex(3)
    keys = {t: _admin(quarry.docstore, f"{t}{suffix}") for t in ("ta", "tb")}
    keys["op"] = _key(quarry.docstore, DEFAULT_TENANT)
    low, record = new_key(f"ta{suffix}", ["read"], priority="low")
    quarry.docstore.insert_api_key(record)
    keys["ta_low"] = low
    try:
        with TestClient(create_app(quarry)) as c:
            yield c, keys, suffix
    finally:
        quarry.close()


@pytest.mark.integration
def test_answer_cache_hits_never_cross_tenants(
    answering: tuple[TestClient, dict[str, str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, keys, suffix = answering
    a, b, op = _h(keys["ta"]), _h(keys["tb"]), _h(keys["op"])
    shared, own = f"shared_{suffix}", f"own_{suffix}"
    assert c.post("/v1/collections", json={"name": shared, "tenancy": "shared"}, headers=op).status_code == 201
    for headers, text, threshold in ((a, A_TEXT, 0.97), (b, B_TEXT, None)):  # A's own cache threshold
        body = {"name": own, "cache_threshold": threshold} if threshold else {"name": own}
        assert c.post("/v1/collections", json=body, headers=headers).status_code == 201
        for name in (shared, own):
            docs = [{"id": "d1", "text": text}]
            resp = c.post(f"/v1/collections/{name}/documents", json={"documents": docs}, headers=headers)
            assert resp.status_code == 200, resp.text

    def ask(name: str, headers: dict[str, str]) -> dict[str, Any]:
        resp = c.post(f"/v1/collections/{name}/answer", json={"query": QUESTION, **ASK}, headers=headers)
        assert resp.status_code == 200, resp.text
        out: dict[str, Any] = resp.json()
        return out

    # the same question, the same collection name (and in the shared one, the same collection):
    # A's stored answer is a hit for A only; B's first ask is a miss answered from B's documents,
    # whose reason and similarity say nothing of A's entries (B's scope is empty: no cosine shown)
    default = c.app.state.quarry.settings.cache.threshold  # type: ignore[attr-defined]
    for name in (shared, own):
        first = ask(name, a)
        assert first["cache"] == "miss" and first["answer"], first
        mine = ask(name, a)
        assert mine["cache"] == "hit" and mine["cache_threshold"] == (0.97 if name == own else default), mine
        theirs = ask(name, b)
        assert theirs["cache"] == "miss" and theirs["cache_reason"] == "empty", theirs
        assert "cache_similarity" not in theirs
        assert [s["text"] for s in theirs["sources"]] == [B_TEXT] and A_TEXT not in str(theirs)
        again = ask(name, b)
        assert again["cache"] == "hit" and [s["text"] for s in again["sources"]] == [B_TEXT]
        assert again["cache_threshold"] == default  # B's own collection has no threshold of its own
        assert [s["text"] for s in ask(name, a)["sources"]] == [A_TEXT]
    described = {t: c.get(f"/v1/collections/{own}", headers=h).json() for t, h in (("a", a), ("b", b))}
    assert described["a"]["cache_threshold"] == 0.97 and described["b"]["cache_threshold"] is None

    # shed (saturated, low priority): A's cached answer is served; a question with no entry is a 503
    gate = c.app.state.access  # type: ignore[attr-defined]
    monkeypatch.setattr(gate.settings, "shed_in_flight", 4)
    monkeypatch.setattr(metrics.IN_FLIGHT, "count", 10)
    low = _h(keys["ta_low"])
    hit = ask(shared, low)
    assert hit["cache"] == "hit" and [s["text"] for s in hit["sources"]] == [A_TEXT]
    resp = c.post(f"/v1/collections/{shared}/answer", json={"query": "Who sails the boats at dawn?", **ASK},
                  headers=low)
    assert resp.status_code == 503 and resp.json()["error"]["type"] == "Overloaded", resp.text
    assert resp.headers["retry-after"] == "1"


@pytest.mark.parametrize("tenant", ["", "Acme", "a/b", SHARED, "x" * 40, "a__b"])  # a__b: see stored_field
def test_a_shared_scope_without_a_valid_tenant_fails_closed(tenant: str) -> None:
    with pytest.raises(Forbidden, match="refusing an unscoped request"):
        scoped(cast(Engines, None), tenant)  # refused before the shared view is even read


def test_a_filter_naming_the_tenant_field_is_refused_at_any_depth() -> None:
    refuse_tenant_field({"year": 2020, "$and": [{"tag": "a"}, {"$or": [{"b": 1}]}]})  # no tenant: fine
    for flt in ({"tenant_id": "x"}, {"$or": [{"a": 1}, {"tenant_id": {"$exists": False}}]},
                {"$and": [{"$or": [{"tenant_id": {"$in": ["x", "y"]}}]}]}):
        with pytest.raises(Forbidden, match="can narrow that scope"):
            refuse_tenant_field(flt)
