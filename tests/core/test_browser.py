"""Browser-facing defaults: the Host allowlist (DNS rebinding) and the CORS policy, on the real app."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from quarry.api import create_app
from quarry.api.browser import HostPolicy
from quarry.service import Quarry
from quarry.settings import ApiSettings, Settings


@pytest.fixture()
def client(service: Quarry) -> Iterator[TestClient]:
    with TestClient(create_app(service)) as c:
        yield c


def _configure(service: Quarry, monkeypatch: pytest.MonkeyPatch, **api: object) -> None:
    """The service's settings with ``api`` fields replaced (restored after the test)."""
    settings = service.settings.model_copy(update={"api": service.settings.api.model_copy(update=api)})
    monkeypatch.setattr(service, "settings", settings)


def test_a_foreign_host_is_refused_in_the_error_envelope(client: TestClient) -> None:
    r = client.get("/healthz", headers={"host": "evil.example"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "InvalidRequest" and error["retryable"] is False
    assert "'evil.example'" in error["message"] and "QUARRY_API__ALLOWED_HOSTS" in error["message"]
    assert len(r.headers["x-request-id"]) == 32  # refused requests are observed too
    # a POST that would write is refused before it runs
    rebound = client.post("/v1/collections", json={"name": "rebound"}, headers={"host": "evil.example:8000"})
    assert rebound.status_code == 400
    assert client.get("/v1/collections/rebound").status_code == 404


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:8000", "127.0.0.1:8000", "[::1]:8000", "LOCALHOST", "testserver"]
)
def test_loopback_names_and_the_servers_own_address_are_accepted(client: TestClient, host: str) -> None:
    # "testserver" is the address this in-process client connects to (ASGI scope["server"])
    assert client.get("/healthz", headers={"host": host}).status_code == 200


def test_allowed_hosts_add_names_and_subdomain_patterns(
    service: Quarry, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    _configure(service, monkeypatch, allowed_hosts=["api", "*.example.com"])
    for host in ("api:8080", "a.example.com", "b.a.example.com:443", "localhost"):
        assert client.get("/healthz", headers={"host": host}).status_code == 200, host
    for host in ("example.com", "api.evil", "evilexample.com"):
        assert client.get("/healthz", headers={"host": host}).status_code == 400, host
    _configure(service, monkeypatch, allowed_hosts=["*"])
    assert client.get("/healthz", headers={"host": "anything.at.all"}).status_code == 200


def test_the_bind_address_is_accepted_and_a_wildcard_bind_adds_no_name() -> None:
    assert HostPolicy.from_settings(ApiSettings(host="10.1.2.3")).allows("10.1.2.3:8000", None)
    assert not HostPolicy.from_settings(ApiSettings(host="0.0.0.0")).allows("0.0.0.0:8000", None)  # noqa: S104
    assert HostPolicy.from_settings(ApiSettings(host="0.0.0.0")).allows("192.168.1.5:8000", "192.168.1.5")  # noqa: S104


def test_no_cross_origin_access_by_default(client: TestClient) -> None:
    simple = client.get("/v1/collections", headers={"origin": "https://evil.example"})
    assert simple.status_code == 200 and "access-control-allow-origin" not in simple.headers
    preflight = client.options(
        "/v1/collections/x/search",
        headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
    )
    # whatever the status, without Access-Control-Allow-* headers the browser refuses the call
    assert not [h for h in preflight.headers if h.startswith("access-control-allow")]


def test_configured_origins_may_call_the_api(
    service: Quarry, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    _configure(service, monkeypatch, cors_origins=["https://app.example"])
    ok = client.get("/v1/collections", headers={"origin": "https://app.example"})
    assert ok.headers["access-control-allow-origin"] == "https://app.example"
    assert "x-request-id" in ok.headers["access-control-expose-headers"]
    preflight = client.options(
        "/v1/collections/x/search",
        headers={
            "origin": "https://app.example", "access-control-request-method": "POST",
            "access-control-request-headers": "content-type, authorization",
        },
    )
    assert preflight.status_code == 200 and "POST" in preflight.headers["access-control-allow-methods"]
    other = client.get("/v1/collections", headers={"origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    refused = client.options(
        "/v1/collections/x/search", headers={"origin": "https://evil.example", "access-control-request-method": "POST"}
    )
    assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers


def test_the_settings_read_lists_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUARRY_API__ALLOWED_HOSTS", "api, quarry.example.com")
    monkeypatch.setenv("QUARRY_API__CORS_ORIGINS", '["https://app.example"]')
    api = Settings().api
    assert api.allowed_hosts == ["api", "quarry.example.com"] and api.cors_origins == ["https://app.example"]
    assert ApiSettings().allowed_hosts == [] and ApiSettings().cors_origins == []
