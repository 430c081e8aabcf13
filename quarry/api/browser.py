"""What a browser may do: the ``Host`` names the server answers to, and cross-origin access (CORS).

* ``Host`` allowlist. A page on ``evil.example`` whose DNS name is rebound to ``127.0.0.1`` makes
  the browser send ``Host: evil.example`` to a loopback server, which then serves that page as
  its own origin (DNS rebinding). A request whose ``Host`` names none of ``localhost``,
  ``127.0.0.1``, ``::1``, the bind address (``QUARRY_API__HOST``), the address the request
  arrived at, or ``QUARRY_API__ALLOWED_HOSTS`` (``*.example.com`` matches subdomains, ``*``
  anything) is a 400 ``InvalidRequest`` in the error envelope. A request without ``Host``
  (HTTP/1.0 tools; browsers always send one) passes.
* CORS: none by default (no ``Access-Control-Allow-*`` header, so a browser keeps other origins'
  pages from reading any answer); ``QUARRY_API__CORS_ORIGINS`` lists the origins that may, through
  Starlette's :class:`~starlette.middleware.cors.CORSMiddleware` (methods GET, POST, DELETE;
  headers ``Authorization``, ``api-key``, ``Content-Type``, ``X-Request-ID``, ``Cache-Control``,
  ``X-Quarry-Cache``; ``X-Request-ID``, ``Retry-After``, ``X-Quarry-Collection-Version`` and
  ``X-Quarry-Rollout`` readable).

Both read the settings of the app's service at its first request (``quarry serve`` builds the
service at startup).
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from quarry.api.errors import error_body
from quarry.errors import InvalidRequest, clip
from quarry.settings import ApiSettings

LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
_ANY_ADDRESS = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 - names, compared, never bound
CORS_METHODS = ("GET", "POST", "DELETE")
CORS_HEADERS = ("authorization", "api-key", "content-type", "x-request-id", "cache-control", "x-quarry-cache")
CORS_EXPOSED = ("x-request-id", "retry-after", "x-quarry-collection-version", "x-quarry-rollout")


@dataclass(frozen=True)
class HostPolicy:
    """The ``Host`` names one server answers to.

    Attributes:
        names: Exact names (lower case, no port).
        suffixes: ``.example.com`` for each ``*.example.com``.
        any: ``*`` was listed.
    """

    names: frozenset[str]
    suffixes: tuple[str, ...]
    any: bool

    @classmethod
    def from_settings(cls, api: ApiSettings) -> HostPolicy:
        """Loopback names, the bind address and ``allowed_hosts``."""
        names, suffixes = set(LOOPBACK), []
        if api.host.lower() not in _ANY_ADDRESS:
            names.add(api.host.lower().strip("[]"))
        for entry in (e.strip().lower() for e in api.allowed_hosts):
            if entry.startswith("*."):
                suffixes.append(entry[1:])
            elif entry and entry != "*":
                names.add(entry.strip("[]"))
        return cls(frozenset(names), tuple(suffixes), "*" in api.allowed_hosts)

    def allows(self, host: str, server: str | None) -> bool:
        """Whether ``host`` (a ``Host`` header's value) names this server.

        Args:
            host: ``name``, ``name:port``, ``[v6]`` or ``[v6]:port``.
            server: The address the request arrived at (ASGI ``scope["server"][0]``), if known.
        """
        if self.any:
            return True
        name = _hostname(host)
        if name in self.names or (server is not None and name == server.lower()):
            return True
        return any(name.endswith(suffix) for suffix in self.suffixes)


def _hostname(host: str) -> str:
    """``Host`` without its port and brackets, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class BrowserGuard:
    """Pure ASGI middleware: the ``Host`` allowlist (400) and the CORS policy (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._built_for: ApiSettings | None = None
        self._hosts = HostPolicy.from_settings(ApiSettings())
        self._inner: ASGIApp = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a foreign ``Host``; answer CORS where origins are configured; pass the rest on."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self._configure(scope)
        host = Headers(scope=scope).get("host")
        server = scope.get("server")
        if host is not None and not self._hosts.allows(host, server[0] if server else None):
            error = InvalidRequest(
                f"Host {clip(host)} is not a name this server answers to; add it to QUARRY_API__ALLOWED_HOSTS "
                "(refused so that a web page cannot reach this server through a rebound DNS name)"
            )
            body = error_body(type(error).__name__, error.message, error.retryable)
            await JSONResponse(body, status_code=400)(scope, receive, send)
            return
        await self._inner(scope, receive, send)

    def _configure(self, scope: Scope) -> None:
        """Build the host policy and the CORS layer from the service's settings (once per settings object)."""
        service = getattr(getattr(scope.get("app"), "state", None), "quarry", None)
        api: ApiSettings | None = getattr(getattr(service, "settings", None), "api", None)
        if api is None or api is self._built_for:
            return
        self._hosts = HostPolicy.from_settings(api)
        self._inner = self.app
        if api.cors_origins:
            self._inner = CORSMiddleware(
                self.app, allow_origins=api.cors_origins, allow_methods=CORS_METHODS, allow_headers=CORS_HEADERS,
                expose_headers=CORS_EXPOSED, max_age=600,
            )
        self._built_for = api
