import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from indexing.document_rules import SourceDocument
from quarry.api import create_app
from quarry.service import Quarry
from quarry.settings import Settings
from tests.core.conftest import CountingEmbedder


@pytest.fixture(scope="module")
def client(service: Quarry) -> Iterator[TestClient]:
    with TestClient(create_app(service)) as c:
        yield c


def _ingest(client: TestClient, name: str, scifact_docs: list[SourceDocument]) -> str:
    """Create ``name`` over REST and add 60 SciFact documents (metadata ``n`` = their position)."""
    assert client.post("/v1/collections", json={"name": name, "language": "en"}).status_code == 201
    docs = [
        {"id": d.id, "title": d.title, "text": d.text, "metadata": {"n": i}} for i, d in enumerate(scifact_docs[:60])
    ]
    r = client.post(f"/v1/collections/{name}/documents", json={"documents": docs})
    assert r.status_code == 200 and r.json()["added"] == 60
    return name


@pytest.fixture(scope="module")
def api_collection(client: TestClient, scifact_docs: list[SourceDocument]) -> Iterator[str]:
    """The module's collection, for tests that only read it (ingested once)."""
    yield _ingest(client, "api_docs", scifact_docs)
    client.delete("/v1/collections/api_docs")


@pytest.fixture()
def own_collection(client: TestClient, scifact_docs: list[SourceDocument]) -> Iterator[str]:
    """A fresh copy for a test that writes or deletes documents."""
    yield _ingest(client, "api_own", scifact_docs)
    client.delete("/v1/collections/api_own")


def _error(r: object, status: int) -> str:
    assert r.status_code == status, r.text  # type: ignore[attr-defined]
    body = r.json()  # type: ignore[attr-defined]
    assert set(body["error"]) == {"type", "message", "retryable"}
    return str(body["error"]["message"])


def _post_json(client: TestClient, url: str, body: object) -> object:
    """POST ``body`` as ASCII JSON: a lone surrogate travels as its ``\\udXXX`` escape, as JSON allows."""
    return client.post(url, content=json.dumps(body), headers={"content-type": "application/json"})


def test_health_ready_openapi(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json()["status"] == "ready"
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/collections/{name}/search" in paths and "/v1/collections" in paths
    assert "quarry_requests_total" in client.get("/metrics").text


def test_collection_lifecycle_and_conflicts(client: TestClient) -> None:
    assert client.post("/v1/collections", json={"name": "life"}).status_code == 201
    assert "exists" in _error(client.post("/v1/collections", json={"name": "life"}), 409)
    assert "life" in [c["name"] for c in client.get("/v1/collections").json()["collections"]]
    assert client.get("/v1/collections/life").json()["documents"] == 0
    assert client.delete("/v1/collections/life").json() == {"deleted": "life"}
    assert "does not exist" in _error(client.get("/v1/collections/life"), 404)
    assert "invalid collection name" in _error(client.post("/v1/collections", json={"name": "1-bad"}), 400)
    assert "chunk_overlap" in _error(
        client.post("/v1/collections", json={"name": "x", "chunk_size": 16, "chunk_overlap": 16}), 400
    )


def test_search_returns_relevant_hits_with_explain(
    client: TestClient, api_collection: str, scifact_docs: list[SourceDocument]
) -> None:
    target = scifact_docs[7]
    r = client.post(
        f"/v1/collections/{api_collection}/search", json={"query": target.title, "top_k": 5, "mode": "hybrid"}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["hits"][0]["document_id"] == target.id
    hit = body["hits"][0]
    assert set(hit) == {"document_id", "chunk_id", "score", "text", "metadata", "explain"}
    assert hit["metadata"] == {"n": 7} and {"bm25", "dense", "fusion"} <= set(hit["explain"])
    assert body["degraded"] == [] and body["total"] >= 5
    for mode in ("bm25", "dense"):
        r = client.post(f"/v1/collections/{api_collection}/search", json={"query": target.title, "mode": mode})
        assert r.json()["hits"][0]["document_id"] == target.id


def test_filters_and_paging_over_rest(client: TestClient, api_collection: str) -> None:
    url = f"/v1/collections/{api_collection}/search"
    r = client.post(url, json={"query": "cells", "top_k": 50, "filters": {"n": {"$lt": 10}}, "mode": "hybrid"})
    assert r.status_code == 200 and all(h["metadata"]["n"] < 10 for h in r.json()["hits"])
    full = [h["document_id"] for h in client.post(url, json={"query": "cells", "top_k": 20}).json()["hits"]]
    pages = [
        h["document_id"]
        for o in (0, 10)
        for h in client.post(url, json={"query": "cells", "top_k": 10, "offset": o}).json()["hits"]
    ]
    assert pages == full


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"query": ""}, 400, "empty"),
        ({"query": "   "}, 400, "empty"),
        ({"query": "x", "top_k": 0}, 422, "top_k"),
        ({"query": "x", "top_k": -3}, 422, "top_k"),
        ({"query": "x", "top_k": 5000}, 400, "rank_window_size"),
        ({"query": "cancer " * 1200}, 400, "query is 8,400 characters; the limit is 8,192"),
        ({"query": "x", "offset": -1}, 422, "offset"),
        ({"query": "x", "mode": "sparse"}, 422, "mode"),
        ({"query": "x", "filters": {"yeer": 1}}, 400, "unknown filter field 'yeer'"),
        ({"query": "x", "filters": {"n": "seven"}}, 400, "field 'n' holds int"),
        ({"query": "x", "filters": {"n": {"$near": 1}}}, 400, "unknown operator"),
        ({"query": "x", "unknown": 1}, 422, "unknown"),
        ({"top_k": 3}, 422, "query"),
        ({"query": "vitamin \ud800 d", "mode": "dense"}, 400, "unpaired UTF-16 surrogate ('\\ud800') at character 8"),
    ],
)
def test_bad_search_requests_get_typed_4xx(
    client: TestClient, api_collection: str, body: dict[str, object], status: int, needle: str
) -> None:
    assert needle in _error(_post_json(client, f"/v1/collections/{api_collection}/search", body), status)


def test_a_body_that_is_not_json_names_the_line_and_column(client: TestClient, api_collection: str) -> None:
    body = '{\n  "query": "vitamin d",\n  "top_k": 5\n  "mode": "bm25"\n}'
    r = client.post(
        f"/v1/collections/{api_collection}/search", content=body, headers={"content-type": "application/json"}
    )
    message = _error(r, 422)
    assert message.startswith("request body is not valid JSON: Expecting ',' delimiter at line 4, column 3"), message
    assert '"mode"' in message


def test_a_query_at_the_length_limit_is_served(client: TestClient, api_collection: str) -> None:
    query = ("vitamin d deficiency " * 400)[:8192]
    r = client.post(f"/v1/collections/{api_collection}/search", json={"query": query, "top_k": 3})
    assert r.status_code == 200, r.text
    assert len(r.json()["hits"]) == 3


def test_naming_a_rerank_model_on_a_server_without_one_is_400(client: TestClient, api_collection: str) -> None:
    body = {"query": "x", "rerank": {"model": "cross-encoder/ms-marco-MiniLM-L-6-v2"}}
    message = _error(client.post(f"/v1/collections/{api_collection}/search", json=body), 400)
    assert "is not loaded; this server has no reranker (QUARRY_RERANK__MODEL)" in message


def test_unknown_collection_is_404(client: TestClient) -> None:
    assert "'ghost' does not exist" in _error(client.post("/v1/collections/ghost/search", json={"query": "x"}), 404)
    assert _error(client.post("/v1/collections/ghost/documents", json={"documents": [{"id": "a", "text": "b"}]}), 404)


def test_bad_documents_write_nothing(client: TestClient, own_collection: str) -> None:
    url = f"/v1/collections/{own_collection}/documents"
    before = client.get(f"/v1/collections/{own_collection}").json()["documents"]
    bad_batches = [
        (
            [{"id": "ok1", "text": "fine"}, {"id": "bad", "text": "x", "metadata": {"n": "not-an-int"}}],
            400,
            "'n' holds int",
        ),
        ([{"id": "ok1", "text": "fine"}, {"id": "ok1", "text": "dup"}], 400, "documents[1]: duplicate"),
        ([{"id": "ok1", "text": "fine"}, {"id": "e", "text": "", "title": ""}], 400, "documents[1]"),
        (
            [{"id": "ok1", "text": "fine"}, {"id": "m", "text": "x", "metadata": {"bad key": 1}}],
            400,
            "invalid metadata field",
        ),
        ([{"text": "no id"}], 422, "id"),
        ([{"id": "ok1", "text": "fine"}, {"id": "s", "text": "a \udc00 b"}], 400, "documents[1]: document 's': 'text'"),
        (
            [{"id": "ok1", "text": "fine"}, {"id": "s", "text": "x", "metadata": {"tags": ["ok", "\ud83d"]}}],
            400,
            "metadata field 'tags' holds an unpaired UTF-16 surrogate",
        ),
        (
            [{"id": "ok1", "text": "fine"}, {"id": "f", "text": "x", "metadata": {"score": float("nan")}}],
            400,
            "documents[1]: document 'f': field 'score' is nan; numbers must be finite",
        ),
        ([{"id": "ok1", "text": "fine"}, {"id": "z", "text": "a\x00b"}], 400, "'text' holds a NUL character"),
        # more documents than one ingest batch (512): the store refuses the last one's id (600
        # UTF-8 bytes) in the second batch, and the first batch must not stay written
        (
            [{"id": f"many{i}", "text": f"row {i}"} for i in range(520)] + [{"id": "文" * 200, "text": "x"}],
            400,
            "bytes once encoded for Milvus",
        ),
    ]
    for docs, status, needle in bad_batches:
        assert needle in _error(_post_json(client, url, {"documents": docs}), status)
    assert client.get(f"/v1/collections/{own_collection}").json()["documents"] == before


def test_delete_documents_over_rest(
    client: TestClient, own_collection: str, scifact_docs: list[SourceDocument]
) -> None:
    doc = scifact_docs[5]
    r = client.post(f"/v1/collections/{own_collection}/documents/delete", json={"ids": [doc.id, "never-there"]})
    assert r.status_code == 200 and r.json()["deleted"] == 1
    hits = client.post(f"/v1/collections/{own_collection}/search", json={"query": doc.title, "top_k": 20}).json()[
        "hits"
    ]
    assert doc.id not in [h["document_id"] for h in hits]


def test_collection_names_differing_only_in_case_are_one_collection(client: TestClient) -> None:
    # Milvus Lite folds the case of collection names: two such collections shared one table
    assert client.post("/v1/collections", json={"name": "CaseOnly"}).status_code == 201
    message = _error(client.post("/v1/collections", json={"name": "caseonly"}), 409)
    assert "'CaseOnly' already exists; names that differ only in case" in message
    assert client.delete("/v1/collections/CaseOnly").status_code == 200
    assert client.post("/v1/collections", json={"name": "caseonly"}).status_code == 201
    assert client.delete("/v1/collections/caseonly").status_code == 200


def test_a_document_id_with_slashes_is_deleted_by_its_path(client: TestClient, own_collection: str) -> None:
    url = f"/v1/collections/{own_collection}/documents"
    assert client.post(url, json={"documents": [{"id": "notes/2024/a.md", "text": "slash id"}]}).status_code == 200
    r = client.delete(f"{url}/notes/2024/a.md")
    assert r.status_code == 200 and r.json()["deleted"] == 1


def test_router_and_unexpected_errors_use_the_error_envelope(
    client: TestClient, tmp_path: Path, counting: CountingEmbedder
) -> None:
    assert "Not Found" in _error(client.get("/v1/nowhere"), 404)
    assert _error(client.put("/v1/collections"), 405)
    broken = Quarry(Settings(data_dir=tmp_path), embedder=counting)
    try:
        broken.docstore.close()  # a real failure no handler expects: a call on a closed state store
        with TestClient(create_app(broken), raise_server_exceptions=False) as c:
            assert "internal error (ResourceClosedError)" in _error(c.get("/v1/collections/anything"), 500)
    finally:
        broken.store.close()


def test_the_openapi_documents_each_routes_errors_in_the_envelope(client: TestClient) -> None:
    from quarry.api.errors import STATUS

    schema = client.get("/openapi.json").json()
    assert set(schema["components"]["schemas"]["ErrorOut"]["properties"]) == {"error"}
    assert "HTTPValidationError" not in schema["components"]["schemas"]  # FastAPI's 422 body: never sent
    search = schema["paths"]["/v1/collections/{name}/search"]["post"]
    assert {"400", "404", "409", "413", "422", "503"} <= set(search["responses"])
    for status, response in search["responses"].items():
        if status.startswith(("4", "5")):
            assert response["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorOut"}
    assert "`ModelMismatch`" in search["responses"]["409"]["description"]
    assert "Retry-After" in search["responses"]["503"]["headers"]
    assert STATUS[next(iter(STATUS))] == 413  # the most specific InvalidRequest comes first
    for path, method in [("/v1/collections", "post"), ("/v1/collections/{name}/documents", "post")]:
        assert "413" in schema["paths"][path][method]["responses"]  # every route that takes a body
    assert "413" not in schema["paths"]["/v1/collections/{name}"]["get"]["responses"]


def test_the_openapi_types_explain_and_timings_and_keeps_implementation_notes_out(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    schemas = schema["components"]["schemas"]
    assert schemas["HitOut"]["properties"]["explain"] == {"$ref": "#/components/schemas/ExplainOut"}
    assert {"bm25", "dense", "fusion", "rerank"} <= set(schemas["ExplainOut"]["properties"])
    assert schemas["SearchOut"]["properties"]["timings_ms"] == {"$ref": "#/components/schemas/TimingsOut"}
    text = str(schema)
    for note in ("orjson", "dataclass", "hot path", ":class:", "thread", "docstore", "event loop"):
        assert note not in text, note


def test_options_and_405_name_the_paths_methods(client: TestClient) -> None:
    r = client.options("/v1/collections/anything")
    assert r.status_code == 204 and r.headers["allow"] == "DELETE, GET, HEAD, OPTIONS"
    assert client.options("/v1/collections").headers["allow"] == "GET, HEAD, OPTIONS, POST"
    r = client.put("/v1/collections/anything")
    assert r.headers["allow"] == "DELETE, GET, HEAD, OPTIONS"
    assert "allowed: DELETE, GET, HEAD, OPTIONS" in _error(r, 405)
    # the batch-delete path is its own resource, though the document route's template also fits it
    assert client.options("/v1/collections/c/documents/delete").headers["allow"] == "OPTIONS, POST"
    assert client.options("/v1/collections/c/documents/a/b").headers["allow"] == "DELETE, GET, HEAD, OPTIONS"
    assert client.options("/v1/nowhere").status_code == 404


def test_head_is_get_without_the_body(client: TestClient) -> None:
    """Review of issue 20: ``HEAD /healthz`` (load balancers, monitors) was a 405 (RFC 9110: HEAD goes with GET)."""
    for path in ("/healthz", "/readyz", "/v1/collections", "/docs"):
        got, head = client.get(path), client.head(path)
        assert head.status_code == got.status_code == 200, (path, head.status_code)
        assert head.content == b"" and head.headers["content-length"] == str(len(got.content)), path
    assert client.head("/v1/collections/nowhere_h").status_code == 404
    r = client.head("/v1/collections/c/search")  # POST only
    assert r.status_code == 405 and r.headers["allow"] == "OPTIONS, POST" and r.content == b""


def test_the_docs_page_loads_its_assets_from_this_server(client: TestClient) -> None:
    page = client.get("/docs").text
    assert "cdn" not in page.lower() and "https://" not in page
    for asset in re.findall(r'(?:src|href)="(/[^"]+\.(?:js|css))"', page):
        assert client.get(asset).status_code == 200, asset
    assert client.get("/redoc").status_code == 200 and "https://" not in client.get("/redoc").text


def test_fusion_per_request_and_as_the_collection_default(
    client: TestClient, service: Quarry, api_collection: str, scifact_docs: list[SourceDocument]
) -> None:
    """Each method answers over REST, ``explain`` shows it, and the hits are the pure fusion of the channels."""
    from retrieval.fusion import Fusion, fuse

    url = f"/v1/collections/{api_collection}/search"
    query = scifact_docs[11].title
    window = service.searcher.window
    channels = {
        c: [(h["document_id"], h["score"]) for h in client.post(url, json={"query": query, "mode": c, "top_k": window})
            .json()["hits"]]
        for c in ("bm25", "dense")
    }
    for body, setting in [
        ({}, Fusion("rrf", 60, {"bm25": 1.0, "dense": 1.0})),
        ({"method": "rrf", "k": 5, "weights": {"dense": 0.3}}, Fusion("rrf", 5, {"bm25": 1.0, "dense": 0.3})),
        *[
            ({"method": "weighted", "normalization": n, "weights": {"bm25": 0.6, "dense": 0.4}},
             Fusion("weighted", 60, {"bm25": 0.6, "dense": 0.4}, n))
            for n in ("minmax", "zscore", "dbsf")
        ],
    ]:
        r = client.post(url, json={"query": query, "top_k": 10, "fusion": body})
        assert r.status_code == 200, r.text
        hits = r.json()["hits"]
        expected = fuse(channels, setting, 10)
        assert [h["document_id"] for h in hits] == [f.id for f in expected], body
        assert [h["score"] for h in hits] == pytest.approx([f.score for f in expected]), body
        explain = hits[0]["explain"]
        assert explain["fusion"]["method"] == setting.method and explain["fusion"]["weights"] == setting.weights
        for c in expected[0].ranks:
            assert explain[c]["normalized"] == pytest.approx(expected[0].normalized[c])
        if setting.method == "weighted":
            assert explain["fusion"]["normalization"] == setting.normalization and "k" not in explain["fusion"]
    for bad in ({"method": "borda"}, {"weights": {"bm25": -1}}, {"weights": {"sparse": 1}}, {"k": 0},
                {"normalization": "l2"}, {"extra": 1}):
        _error(client.post(url, json={"query": query, "fusion": bad}), 422)

    made = client.post("/v1/collections", json={
        "name": "fused_default", "language": "en",
        "fusion": {"method": "weighted", "normalization": "dbsf", "weights": {"dense": 0.7}},
    })
    assert made.status_code == 201, made.text
    try:
        described = client.get("/v1/collections/fused_default").json()
        assert described["fusion"] == {
            "method": "weighted", "k": None, "weights": {"dense": 0.7}, "normalization": "dbsf"
        }
        docs = [{"id": d.id, "title": d.title, "text": d.text} for d in scifact_docs[:60]]
        assert client.post("/v1/collections/fused_default/documents", json={"documents": docs}).status_code == 200
        hit = client.post("/v1/collections/fused_default/search", json={"query": query}).json()["hits"][0]
        assert hit["explain"]["fusion"] | {"score": 0} == {
            "method": "weighted", "weights": {"bm25": 1.0, "dense": 0.7}, "normalization": "dbsf", "score": 0
        }
        over = client.post("/v1/collections/fused_default/search", json={"query": query, "fusion": {"method": "rrf"}})
        assert over.json()["hits"][0]["explain"]["fusion"]["k"] == 60  # the request's method over the default
    finally:
        client.delete("/v1/collections/fused_default")


def test_min_score_per_mode_and_total(
    client: TestClient, api_collection: str, scifact_docs: list[SourceDocument]
) -> None:
    """``min_score`` cuts the candidates by each mode's own score before paging; ``total`` counts what passes."""
    url = f"/v1/collections/{api_collection}/search"
    query = scifact_docs[11].title
    for mode, fusion in [("bm25", None), ("dense", None), ("hybrid", None),
                         ("hybrid", {"method": "weighted", "normalization": "minmax"})]:
        base = {"query": query, "mode": mode, "top_k": 50, "fusion": fusion}
        everything = client.post(url, json=base).json()
        scores = [h["score"] for h in everything["hits"]]
        floor = scores[4]  # the fifth hit's score: at least five pass
        cut = client.post(url, json={**base, "min_score": floor}).json()
        passing = [s for s in scores if s >= floor]
        assert [h["score"] for h in cut["hits"]] == passing, mode
        assert cut["total"] == len(passing) < everything["total"], mode
        page = client.post(url, json={**base, "min_score": floor, "top_k": 2, "offset": 2}).json()
        assert [h["document_id"] for h in page["hits"]] == [h["document_id"] for h in cut["hits"][2:4]]
        assert page["total"] == cut["total"]
        none = client.post(url, json={**base, "min_score": 1e9}).json()
        assert none["hits"] == [] and none["total"] == 0
    assert client.post(url, content='{"query": "x", "min_score": NaN}',
                       headers={"content-type": "application/json"}).status_code in (400, 422)
