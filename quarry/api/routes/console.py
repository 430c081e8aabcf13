"""The web console: ``GET /console`` and its script and style sheet, static files of the package.

The console (``quarry/api/console/``: one HTML page, one script, one style sheet; no build step,
no CDN) is a client of the REST API in the browser: it reads and writes nothing itself. The
three files are open routes (they hold no data); every call the page makes sends the key the
user entered, from the browser's ``sessionStorage``, as ``Authorization: Bearer``, and passes
the access layer as any client's (``docs/console.md``).

Every answer carries a strict Content-Security-Policy (:data:`CSP`: scripts and styles from this
origin only, no inline script or style, no plugin, no frame, no form target, no other origin to
connect to), ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer`` and
``X-Frame-Options: DENY``.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter, Response

router = APIRouter(include_in_schema=False)

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY", "Cache-Control": "no-cache",
}


@cache
def asset(name: str) -> bytes:
    """A console file's bytes (package data, read once)."""
    return resources.files("quarry.api").joinpath("console", name).read_bytes()


@router.get("/console")
def console_page() -> Response:
    """The console's page."""
    return Response(asset("index.html"), media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/console/console.js")
def console_script() -> Response:
    """The console's one script."""
    return Response(asset("console.js"), media_type="text/javascript; charset=utf-8", headers=HEADERS)


@router.get("/console/console.css")
def console_style() -> Response:
    """The console's one style sheet."""
    return Response(asset("console.css"), media_type="text/css; charset=utf-8", headers=HEADERS)
