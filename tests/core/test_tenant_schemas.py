"""Per-tenant metadata schemas in a shared collection, over REST (issue 27, tenant isolation).

Two tenants write the same ids into one shared collection: A writes ``secret_a`` (int) and
``price`` as an int, B writes ``secret_b`` and ``price`` as a string. On the embedded default
(Milvus Lite + SQLite), on Qdrant edge, on the Milvus server and on pgvector with the
PostgreSQL docstore: A's describe, listing, documents, hits and errors never show ``secret_b``
(nor B's tenant id or the stored keys); A's filter on ``secret_b`` is the same 400 as a filter
on a field nobody wrote; ``price`` filters work for each with its own type; BM25, dense and
hybrid answer each tenant its own documents.

Before per-tenant schemas (found 2026-12-03, docs/access.md "Known limitation"), describe showed
every tenant's field names, A's filter on ``secret_b`` was accepted, and B's first string
``price`` was refused because A had written an int one.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from indexing.docstore import DEFAULT_TENANT
from indexing.document_rules import SourceDocument
from indexing.formats import Section
from quarry.api import create_app
from quarry.errors import Forbidden, InvalidDocument, InvalidFilter
from quarry.service import Quarry
from quarry.services.namespace import stored_field
from quarry.settings import DocstoreSettings, Settings, StoreSettings
from tests.core.conftest import CountingEmbedder
from tests.core.test_tenant_isolation import _admin, _error, _h, _key

PG_URL = os.environ.get("QUARRY_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5433/quarry")
MILVUS_URL = os.environ.get("QUARRY_TEST_MILVUS_URL", "milvus://127.0.0.1:19530")
A_TEXT = "Apples and apricots: the orchard report of tenant alpha about apple harvests."
B_TEXT = "Bananas and blueberries: the plantation report of tenant beta about banana harvests."
SAME = "A shared sentence about weather forecasts that both tenants stored under the same id."
WORDS = "bananas blueberries plantation apples orchard weather forecasts"
MODES = ("bm25", "dense", "hybrid")


@pytest.fixture(scope="module", params=[
    "milvus-lite", "qdrant-edge", pytest.param("pgvector", marks=pytest.mark.integration),
    pytest.param("milvus-server", marks=pytest.mark.integration),
])
def setup(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, counting: CountingEmbedder,
) -> Iterator[tuple[TestClient, Quarry, dict[str, str], str]]:
    data: Path = tmp_path_factory.mktemp("schemas")
    with ExitStack() as stack:
        if request.param == "pgvector":
            from tests.state.conftest import pg_schema

            settings = Settings(data_dir=data, store=StoreSettings(url=PG_URL),
                                docstore=DocstoreSettings(url=stack.enter_context(pg_schema())))
        elif request.param == "milvus-server":
            settings = Settings(data_dir=data, store=StoreSettings(url=MILVUS_URL))
        elif request.param == "qdrant-edge":  # one payload index per stored key: T__m_price keyword, U__m_price float
            settings = Settings(data_dir=data, store=StoreSettings(url=f"qdrant://{data}/qdrant"))
        else:
            settings = Settings(data_dir=data)
        quarry = Quarry(settings, embedder=counting)
        stack.callback(quarry.close)
        suffix = secrets.token_hex(3)
        keys = {t: _admin(quarry.docstore, f"{t}{suffix}") for t in ("ta", "tb")}
        keys["op"] = _key(quarry.docstore, DEFAULT_TENANT)
        keys["suffix"] = suffix
        name = f"sch_{suffix}"  # unique: the pgvector database is shared with other runs
        with TestClient(create_app(quarry)) as c:
            yield c, quarry, keys, name
            c.delete(f"/v1/collections/{name}", headers=_h(keys["op"]))


def _hits(c: TestClient, url: str, headers: dict[str, str], **body: Any) -> list[dict[str, Any]]:
    resp = c.post(f"{url}/search", json={"query": WORDS, "top_k": 10, **body}, headers=headers)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["hits"])


def test_each_tenant_has_its_own_metadata_schema(  # noqa: PLR0915 - one scenario, in order
    setup: tuple[TestClient, Quarry, dict[str, str], str],
) -> None:
    c, _, keys, name = setup
    a, b, op = _h(keys["ta"]), _h(keys["tb"]), _h(keys["op"])
    tenant_b = f"tb{keys['suffix']}"
    url = f"/v1/collections/{name}"
    created = c.post("/v1/collections", json={"name": name, "tenancy": "shared"}, headers=op)
    assert created.status_code == 201, created.text
    assert created.json()["tenant_schemas"] is True and created.json()["schema"] == {"document_id": "str"}

    # the same ids; price an int for A and a string for B (refused for B before: A fixed its type)
    writes = (
        (a, [{"id": "d1", "text": A_TEXT, "metadata": {"secret_a": 7, "price": 10}},
             {"id": "d2", "text": SAME, "metadata": {"price": 20}}]),
        (b, [{"id": "d1", "text": B_TEXT, "metadata": {"secret_b": "hush", "price": "cheap"}},
             {"id": "d2", "text": SAME, "metadata": {"price": "dear"}}]),
    )
    for headers, docs in writes:
        resp = c.post(f"{url}/documents", json={"documents": docs}, headers=headers)
        assert resp.status_code == 200 and resp.json()["added"] == 2, resp.text

    # describe and listing: each tenant its own schema; the operator's tenant wrote nothing
    schemas = {"a": {"document_id": "str", "secret_a": "int", "price": "int"},
               "b": {"document_id": "str", "secret_b": "str", "price": "str"}}
    for who, headers in (("a", a), ("b", b)):
        described = c.get(url, headers=headers)
        assert described.json()["schema"] == schemas[who], described.text
        listed = c.get("/v1/collections", headers=headers)
        assert [x["schema"] for x in listed.json()["collections"] if x["name"] == name] == [schemas[who]]
        for resp in (described, listed):
            assert "__m_" not in resp.text and "tenant_id" not in resp.text
    assert c.get(url, headers=op).json()["schema"] == {"document_id": "str"}
    for resp in (c.get(url, headers=a), c.get("/v1/collections", headers=a)):
        assert "secret_b" not in resp.text and tenant_b not in resp.text

    # A's filter on B's field is the 400 of a field nobody wrote, in every mode and in a delete
    known = "known fields: document_id, price, secret_a"
    for mode in MODES:
        foreign = c.post(f"{url}/search", json={"query": WORDS, "mode": mode, "filters": {"secret_b": "hush"}},
                         headers=a)
        nobody = c.post(f"{url}/search", json={"query": WORDS, "mode": mode, "filters": {"secret_z": "hush"}},
                        headers=a)
        message = _error(foreign, 400, "InvalidFilter")
        assert message == _error(nobody, 400, "InvalidFilter").replace("secret_z", "secret_b"), message
        assert known in message and tenant_b not in message
    deleted = c.post(f"{url}/documents/delete", json={"filters": {"secret_b": {"$exists": True}}}, headers=a)
    assert known in _error(deleted, 400, "InvalidFilter")
    assert _error(
        c.post(f"{url}/search", json={"query": WORDS, "filters": {"secret_a": 7}}, headers=b), 400, "InvalidFilter"
    ).endswith("known fields: document_id, price, secret_b")

    # price: each tenant's filter with its own type, in every mode; the other type is a 400 for each
    for mode in MODES:
        assert [(h["document_id"], h["text"]) for h in _hits(
            c, url, a, mode=mode, filters={"price": {"$gte": 15}})] == [("d2", SAME)]
        assert [h["text"] for h in _hits(c, url, a, mode=mode, filters={"price": 10, "secret_a": 7})] == [A_TEXT]
        assert [h["text"] for h in _hits(c, url, b, mode=mode, filters={"price": "cheap"})] == [B_TEXT]
        assert [h["text"] for h in _hits(c, url, b, mode=mode, filters={"secret_b": {"$prefix": "hu"}})] == [B_TEXT]
        assert {h["document_id"] for h in _hits(c, url, b, mode=mode, filters={"price": {"$in": ["cheap", "dear"]}})} \
            == {"d1", "d2"}
    assert "holds int values" in _error(
        c.post(f"{url}/search", json={"query": WORDS, "filters": {"price": "cheap"}}, headers=a), 400, "InvalidFilter"
    )
    assert "numeric field" in _error(
        c.post(f"{url}/search", json={"query": WORDS, "filters": {"price": {"$gt": 1}}}, headers=b), 400,
        "InvalidFilter",
    )

    # unfiltered, every mode: each tenant's own texts, its metadata by its own names only
    for mode in MODES:
        for headers, mine, theirs, fields in ((a, A_TEXT, B_TEXT, {"secret_a", "price"}),
                                              (b, B_TEXT, A_TEXT, {"secret_b", "price"})):
            hits = _hits(c, url, headers, mode=mode)
            assert {h["text"] for h in hits} == {mine, SAME} and theirs not in str(hits), (mode, hits)
            assert set().union(*(h["metadata"] for h in hits)) == fields, (mode, hits)

    # documents: get and list show the tenant's names
    doc = c.get(f"{url}/documents/d1", headers=a).json()
    assert doc["metadata"] == {"secret_a": 7, "price": 10}, doc
    assert [ch["metadata"] for ch in doc["chunks"]] == [{"secret_a": 7, "price": 10}], doc
    listed_docs = c.get(f"{url}/documents", headers=b).json()["documents"]
    assert [d["metadata"] for d in listed_docs] == [{"secret_b": "hush", "price": "cheap"}, {"price": "dear"}]

    # a type conflict is A's own, named in A's words; B's string price does not enter it
    conflict = c.post(f"{url}/documents", json={"documents": [{"id": "d3", "text": "x", "metadata": {"price": "x"}}]},
                      headers=a)
    said = _error(conflict, 400, "InvalidDocument")
    assert "'price' holds int values" in said and "'d3'" in said, said
    assert "__m_" not in said and f"ta{keys['suffix']}" not in said, said  # not 'ta…/d3', 'ta…__m_price'
    ok = c.post(f"{url}/documents", json={"documents": [{"id": "d3", "text": "x", "metadata": {"price": 3.5}}]},
                headers=a)  # int widens to float, for A only
    assert ok.status_code == 200, ok.text
    assert c.get(url, headers=a).json()["schema"]["price"] == "float"
    assert c.get(url, headers=b).json()["schema"]["price"] == "str"

    # delete by filter on price: A's float, B's string, each its own documents
    resp = c.post(f"{url}/documents/delete", json={"filters": {"price": {"$lt": 5}}}, headers=a)
    assert resp.status_code == 200 and resp.json()["deleted"] == 1, resp.text
    resp = c.post(f"{url}/documents/delete", json={"filters": {"price": "dear"}}, headers=b)
    assert resp.status_code == 200 and resp.json()["deleted"] == 1, resp.text
    assert [d["id"] for d in c.get(f"{url}/documents", headers=a).json()["documents"]] == ["d1", "d2"]
    assert [d["id"] for d in c.get(f"{url}/documents", headers=b).json()["documents"]] == ["d1"]


def test_section_fields_are_the_tenant_s_own_too(setup: tuple[TestClient, Quarry, dict[str, str], str]) -> None:
    """A document's sections (``page``) carry its tenant's keys, and show and filter by the tenant's names."""
    c, quarry, keys, name = setup
    view = quarry.shared_view()
    if view.docstore.collection_config(name) is None:  # run alone: the REST scenario made it otherwise
        created = c.post("/v1/collections", json={"name": name, "tenancy": "shared"}, headers=_h(keys["op"]))
        assert created.status_code == 201, created.text
    tenant_a = f"ta{keys['suffix']}"
    scope = view.scoped(tenant_a)
    text = "Pears on the first page. " * 3 + "Plums on the second page. " * 3
    doc = SourceDocument("s1", text, metadata={"book": "fruit"},
                         sections=(Section(0, {"page": 1}), Section(text.index("Plums"), {"page": 2})))
    scope.upsert(name, [doc])
    hits = scope.search(name, "plums second page", mode="bm25", filters={"page": 2}).hits
    assert hits and {h.document_id for h in hits} == {"s1"}
    assert all(h.metadata == {"book": "fruit", "page": 2} for h in hits), hits
    assert scope.describe(name)["schema"]["page"] == "int"
    stored = view.docstore.list_documents(name, after=f"{tenant_a}/s", limit=1)[0]
    assert stored.metadata is not None and stored.metadata.get(stored_field(tenant_a, "book")) == "fruit"
    other = view.scoped(f"tb{keys['suffix']}")
    assert "page" not in other.describe(name)["schema"]
    with pytest.raises(InvalidDocument, match="the limit is"):  # stored keys are longer: still under Milvus's 64 KiB
        scope.upsert(name, [SourceDocument("big", "x", metadata={f"f{i}": 1 for i in range(3000)})])


def test_a_shared_collection_made_before_keeps_one_schema(
    setup: tuple[TestClient, Quarry, dict[str, str], str],
) -> None:
    """``tenant_schemas: false`` (a config stored without the field): plain keys, one schema, as before."""
    _, quarry, keys, name = setup
    old = f"{name}_old"
    view = quarry.shared_view()

    quarry.create_collection(old, shared=True)
    try:
        raw = view.docstore.collection_config(old)
        assert raw is not None and raw["tenant_schemas"] is True
        view.docstore.put_collection(old, {k: v for k, v in raw.items() if k != "tenant_schemas"})
        a, b = view.scoped(f"ta{keys['suffix']}"), view.scoped(f"tb{keys['suffix']}")
        a.upsert(old, [SourceDocument("d1", A_TEXT, metadata={"secret_a": 7})])
        stored = view.docstore.list_documents(old, after="", limit=1)[0]
        assert stored.metadata is not None and stored.metadata.get("secret_a") == 7  # the plain key
        assert [h.text for h in a.search(old, WORDS, mode="bm25", filters={"secret_a": 7}).hits] == [A_TEXT]
        assert "secret_a" in b.describe(old)["schema"]  # the limitation such a collection keeps
        assert b.search(old, WORDS, mode="bm25", filters={"secret_a": 7}).hits == []
        widen = {"$or": [{"secret_a": 7}, {"tenant_id": {"$exists": False}}]}
        for flt in ({"tenant_id": f"ta{keys['suffix']}"}, widen):
            with pytest.raises(Forbidden, match="can narrow that scope"):  # as with per-tenant schemas
                b.search(old, WORDS, mode="bm25", filters=flt)
    finally:
        view.drop_collection(old)


def test_stored_keys_never_collide_and_replay() -> None:
    """Tenant ``a_``'s ``x`` and tenant ``a``'s ``_x`` are two keys; a recorded filter on a long key replays."""
    from indexing.collections import CollectionConfig
    from quarry.services.namespace import tenant_schema
    from stores.filters import Eq, parse_filter

    assert stored_field("a_", "x") != stored_field("a", "_x")
    cfg = CollectionConfig(name="s", embedding_model="m", dim=2, chunk_size=8, chunk_overlap=0, tenancy="shared",
                           tenant_schemas=True, schema={"document_id": "str", stored_field("a_", "x"): "int",
                                                        stored_field("a", "_x"): "str", stored_field("ab", "y"): "int"})
    assert tenant_schema(cfg, "a") == {"document_id": "str", "_x": "str"}
    assert tenant_schema(cfg, "a_") == {"document_id": "str", "x": "int"}
    key = stored_field("t" * 32, "f" * 64)  # the longest: 100 characters
    assert parse_filter({key: 1}, stored=True) == Eq(key, 1)  # the recall monitor's recorded filters
    with pytest.raises(InvalidFilter, match="invalid field name"):
        parse_filter({key: 1})  # a client's field name stays within 64


def test_a_tenant_sees_no_index_plan_sized_by_every_tenant(
    setup: tuple[TestClient, Quarry, dict[str, str], str],
) -> None:
    """Describe, listing and create showed the planner's record, sized by every tenant's vectors.

    Found 2026-12-03 (h-attack2): after B wrote 2 documents and A 1, A's describe said
    ``index: {"reason": "3 vectors < 20,000: ...", "planned_for_vectors": 3, "estimated_bytes": ...}``:
    B's count. A tenant now gets no index record; the operator's tenant still sees it.
    """
    c, _, keys, name = setup
    a, b, op = _h(keys["ta"]), _h(keys["tb"]), _h(keys["op"])
    plan = f"{name}_plan"
    url = f"/v1/collections/{plan}"
    assert c.post("/v1/collections", json={"name": plan, "tenancy": "shared"}, headers=op).status_code == 201
    try:
        docs = [{"id": f"d{i}", "text": f"{B_TEXT} number {i}"} for i in range(3)]
        assert c.post(f"{url}/documents", json={"documents": docs}, headers=b).status_code == 200
        assert c.post(f"{url}/documents", json={"documents": [{"id": "d1", "text": A_TEXT}]},
                      headers=a).status_code == 200
        described = c.get(url, headers=a).json()
        assert described["vectors"] == 1 and described["documents"] == 1, described  # A's own counts
        listed = [x for x in c.get("/v1/collections", headers=a).json()["collections"] if x["name"] == plan]
        assert described["index"] == {} and [x["index"] for x in listed] == [{}], (described, listed)
        assert c.get(url, headers=op).json()["index"]["planned_for_vectors"] == 4  # the operator's to plan
    finally:
        c.delete(url, headers=op)


@pytest.mark.parametrize("per_tenant", [True, False])
def test_a_section_cannot_set_the_tenant_field(
    setup: tuple[TestClient, Quarry, dict[str, str], str], per_tenant: bool,
) -> None:
    """A section's metadata ``tenant_id`` is refused like the document's.

    Found 2026-12-03 (h-attack2): only the document's metadata was checked, and a section's
    overrides it in each chunk's payload; in a collection of one schema (``tenant_schemas:
    false``) A's document with a section ``{"tenant_id": B}`` was written with B's scope: B's
    describe counted A's vector (``vectors: 1, documents: 0``). Sections come from files (PDF pages)
    or the Python API, not from REST.
    """
    _, quarry, keys, name = setup
    view = quarry.shared_view()
    coll = f"{name}_sec{int(per_tenant)}"
    quarry.create_collection(coll, shared=True)
    try:
        if not per_tenant:
            raw = view.docstore.collection_config(coll)
            assert raw is not None
            view.docstore.put_collection(coll, {k: v for k, v in raw.items() if k != "tenant_schemas"})
        tenant_b = f"tb{keys['suffix']}"
        a, b = view.scoped(f"ta{keys['suffix']}"), view.scoped(tenant_b)
        doc = SourceDocument("inj", "Injected plums. " * 4, sections=(Section(0, {"tenant_id": tenant_b}),))
        with pytest.raises(InvalidDocument, match="'tenant_id' is set by the server"):
            a.upsert(coll, [doc])
        assert b.describe(coll)["vectors"] == 0 and a.describe(coll)["vectors"] == 0
    finally:
        view.drop_collection(coll)


def test_bm25_scores_never_move_with_another_tenant_s_documents(
    setup: tuple[TestClient, Quarry, dict[str, str], str],
) -> None:
    """A tenant's BM25 scores are those of an index of its own documents, whatever others write.

    Found 2026-12-03 (h-attack2): BM25's N, avgdl and df were the whole shared collection's, so
    tenant A's score for its own document fell from 0.298 to 0.093 when B wrote five documents
    holding ``xylophone``: A could test which words B's documents hold, and how many. Now equal
    to the score in A's own collection of the same documents, before and after B writes.
    """
    c, _, keys, name = setup
    a, b, op = _h(keys["ta"]), _h(keys["tb"]), _h(keys["op"])
    coll, own = f"{name}_idf", f"own_{keys['suffix']}"
    mine = [{"id": "d1", "text": "A xylophone in the orchard report about apples."},
            {"id": "d2", "text": "Apricots, apples and pears of the orchard."}]
    assert c.post("/v1/collections", json={"name": coll, "tenancy": "shared"}, headers=op).status_code == 201
    assert c.post("/v1/collections", json={"name": own}, headers=a).status_code == 201
    try:
        for url in (f"/v1/collections/{coll}", f"/v1/collections/{own}"):
            assert c.post(f"{url}/documents", json={"documents": mine}, headers=a).status_code == 200

        def scores(url: str, headers: dict[str, str], query: str) -> dict[str, float]:
            found = {}
            for mode in ("bm25", "hybrid"):
                for hit in _hits(c, url, headers, mode=mode, query=query):
                    if "bm25" in hit["explain"]:  # a hybrid hit found by the dense channel alone has none
                        found[f"{mode}:{hit['document_id']}"] = hit["explain"]["bm25"]["score"]
            return found

        query = "xylophone orchard apples"
        alone = scores(f"/v1/collections/{own}", a, query)
        before = scores(f"/v1/collections/{coll}", a, query)
        assert before == pytest.approx(alone) and len(before) == 4, (before, alone)
        theirs = [{"id": f"x{i}", "text": f"Xylophone number {i} of the plantation, with bananas and apples."}
                  for i in range(5)]
        assert c.post(f"/v1/collections/{coll}/documents", json={"documents": theirs}, headers=b).status_code == 200
        assert scores(f"/v1/collections/{coll}", a, query) == pytest.approx(before)
        assert set(scores(f"/v1/collections/{coll}", b, query)) == {f"{m}:x{i}" for m in ("bm25", "hybrid")
                                                                     for i in range(5)}
    finally:
        c.delete(f"/v1/collections/{coll}", headers=op)
        c.delete(f"/v1/collections/{own}", headers=a)
