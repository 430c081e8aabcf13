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

import pytest
from fastapi.testclient import TestClient

from indexing.docstore import StateStore
from quarry.api import create_app
from quarry.api.keys import new_key
from quarry.service import Quarry
from quarry.settings import Settings, StoreSettings
from tests.core.conftest import CountingEmbedder

PG_URL = os.environ.get("QUARRY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5433/quarry")
A_TEXT = "Apples and apricots: the orchard report of tenant alpha about apple harvests."
B_TEXT = "Bananas and blueberries: the plantation report of tenant beta about banana harvests."
SAME = "A shared sentence about weather forecasts that both tenants stored under the same id."


@pytest.fixture(scope="module", params=["milvus-lite", pytest.param("pgvector", marks=pytest.mark.integration)])
def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, counting: CountingEmbedder
) -> Iterator[tuple[TestClient, dict[str, str], str]]:
    data: Path = tmp_path_factory.mktemp("tenants")
    store = StoreSettings(url=PG_URL) if request.param == "pgvector" else StoreSettings()
    quarry = Quarry(Settings(data_dir=data, store=store), embedder=counting)
    suffix = secrets.token_hex(3)
    keys = {t: _admin(quarry.docstore, f"{t}{suffix}") for t in ("ta", "tb")}
    name = f"docs_{suffix}"  # unique: the pgvector database is shared with other runs
    try:
        with TestClient(create_app(quarry)) as c:
            yield c, keys, name
            for key in keys.values():
                c.delete(f"/v1/collections/{name}", headers=_h(key))
            c.delete(f"/v1/collections/only_b_{suffix}", headers=_h(keys["tb"]))
    finally:
        quarry.close()


def _admin(state: StateStore, tenant: str) -> str:
    state.create_tenant(tenant, tenant)
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
    # drop: A's drop leaves B's collection of the same name
    assert c.delete(f"/v1/collections/{name}", headers=a).status_code == 200
    assert c.get(f"/v1/collections/{name}", headers=b).json()["documents"] == 2


def test_a_key_of_an_unknown_tenant_fails_closed(client: tuple[TestClient, dict[str, str], str]) -> None:
    c = client[0]
    quarry: Quarry = c.app.state.quarry  # type: ignore[attr-defined]
    key, record = new_key(f"ghost{secrets.token_hex(2)}", ["read"])
    quarry.docstore.insert_api_key(record)  # a key whose tenant row does not exist
    resp = c.get("/v1/collections", headers=_h(key))
    assert resp.status_code == 403 and resp.json()["error"]["type"] == "Forbidden"
    assert "not known" in resp.json()["error"]["message"]
