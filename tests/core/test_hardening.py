"""Regression tests of issue 20 (findings 1, 8): names and ids matched whole; request size limits."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.routing import Match, Route

from embedding.sentence_transformers import SentenceTransformerEmbedder, resolve_model_path
from indexing.bm25_live import LiveBM25
from indexing.collections import NAME
from indexing.document_rules import SourceDocument, is_blank, parse_document
from indexing.sources import read_documents
from quarry.api import create_app
from quarry.api.models import SearchIn
from quarry.api.routes import ROUTERS
from quarry.api.routes.search import rerank_options_of
from quarry.errors import ECHO_CHARS, InvalidDocument, InvalidFilter, InvalidRequest, clip
from quarry.service import Quarry
from quarry.settings import BM25Settings
from stores import milvus, pgvector_sql, qdrant_common
from stores.filters import FIELD_NAME, PAYLOAD_KEY, parse_filter

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("quarry", "indexing", "retrieval", "stores", "embedding", "rerank", "eval")


@pytest.fixture(scope="module")
def client(service: Quarry) -> Iterator[TestClient]:
    with TestClient(create_app(service)) as c:
        yield c


def _error(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()["error"]
    assert set(body) == {"type", "message", "retryable"}
    return body


# --- finding 1: a pattern that ends in `$` matches before a trailing newline -------------------


def test_no_pattern_in_the_packages_ends_in_a_bare_dollar() -> None:
    """The class: `$` also matches before a final newline; names and ids anchor with `\\Z` / fullmatch."""
    found = []
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                is_re = (
                    isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                )
                if not is_re or not node.args:  # type: ignore[union-attr]
                    continue
                pattern = node.args[0]  # type: ignore[union-attr]
                parts = pattern.values if isinstance(pattern, ast.JoinedStr) else [pattern]
                tail = parts[-1] if parts else None
                if isinstance(tail, ast.Constant) and isinstance(tail.value, str) and re.search(
                    r"(?<!\\)\$\Z", tail.value
                ):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []


def test_every_name_check_refuses_a_trailing_newline() -> None:
    patterns = (NAME, FIELD_NAME, PAYLOAD_KEY, qdrant_common.NAME, milvus._NAME, pgvector_sql.COLLECTION_NAME)
    for pattern in patterns:
        assert pattern.match("docs") and not pattern.match("docs\n") and not pattern.search("docs\n"), pattern
    checks: tuple[Callable[[str], object], ...] = (
        qdrant_common.check_name, milvus._check_name, pgvector_sql.check_name,
    )
    for check in checks:
        check("docs")
        with pytest.raises(InvalidRequest, match="invalid"):
            check("docs\n")


def test_a_filter_field_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(InvalidFilter, match="invalid field name"):
        parse_filter({"year\n": 1}, {"year": "int"})


def test_document_ids_are_printable() -> None:
    for bad in ("victim\n", "a\tb", "\x7fx", "x\x85"):
        with pytest.raises(InvalidDocument, match="control character"):
            parse_document({"id": bad, "text": "t"})
    assert parse_document({"id": "ok id/with spaces", "text": "t"}).id == "ok id/with spaces"


def test_every_route_parameter_is_matched_whole() -> None:
    """A value with a trailing newline reaches a handler whole, or routes nowhere: never shortened."""
    checked = 0
    for route in (r for router in ROUTERS for r in router.routes):
        if not isinstance(route, Route) or not route.param_convertors:
            continue
        checked += 1
        path = route.path_format.format(**{p: "v\n" for p in route.param_convertors})
        for method in route.methods or ():
            match, child = route.matches({"type": "http", "path": path, "method": method})
            if match is not Match.NONE:
                values = child["path_params"].values()
                assert all(v == "v\n" for v in values), (route.path, child["path_params"])
    assert checked >= 6


def test_deleting_a_document_by_path_never_deletes_its_neighbour(client: TestClient, service: Quarry) -> None:
    """Issue 20, finding 1: DELETE .../documents/victim%0A deleted `victim`."""
    name = "h20_victim"
    assert client.post("/v1/collections", json={"name": name}).status_code == 201
    try:
        r = client.post(f"/v1/collections/{name}/documents", json={"documents": [{"id": "victim", "text": "kept"}]})
        assert r.status_code == 200, r.text
        assert "control character" in _error(
            client.post(f"/v1/collections/{name}/documents", json={"documents": [{"id": "victim\n", "text": "x"}]}),
            400,
        )["message"]
        service.upsert(name, [SourceDocument("victim\n", "a legacy id, stored before ids were checked")])
        assert client.get(f"/v1/collections/{name}").json()["documents"] == 2
        said = _error(client.delete(f"/v1/collections/{name}/documents/victim%0A"), 400)
        assert "control character (U+000A)" in said["message"] and "documents/delete" in said["message"]
        assert client.get(f"/v1/collections/{name}").json()["documents"] == 2
        r = client.post(f"/v1/collections/{name}/documents/delete", json={"ids": ["victim\n"]})
        assert r.json()["deleted"] == 1
        hits = client.post(f"/v1/collections/{name}/search", json={"query": "kept", "mode": "bm25"}).json()["hits"]
        assert [h["document_id"] for h in hits] == ["victim"]
    finally:
        client.delete(f"/v1/collections/{name}")


def test_a_collection_name_with_a_trailing_newline_is_refused(client: TestClient) -> None:
    assert client.post("/v1/collections", json={"name": "h20_docs"}).status_code == 201
    try:
        assert "invalid collection name" in _error(client.post("/v1/collections", json={"name": "h20_x\n"}), 400)[
            "message"
        ]
        _error(client.delete("/v1/collections/h20_docs%0A"), 400)
        _error(client.delete("/v1/collections/h20_docs%0A/documents/x"), 400)
        assert client.get("/v1/collections/h20_docs").status_code == 200
    finally:
        client.delete("/v1/collections/h20_docs")


# --- finding 8: limits on what one request may send ---------------------------------------------


def test_a_body_over_the_limit_is_413_before_it_is_read(
    client: TestClient, service: Quarry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service.settings.api, "max_body_bytes", 4096)
    body = '{"documents": [{"id": "a", "text": "' + "word " * 2000 + '"}]}'
    said = _error(client.post("/v1/collections/nope/documents", content=body), 413)
    assert said["type"] == "PayloadTooLarge" and "4,096 bytes" in said["message"]
    assert "QUARRY_API__MAX_BODY_BYTES" in said["message"]
    assert client.post("/v1/collections/nope/search", json={"query": "x"}).status_code == 404  # small: passes


def test_a_streamed_body_is_cut_off_at_the_limit(
    client: TestClient, service: Quarry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Content-Length (chunked): the server stops reading at the limit, it does not buffer the rest."""
    monkeypatch.setattr(service.settings.api, "max_body_bytes", 10_000)
    app = client.app
    chunks, sent = [b'{"documents": [' + b" " * 4000] * 100, []
    read = 0

    async def receive() -> dict[str, Any]:
        nonlocal read
        read += 1
        return {"type": "http.request", "body": chunks[read - 1], "more_body": read < len(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/collections/nope/documents", "raw_path": b"/v1/collections/nope/documents",
        "query_string": b"", "headers": [(b"content-type", b"application/json")], "client": ("t", 1),
        "server": ("t", 80), "root_path": "", "app": app,
    }
    asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]
    assert sent[0]["status"] == 413
    assert b"PayloadTooLarge" in b"".join(m.get("body", b"") for m in sent[1:])
    assert read == 3  # 4 kB chunks: the third passes 10 kB; the other 97 are never read


def test_documents_over_the_size_limits_are_refused(client: TestClient) -> None:
    name = "h20_sizes"
    assert client.post("/v1/collections", json={"name": name}).status_code == 201
    try:
        url = f"/v1/collections/{name}/documents"
        big = {"id": "big", "text": "word " * 200_001}
        said = _error(client.post(url, json={"documents": [{"id": "ok", "text": "fine"}, big]}), 413)
        assert said["type"] == "PayloadTooLarge" and "1,000,005 characters" in said["message"]
        assert "QUARRY_INGEST__MAX_DOCUMENT_CHARS" in said["message"]
        blob = {"id": "blob", "text": "a normal start, then " + "x" * 10_000}
        said = _error(client.post(url, json={"documents": [blob]}), 400)
        assert said["type"] == "InvalidDocument" and "over 1,024 characters at character 21" in said["message"]
        assert client.get(f"/v1/collections/{name}").json()["documents"] == 0  # nothing of either batch
        long_ok = {"id": "zh", "text": "熊猫" * 2000 + " " + "y" * 1024}  # CJK runs are not one word
        assert client.post(url, json={"documents": [long_ok]}).status_code == 200
    finally:
        client.delete(f"/v1/collections/{name}")


def test_a_client_rerank_budget_is_clamped_to_the_servers(service: Quarry) -> None:
    ask = SearchIn.model_validate({"query": "x", "rerank": {"budget_ms": 3_600_000}})
    options = rerank_options_of(service, ask)
    assert options is not None and options.budget_ms == service.settings.rerank.budget_ms == 2000
    lower = rerank_options_of(service, SearchIn.model_validate({"query": "x", "rerank": {"budget_ms": 50}}))
    assert lower is not None and lower.budget_ms == 50


# --- finding 7: a model of another dimension ---------------------------------------------------


@pytest.fixture(scope="module")
def other_dim_model(tmp_path_factory: pytest.TempPathFactory) -> SentenceTransformerEmbedder:
    """A real model of 128 dimensions saved under the packaged model's name (MiniLM plus a Dense layer)."""
    from sentence_transformers import SentenceTransformer, models

    base = SentenceTransformer(str(resolve_model_path("all-MiniLM-L6-v2")), device="cpu")
    base.append(models.Dense(384, 128))
    folder = tmp_path_factory.mktemp("models") / "all-MiniLM-L6-v2"
    base.save(str(folder))
    model = SentenceTransformerEmbedder(str(folder), device="cpu")
    model.warm_up()
    assert (model.model_id, model.dim) == ("all-MiniLM-L6-v2", 128)
    return model


def test_a_model_of_another_dimension_is_a_conflict_and_hybrid_degrades(
    service: Quarry, collection: str, other_dim_model: SentenceTransformerEmbedder
) -> None:
    """Issue 20, finding 7: every hybrid query was a 400 DimensionMismatch, the upsert a 400."""
    service.upsert(collection, [SourceDocument("ant", "ants live in colonies")])
    other = Quarry(service.settings, store=service.store, embedder=other_dim_model)
    try:
        with TestClient(create_app(other)) as client:
            url = f"/v1/collections/{collection}"
            r = client.post(f"{url}/search", json={"query": "ant colonies", "mode": "hybrid"})
            assert r.status_code == 200, r.text
            assert [h["document_id"] for h in r.json()["hits"]] == ["ant"]
            [why] = r.json()["degraded"]
            assert "holds 384-dimensional vectors; this server's model 'all-MiniLM-L6-v2' gives 128" in why
            said = _error(client.post(f"{url}/search", json={"query": "ant colonies", "mode": "dense"}), 409)
            assert said["type"] == "ModelDimensionMismatch"
            doc = {"id": "bee", "text": "bees make honey"}
            said = _error(client.post(f"{url}/documents", json={"documents": [doc]}), 409)
            assert said["type"] == "ModelDimensionMismatch" and "384" in said["message"]
            assert client.get(url).json()["documents"] == 1
    finally:
        other.docstore.close()


# --- finding 2: derived state that fails to load or disagrees with the docstore ------------------


@pytest.fixture()
def restarted(service: Quarry) -> Iterator[Callable[[], Quarry]]:
    """A second service over the same data dir and store, as after a restart (its own BM25 registry)."""
    opened: list[Quarry] = []

    def start() -> Quarry:
        opened.append(Quarry(service.settings, store=service.store, embedder=service.embedder))
        return opened[-1]

    yield start
    for other in opened:
        other.docstore.close()  # the store is the session's


def _bm25_ids(client: TestClient, name: str, query: str) -> list[str]:
    r = client.post(f"/v1/collections/{name}/search", json={"query": query, "mode": "bm25"})
    assert r.status_code == 200, r.text
    return [h["document_id"] for h in r.json()["hits"]]


def test_a_damaged_bm25_snapshot_is_rebuilt_from_the_docstore_and_logged(
    service: Quarry, collection: str, restarted: Callable[[], Quarry], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 20, finding 2: a truncated .npy made every BM25 and hybrid search a 500, /readyz ready."""
    service.upsert(collection, [SourceDocument("ant", "ants live in colonies"), SourceDocument("bee", "bees")])
    npy = service.settings.data_dir / "bm25" / collection / "postings.npz"
    npy.write_bytes(b"")  # truncated to nothing: numpy raises EOFError, which the loader did not catch
    with TestClient(create_app(restarted())) as client:
        assert client.get("/readyz").json()["status"] == "ready"
        assert _bm25_ids(client, collection, "ant colonies") == ["ant"]
        r = client.post(f"/v1/collections/{collection}/search", json={"query": "ant colonies"})
        assert r.status_code == 200 and r.json()["hits"][0]["document_id"] == "ant"
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"BM25 index of collection {collection!r}" in said and "is damaged" in said
    assert "rebuilding it from the docstore" in said
    assert LiveBM25.load(npy.parent, BM25Settings()).view().document_ids == ["ant", "bee"]  # saved again, whole


def test_a_bm25_snapshot_that_disagrees_with_the_docstore_is_rebuilt(
    service: Quarry, collection: str, restarted: Callable[[], Quarry], caplog: pytest.LogCaptureFixture
) -> None:
    """Readable, current version, but other rows than the docstore's: never served."""
    service.upsert(collection, [SourceDocument("ant", "ants live in colonies"), SourceDocument("bee", "bees")])
    sidecar = service.settings.data_dir / "bm25" / collection / "rows.json"
    rows = json.loads(sidecar.read_text())
    rows["chunk_ids"].reverse()
    rows["document_ids"].reverse()
    sidecar.write_text(json.dumps(rows))
    with TestClient(create_app(restarted())) as client:
        assert _bm25_ids(client, collection, "ant colonies") == ["ant"]
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "holds 2 rows, the docstore 2 chunks with tokens (other chunk ids); rebuilding" in said


def test_a_collection_whose_bm25_cannot_be_rebuilt_is_not_ready(
    service: Quarry, collection: str, restarted: Callable[[], Quarry]
) -> None:
    service.upsert(collection, [SourceDocument("ant", "ants live in colonies")])
    shutil.rmtree(service.settings.data_dir / "bm25" / collection)
    with sqlite3.connect(service.settings.data_dir / "docstore.sqlite") as db:  # the state of record, damaged
        db.execute(
            "UPDATE chunks SET tokens = '[\"ant' WHERE collection_id = (SELECT id FROM collections WHERE name = ?)",
            (collection,),
        )
    with TestClient(create_app(restarted())) as client:
        r = client.get("/readyz")
        assert r.status_code == 503, r.text
        assert r.json()["status"] == "collection error" and "JSONDecodeError" in r.json()["collections"][collection]


def test_document_ids_hold_no_dot_segment() -> None:
    """Review of issue 20: HTTP clients resolve dot segments (RFC 3986), so deleting document `..` with
    ``DELETE .../collections/c/documents/..`` sent ``DELETE .../collections/c`` and dropped the collection."""
    for bad in ("..", ".", "x/../..", "a/./b", "../etc", "a/.."):
        with pytest.raises(InvalidDocument, match="path segment"):
            parse_document({"id": bad, "text": "t"})
    for fine in ("...", "a..b", ".hidden", "dir/file.txt", "a/b."):
        assert parse_document({"id": fine, "text": "t"}).id == fine


def test_a_dot_segment_id_is_refused_before_a_delete_can_resolve_it_away(client: TestClient) -> None:
    name = "h20_dots"
    assert client.post("/v1/collections", json={"name": name}).status_code == 201
    try:
        said = _error(
            client.post(f"/v1/collections/{name}/documents", json={"documents": [{"id": "..", "text": "x"}]}), 400
        )
        assert said["type"] == "InvalidDocument" and "path segment" in said["message"]
        assert client.get(f"/v1/collections/{name}").json()["documents"] == 0
    finally:
        client.delete(f"/v1/collections/{name}")


def test_a_body_json_cannot_parse_is_an_invalid_request_in_the_envelope(client: TestClient) -> None:
    """Review of issue 20: deep nesting, a 5,000-digit integer or non-UTF-8 bytes were a 400 of type
    ``HTTPError`` ("There was an error parsing the body"), a type the OpenAPI and the error tree lack."""
    bodies = (
        b'{"query": "x", "filters": ' + b'{"$and": [' * 5000 + b"{}" + b"]}" * 5000 + b"}",
        b'{"query": "x", "top_k": 1' + b"0" * 5000 + b"}",
        b'{"query": "\xff\xfe"}',
    )
    for body in bodies:
        r = client.post("/v1/collections/any/search", content=body, headers={"content-type": "application/json"})
        said = _error(r, 400)
        assert said["type"] == "InvalidRequest" and "cannot be parsed" in said["message"], said


def test_a_metadata_integer_past_64_bits_is_refused_not_stored(client: TestClient) -> None:
    """Review of issue 20: ``{"n": 2**70}`` was stored, then every search returning its document was a 500
    (orjson: "Integer exceeds 64-bit range"), for every client."""
    for bad in (2**63, -(2**63) - 1, 2**70):
        with pytest.raises(InvalidDocument, match="64-bit"):
            parse_document({"id": "a", "text": "t", "metadata": {"n": bad}})
    for fine in (2**63 - 1, -(2**63), 0, True, 1e300):
        assert parse_document({"id": "a", "text": "t", "metadata": {"n": fine}}).metadata == {"n": fine}
    name = "h20_bigint"
    assert client.post("/v1/collections", json={"name": name}).status_code == 201
    try:
        doc = {"id": "big", "text": "a big number", "metadata": {"n": 2**70}}
        said = _error(client.post(f"/v1/collections/{name}/documents", json={"documents": [doc]}), 400)
        assert "64-bit" in said["message"]
        r = client.post(f"/v1/collections/{name}/search", json={"query": "big number", "mode": "bm25"})
        assert r.status_code == 200 and r.json()["hits"] == []
    finally:
        client.delete(f"/v1/collections/{name}")


def test_metadata_over_the_payload_limit_is_refused() -> None:
    """Review of issue 20: 70 KB of metadata (one value, or 3,000 fields) reached Milvus, which refused the
    64 KiB JSON payload: a 500 StoreError carrying Milvus's text; now a 400 before anything is written."""
    for meta in ({"s": "v" * 40_000}, {f"f{i}": "x" * 30 for i in range(3000)}):
        with pytest.raises(InvalidDocument, match="metadata is .* bytes as JSON; the limit is 32,768"):
            parse_document({"id": "a", "text": "t", "metadata": meta})
    assert parse_document({"id": "a", "text": "t", "metadata": {"s": "é" * 10_000}}).metadata


def test_a_body_sent_as_another_content_type_is_told_to_send_json(client: TestClient) -> None:
    """Review of issue 20: ``curl -d`` sends form data; the 422 said "Input should be a valid dictionary"."""
    for kind in ("application/x-www-form-urlencoded", "text/plain"):
        r = client.post("/v1/collections/any/search", content=b'{"query": "x"}', headers={"content-type": kind})
        said = _error(r, 422)
        assert "Content-Type: application/json" in said["message"] and kind in said["message"], said
    for kind in ("application/json; charset=utf-8", "application/vnd.api+json"):
        r = client.post("/v1/collections/any/search", content=b'{"query": 1}', headers={"content-type": kind})
        assert "query: Input should be a valid string" in _error(r, 422)["message"]


def test_a_trailing_slash_is_a_404_in_the_envelope_not_a_redirect_to_the_clients_host(
    service: Quarry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: POST .../search/ with a foreign Host answered 307 with Location: http://evil.example/...

    A foreign Host is now refused (400, quarry.api.browser); with every host allowed
    (``QUARRY_API__ALLOWED_HOSTS=*``) the trailing slash is still a 404, never a redirect.
    """
    for allowed, status, kind in (([], 400, "InvalidRequest"), (["*"], 404, "NotFound")):
        api = service.settings.api.model_copy(update={"allowed_hosts": allowed})
        monkeypatch.setattr(service, "settings", service.settings.model_copy(update={"api": api}))
        with TestClient(create_app(service)) as client:
            r = client.post(
                "/v1/collections/anything/search/", json={"query": "x"}, headers={"Host": "evil.example"},
                follow_redirects=False,
            )
        assert r.status_code == status, r.text
        assert "location" not in r.headers
        assert r.json()["error"]["type"] == kind


# --- review of issue 20, second pass: invisible queries, echoed values, stored wide integers, big files --


INVISIBLE = ("\u200b\u200b", "\u0000", "\ufeff", "\u2060", "\u202e\u2066", " \u200d\t\u00a0", "\u3164", "\ufe0f")


def test_a_query_with_no_visible_character_is_blank() -> None:
    for blank in ("", "   ", *INVISIBLE):
        assert is_blank(blank), ascii(blank)
    for visible in ("a", "\u200ba", "é", "日本", "\u0301", "  ?", "🙂"):
        assert not is_blank(visible), ascii(visible)


def test_an_invisible_query_is_refused_like_a_blank_one_in_every_mode_and_the_answer(
    client: TestClient, service: Quarry, collection: str
) -> None:
    """Review of issue 20: ``"\\u200b\\u200b"`` passed the blank check and hybrid answered arbitrary
    dense neighbours; every mode, the answer and the chat completion now refuse it as ``"   "`` is."""
    service.upsert(collection, [SourceDocument("ant", "ants live in colonies")])
    for query in ("   ", *INVISIBLE):
        for mode in ("bm25", "dense", "hybrid"):
            r = client.post(f"/v1/collections/{collection}/search", json={"query": query, "mode": mode})
            said = _error(r, 400)
            assert said["type"] == "InvalidQuery" and "must not be empty" in said["message"], (ascii(query), mode)
        said = _error(client.post(f"/v1/collections/{collection}/answer", json={"query": query}), 400)
        assert said["type"] == "InvalidQuery", ascii(query)
        chat = {"model": f"quarry/{collection}", "messages": [{"role": "user", "content": query}]}
        said = _error(client.post("/v1/chat/completions", json=chat), 400)
        assert "no user message" in said["message"], ascii(query)


def test_a_clients_value_is_echoed_in_an_error_cut_to_a_bounded_length(client: TestClient, collection: str) -> None:
    """Review of issue 20: a 10 KB rerank model name came back whole in the 400; every value a client
    controls is quoted to about :data:`ECHO_CHARS` characters, with its length."""
    long = "m" * 10_000
    search = f"/v1/collections/{collection}/search"
    requests = (
        ("POST", search, {"query": "x", "rerank": {"model": long}}, {}),
        ("POST", search, {"query": "x", "filters": {long: 1}}, {}),
        ("POST", search, {"query": "x", "filters": {"$" + long: 1}}, {}),
        ("POST", search, {"query": "x", "filters": {"document_id": {"$" + long: 1}}}, {}),
        ("POST", "/v1/collections", {"name": long}, {}),
        ("POST", "/v1/collections", {"name": "h20_lang", "language": long}, {}),
        ("POST", "/v1/chat/completions", {"model": long, "messages": [{"role": "user", "content": "x"}]}, {}),
        ("POST", search, {"query": "x", long: 1}, {}),
        ("POST", search, None, {"content-type": "text/" + "p" * 4000}),
        (
            "POST", f"/v1/collections/{collection}/documents",
            {"documents": [{"id": "a", "text": "t", "metadata": {long: {}}}]}, {},
        ),
    )
    for method, path, body, headers in requests:
        r = client.request(method, path, json=body, headers=headers, content=None if body else b"x=1")
        assert 400 <= r.status_code < 500, r.text[:300]
        message = r.json()["error"]["message"]
        assert len(message) < 2 * ECHO_CHARS + 250, (path, len(message), message[:300])
    assert clip(long) == "'" + "m" * (ECHO_CHARS - 1) + "… (10,002 characters)"
    assert clip("short") == "'short'"


def test_a_stored_integer_past_64_bits_is_served_not_a_500(
    client: TestClient, service: Quarry, collection: str
) -> None:
    """Review of issue 20: a document stored before integers were checked (``{"n": 2**70}``) made every
    search returning it a 500 (orjson: "Integer exceeds 64-bit range"); it is served as a string."""
    service.upsert(collection, [SourceDocument("big", "a big number", metadata={"n": 1, "m": 7})])
    with sqlite3.connect(service.settings.data_dir / "docstore.sqlite") as db:  # written before the check
        db.execute(
            "UPDATE chunks SET payload = ? WHERE collection_id = (SELECT id FROM collections WHERE name = ?)",
            (json.dumps({"document_id": "big", "n": 2**70, "m": 7}), collection),
        )
    for mode in ("bm25", "dense", "hybrid"):
        r = client.post(f"/v1/collections/{collection}/search", json={"query": "big number", "mode": mode})
        assert r.status_code == 200, (mode, r.text)
        assert r.json()["hits"][0]["metadata"] == {"n": str(2**70), "m": 7}


def test_a_folder_file_over_the_size_limit_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of issue 20: folder ingestion read every file whole before checking its size."""
    (tmp_path / "small.txt").write_text("ants live in colonies", encoding="utf-8")
    (tmp_path / "huge.md").write_bytes(b"x" * 41)  # 4 bytes a character at most: 41 > 4 * 10
    read: list[str] = []
    real = Path.read_text

    def spy(self: Path, *args: Any, **kwargs: Any) -> str:
        read.append(self.name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", spy)
    with pytest.raises(InvalidDocument, match=r"huge\.md: the file is 41 bytes; .* at most 10 characters"):
        read_documents(tmp_path, max_document_chars=10)
    assert "huge.md" not in read
    assert [d.id for d in read_documents(tmp_path, max_document_chars=11)] == ["huge.md", "small.txt"]
