"""The scope policy, its documentation, the OpenAPI and the answers agree for every route; /metrics leaks no tenant.

The app's route table is walked against ``quarry.api.access.POLICY`` (every route has an entry,
every entry a route), against the per-route scope table of ``docs/access.md`` and against the
OpenAPI's per-route ``security``; then a real server (Milvus Lite, SQLite state) with a key of
each single scope answers every route: a key whose scope the table names is never 403, any other
is 403 ``Forbidden``.

Before: ``docs/access.md`` put jobs under ``admin`` while a ``read,write`` key submitted an ingest
job (decided: ``write``, as an upsert), and ``GET /metrics`` answered without a key with every
tenant's collection names, two tenants' ``docs`` in one series.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from indexing.docstore import DEFAULT_TENANT
from quarry.api import access, create_app
from quarry.api.keys import new_key
from quarry.api.routes import ROUTERS
from quarry.service import Quarry
from quarry.settings import Settings
from tests.core.conftest import CountingEmbedder

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `(GET|POST|DELETE) (/\S*)` \| (.+?) \|$", re.M)
SCOPES = ("read", "write", "admin", "metrics")


def _routes() -> set[tuple[str, str]]:
    """(method, template) of every route that passes the access layer (the routers create_app includes)."""
    out = set()
    for router in ROUTERS:
        for route in router.routes:
            out |= {(m, getattr(route, "path", "")) for m in getattr(route, "methods", None) or ()}
    return out


def _documented() -> dict[tuple[str, str], tuple[str, ...] | None]:
    """docs/access.md's scope table: ``{(method, path): scopes or None (open)}``."""
    table = (REPO / "docs" / "access.md").read_text(encoding="utf-8")
    rows: dict[tuple[str, str], tuple[str, ...] | None] = {}
    for method, path, scope in ROW.findall(table):
        rows[(method, path)] = None if scope == "open" else tuple(re.findall(r"`(\w+)`", scope))
    return rows


def _template(path: str) -> str:
    return path.replace("{document_id}", "{document_id:whole}").replace("{model}", "{model:whole}")


def test_every_route_has_a_policy_entry_and_every_entry_a_route() -> None:
    routes = _routes()
    assert routes == set(access.POLICY), routes ^ set(access.POLICY)


def test_the_docs_scope_table_is_the_policy() -> None:
    documented = {(m, _template(p)): s for (m, p), s in _documented().items()}
    policy = {k: (v,) if isinstance(v, str) else v for k, v in access.POLICY.items()}
    assert documented == policy, set(documented.items()) ^ set(policy.items())


def test_the_openapi_security_is_the_policy() -> None:
    from quarry.api.security import SCHEMES

    schema = create_app(lambda: None).openapi()  # type: ignore[arg-type, return-value]
    assert schema["components"]["securitySchemes"] == SCHEMES
    assert SCHEMES["bearer"]["scheme"] == "bearer" and SCHEMES["api-key"] == {**SCHEMES["api-key"], "in": "header",
                                                                                "name": "api-key", "type": "apiKey"}
    checked = 0
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            needed = access.POLICY[(method.upper(), _template(path))]
            if needed is None:
                assert operation["security"] == [], (method, path)
            else:
                assert operation["security"] == [{"bearer": []}, {"api-key": []}], (method, path)
                assert operation["x-quarry-scopes"] == ([needed] if isinstance(needed, str) else list(needed))
                assert {"401", "403", "429"} <= set(operation["responses"]), (method, path)
            checked += 1
    hidden = {(m, r.path) for router in ROUTERS for r in router.routes if not getattr(r, "include_in_schema", True)
              for m in getattr(r, "methods", None) or ()}
    # /metrics and the console's static files: left out of the OpenAPI
    assert hidden == {("GET", "/metrics"), ("GET", "/console"), ("GET", "/console/console.js"),
                      ("GET", "/console/console.css")}
    assert checked == len(access.POLICY) - len(hidden)


def test_swagger_ui_is_served_offline_with_its_authorize_kept() -> None:
    client = TestClient(create_app(lambda: None))  # type: ignore[arg-type, return-value]  # no lifespan
    page = client.get("/docs").text
    assert "cdn" not in page.lower() and "/static-offline-docs/swagger-ui-bundle.js" in page
    assert '"persistAuthorization": true' in page


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, counting: CountingEmbedder) -> Iterator[tuple[TestClient, Quarry]]:
    quarry = Quarry(Settings(data_dir=tmp_path_factory.mktemp("scopes")), embedder=counting)
    try:
        with TestClient(create_app(quarry)) as client:
            yield client, quarry
    finally:
        quarry.close()


def _key(quarry: Quarry, tenant: str, scopes: list[str]) -> dict[str, str]:
    if tenant not in {t for t, _ in quarry.docstore.list_tenants()}:
        quarry.docstore.create_tenant(tenant, tenant)
    key, record = new_key(tenant, scopes)
    quarry.docstore.insert_api_key(record)
    return {"Authorization": f"Bearer {key}"}


def _send(client: TestClient, method: str, path: str, headers: dict[str, str]) -> Any:
    url = path.format(
        name="nope", document_id="x", job_id="0" * 32, report_id="nope", file="summary.json", model="quarry/nope"
    )
    body = {} if method == "POST" else None
    return client.request(method, url, json=body, headers=headers)


def test_a_key_of_each_scope_gets_exactly_the_routes_the_table_gives_it(served: tuple[TestClient, Quarry]) -> None:
    client, quarry = served
    keys = {scope: _key(quarry, DEFAULT_TENANT, [scope]) for scope in SCOPES}
    for (method, path), needed in _documented().items():
        for scope, headers in keys.items():
            r = _send(client, method, path, headers)
            if needed is None or scope in needed:
                assert r.status_code != 403, (method, path, scope, r.text)
            else:
                assert r.status_code == 403 and r.json()["error"]["type"] == "Forbidden", (method, path, scope, r.text)
        if needed is not None:
            assert _send(client, method, path, {}).status_code == 401, (method, path)


def _series(text: str, name: str) -> set[tuple[str, str]]:
    return {
        (s.labels.get("tenant", ""), s.labels.get("collection", ""))
        for family in text_string_to_metric_families(text) for s in family.samples if s.name == name
    }


def test_metrics_need_the_metrics_scope_and_show_each_tenant_its_own(served: tuple[TestClient, Quarry]) -> None:
    client, quarry = served
    operator = _key(quarry, DEFAULT_TENANT, ["metrics"])
    tenants = {t: _key(quarry, t, ["read", "write", "admin"]) for t in ("acme", "beta")}
    for tenant, headers in tenants.items():
        assert client.post("/v1/collections", json={"name": "docs"}, headers=headers).status_code == 201
        r = client.post("/v1/collections/docs/documents", headers=headers,
                        json={"documents": [{"id": "d1", "text": f"the {tenant} orchard report"}]})
        assert r.status_code == 200, r.text
        r = client.post("/v1/collections/docs/search", json={"query": "orchard", "mode": "bm25"}, headers=headers)
        assert r.status_code == 200, r.text
    try:
        scraped = client.get("/metrics", headers=operator)
        assert scraped.status_code == 200
        assert {("acme", "docs"), ("beta", "docs")} <= _series(scraped.text, "quarry_stage_seconds_count")
        own = client.get("/metrics", headers=tenants["acme"]).text  # a tenant's admin: its own series
        assert ("acme", "docs") in _series(own, "quarry_stage_seconds_count")
        assert 'tenant="beta"' not in own and "quarry_requests_total" in own
        for headers in ({}, _key(quarry, "acme", ["read", "write"])):  # no key, or a key without the scope
            refused = client.get("/metrics", headers=headers)
            assert refused.status_code in (401, 403) and "docs" not in refused.text, refused.text
    finally:
        for headers in tenants.values():
            client.delete("/v1/collections/docs", headers=headers)
