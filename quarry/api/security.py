"""The OpenAPI's security, derived from the access layer's :data:`~quarry.api.access.POLICY`.

``components.securitySchemes``: ``bearer`` (``Authorization: Bearer qk_…``) and ``api-key`` (the
``api-key`` header); either one is enough. Each operation's ``security``: ``[]`` for an open
route (``/healthz``, ``/readyz``), else both schemes as alternatives, and ``x-quarry-scopes``
names the scopes of which the key needs one (a route missing from the policy: ``admin``, as the
access layer decides). Swagger UI (``/docs``, served offline by fastapi-offline) shows its
*Authorize* button from these schemes and keeps the key entered there for the session.

A server with no key yet (the open loopback demo) answers without one although the schema
names the schemes: the policy is what holds once a key exists (``docs/access.md``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from quarry.api.access import POLICY
from quarry.api.errors import flat_routes

SCHEMES: dict[str, dict[str, Any]] = {
    "bearer": {
        "type": "http", "scheme": "bearer", "bearerFormat": "qk_<id>_<secret>",
        "description": "An API key from `quarry keys create`, as `Authorization: Bearer qk_…`.",
    },
    "api-key": {
        "type": "apiKey", "in": "header", "name": "api-key",
        "description": "The same API key in the `api-key` header (as Azure OpenAI clients send it).",
    },
}
KEYED: list[dict[str, list[str]]] = [{"bearer": []}, {"api-key": []}]


def scopes_of(method: str, template: str) -> tuple[str, ...] | None:
    """The scopes of which a key needs one for a route (``None``: open), as the access layer reads POLICY."""
    needed = POLICY.get((method, template), "admin")
    if needed is None:
        return None
    return (needed,) if isinstance(needed, str) else needed


def with_security(app: FastAPI, schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (the app's OpenAPI) with the security schemes and each operation's security."""
    schema.setdefault("components", {})["securitySchemes"] = SCHEMES
    for route in flat_routes(app.router.routes):
        if not getattr(route, "include_in_schema", False):
            continue
        operations = schema.get("paths", {}).get(route.path_format, {})
        for method in route.methods or ():
            operation = operations.get(method.lower())
            if operation is None:
                continue
            scopes = scopes_of(method, route.path)
            operation["security"] = [] if scopes is None else KEYED
            if scopes is not None:
                operation["x-quarry-scopes"] = list(scopes)
                responses = operation.setdefault("responses", {})
                for status, entry in _KEYED_ERRORS.items():
                    responses.setdefault(status, entry)
    return schema


def _error(description: str, retry: bool = False) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}},
    }
    if retry:
        entry["headers"] = {"Retry-After": {"description": "Seconds to wait before retrying.",
                                            "schema": {"type": "integer"}}}
    return entry


# what the access layer answers on any keyed route (quarry.api.access.authorize)
_KEYED_ERRORS = {
    "401": _error("- `Unauthenticated`: no API key, or an unknown, malformed, expired or revoked one"),
    "403": _error("- `Forbidden`: the key lacks the route's scope (x-quarry-scopes) or the collection"),
    "429": _error("- `RateLimited`: the key's request rate or token quota is spent, or its id got too many "
                  "wrong secrets", retry=True),
}


def install(app: FastAPI) -> None:
    """Make ``app.openapi()`` carry the security (FastAPI builds the schema once, on the first call)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = with_security(app, build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
