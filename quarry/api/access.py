"""The access layer, in one place: who a request is, what it may do, and how fast.

:func:`authorize` is a dependency of every router ``create_app`` includes; for each request it

1. finds the route's required scope in :data:`POLICY` (``None``: open, as ``/healthz``; a route
   missing from the table needs ``admin``: new routes fail closed);
2. reads the key from ``Authorization: Bearer qk_…`` or ``api-key: qk_…`` and verifies it
   (:class:`~quarry.api.keys.KeyVerifier`: record read on every request, so a revoke is immediate);
   with no key sent it is 401 once any key exists (or ``QUARRY_AUTH__REQUIRED=true``), else the
   request is the open server's :data:`~quarry.api.keys.OPEN` principal (the demo);
3. checks the scope and the ``{name}`` collection against the key (403);
4. spends one request of the key's rate (:class:`RateLimiter`, the ``limits`` library; 429 with
   ``Retry-After``);
5. sheds a low-priority key's request while more than ``QUARRY_AUTH__SHED_IN_FLIGHT`` requests
   are in flight (``quarry.metrics.IN_FLIGHT``): 503 ``Overloaded`` with ``Retry-After``;

and leaves the :class:`~quarry.api.keys.Principal` in ``request.state.principal``. Handlers that
take a collection name from the body call :func:`check_collection`; admin actions call
:func:`audit`.

Counters (their names and labels are shared with the metrics work of issue 27):
``quarry_auth_failures_total{reason}``, ``quarry_rate_limited_total``, ``quarry_shed_total{priority}``.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from typing import Any

from fastapi import Request
from limits import RateLimitItem, RateLimitItemPerMinute, RateLimitItemPerSecond
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

from indexing.docstore import AuditEntry, StateStore
from quarry.api.keys import OPEN, KeyVerifier, Principal
from quarry.errors import ConfigError, Forbidden, Overloaded, RateLimited, Unauthenticated, clip
from quarry.metrics import AUTH_FAILURES, IN_FLIGHT, RATE_LIMITED, SHED
from quarry.service import Quarry
from quarry.settings import AuthSettings

log = logging.getLogger(__name__)


# (method, route template) -> scope needed; None: open to anyone who reaches the port.
# A tuple: any one of those scopes.
POLICY: dict[tuple[str, str], str | tuple[str, ...] | None] = {
    ("GET", "/healthz"): None,
    ("GET", "/readyz"): None,
    ("GET", "/metrics"): None,
    ("GET", "/v1/collections"): "read",
    ("POST", "/v1/collections"): "admin",
    ("GET", "/v1/collections/{name}"): "read",
    ("DELETE", "/v1/collections/{name}"): "admin",
    ("POST", "/v1/collections/{name}/documents"): "write",
    ("POST", "/v1/collections/{name}/documents/delete"): "write",
    ("DELETE", "/v1/collections/{name}/documents/{document_id:whole}"): "write",
    ("GET", "/v1/collections/{name}/documents"): "read",
    ("GET", "/v1/collections/{name}/documents/{document_id:whole}"): "read",
    ("GET", "/v1/collections/{name}/recall"): "read",
    ("POST", "/v1/collections/{name}/reindex"): "admin",
    ("POST", "/v1/collections/{name}/rollback"): "admin",
    # a reindex job needs admin, an ingest job write (checked by the handler, check_job); the
    # tenant is checked in Quarry.get_job, the key's collections in ingest_jobs.job_or_404
    ("GET", "/v1/jobs/{job_id}"): ("write", "admin"),
    ("DELETE", "/v1/jobs/{job_id}"): ("write", "admin"),
    ("POST", "/v1/collections/{name}/jobs"): "write",
    ("POST", "/v1/collections/{name}/search"): "read",
    ("POST", "/v1/collections/{name}/answer"): "read",
    ("POST", "/v1/chat/completions"): "read",
}


class RateLimiter:
    """Requests per second per key over a ``limits`` storage (moving window of one second).

    ``storage_uri`` is ``memory://`` (this process) or one ``limits`` names for replicas
    (``redis://host:6379``, ``memcached://host:11211``); a rate under 1/s is counted per minute.
    """

    def __init__(self, storage_uri: str = "memory://") -> None:
        """Open the storage.

        Raises:
            ConfigError: ``limits`` does not know the URI's scheme, or its driver is missing.
        """
        try:
            self.storage = storage_from_string(storage_uri)
        except Exception as exc:  # limits raises ConfigurationError / ImportError variants
            raise ConfigError(f"rate-limit storage {clip(storage_uri)}: {exc}") from exc
        self.limiter = MovingWindowRateLimiter(self.storage)
        self._items: dict[float, RateLimitItem] = {}

    def _item(self, rate: float) -> RateLimitItem:
        item = self._items.get(rate)
        if item is None:
            item = (
                RateLimitItemPerSecond(int(rate)) if rate >= 1 else RateLimitItemPerMinute(max(1, round(rate * 60)))
            )
            self._items[rate] = item
        return item

    def spend(self, key_id: str, rate: float) -> None:
        """Count one request of ``key_id`` against ``rate`` requests/s.

        Raises:
            RateLimited: The window is full; ``retry_after_s`` is when its oldest request leaves it.
        """
        item = self._item(rate)
        if self.limiter.hit(item, "quarry", key_id):
            return
        reset = self.limiter.get_window_stats(item, "quarry", key_id).reset_time
        wait = max(0.0, reset - time.time())
        RATE_LIMITED.inc()
        raise RateLimited(
            f"API key qk_{key_id}_… is limited to {rate:g} requests/s; retry in {math.ceil(wait) or 1} s",
            retry_after_s=max(wait, 1.0),
        )


class Access:
    """The access layer's state for one app: the key verifier, the rate limiter and the settings."""

    def __init__(self, state: StateStore, settings: AuthSettings, *, verifier: KeyVerifier | None = None) -> None:
        """Check keys against ``state``; rates in ``settings.rate_storage``."""
        self.state = state
        self.settings = settings
        self.verifier = verifier or KeyVerifier(state)
        self.limiter = RateLimiter(settings.rate_storage)
        self._keys_exist = False

    def keys_required(self) -> bool:
        """Whether a request must carry a key: forced by settings, or some key (even revoked) exists.

        Once true it stays true for this process (keys are never deleted, only revoked).
        """
        if self.settings.required or self._keys_exist:
            return True
        self._keys_exist = bool(self.state.list_api_keys())
        return self._keys_exist

    def principal(self, request: Request) -> Principal:
        """Who the request is (step 2 of the module doc).

        Raises:
            Unauthenticated: No key where one is required, or a bad key.
        """
        if not self.keys_required():
            # An open server ignores credentials, as vLLM without --api-key does: OpenAI clients
            # always send one ("Bearer EMPTY"), and no key can be valid while none exists.
            return OPEN
        key = _presented_key(request)
        if key is None:
            raise Unauthenticated(
                "this server requires an API key: send 'Authorization: Bearer qk_…' or 'api-key: qk_…' "
                "(create one with 'quarry keys create')",
                reason="missing",
            )
        return self.verifier.verify(key)


def _presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if auth is not None:
        kind, _, token = auth.partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            raise Unauthenticated("the Authorization header must read 'Bearer qk_…'", reason="malformed")
        return token.strip()
    return request.headers.get("api-key")


async def authorize(request: Request) -> Principal:
    """The dependency every route runs first (see the module doc).

    Raises:
        Unauthenticated: 401, see :meth:`Access.principal`.
        Forbidden: 403, the key lacks the route's scope or the ``{name}`` collection.
        RateLimited: 429, the key's rate is spent.
    """
    route = request.scope.get("route")
    template = getattr(route, "path", request.url.path)
    needed = POLICY.get((request.method, template), "admin")
    if needed is None:
        return OPEN
    access: Access = request.app.state.access
    any_of = (needed,) if isinstance(needed, str) else needed
    try:
        who = access.principal(request)
        if not who.scopes & set(any_of):
            raise Forbidden(
                f"{_who(who)} has scopes {','.join(sorted(who.scopes))}; {request.method} {template} needs "
                + " or ".join(f"'{s}'" for s in any_of)
            )
        name = request.path_params.get("name")
        if name is not None:
            _check(who, name)
    except (Unauthenticated, Forbidden) as exc:
        AUTH_FAILURES.labels(exc.reason).inc()
        raise
    if who.rate is not None and who.key_id is not None:
        access.limiter.spend(who.key_id, who.rate)
    shed_at = access.settings.shed_in_flight
    if shed_at and who.priority < 0 and IN_FLIGHT.count > shed_at:
        SHED.labels("low").inc()
        raise Overloaded(
            f"the server is saturated ({IN_FLIGHT.count} requests in flight) and sheds low-priority keys first; "
            f"retry in {access.settings.shed_retry_after_s:g} s",
            retry_after_s=access.settings.shed_retry_after_s,
        )
    request.state.principal = who
    return who


def service(request: Request) -> Quarry:
    """The service as the request's tenant sees it (:meth:`~quarry.service.Quarry.for_tenant`).

    Raises:
        Forbidden: The key's tenant is unknown (never an unscoped service).
    """
    who: Principal = getattr(request.state, "principal", OPEN)
    root: Quarry = request.app.state.quarry
    try:
        return root.for_tenant(who.tenant_id)
    except Forbidden:
        AUTH_FAILURES.labels("tenant").inc()
        raise


def check_collection(request: Request, name: str) -> None:
    """Refuse a collection named in a body (create, chat) that the request's key may not use.

    Raises:
        Forbidden: The key is limited to other collections.
    """
    who: Principal = getattr(request.state, "principal", OPEN)
    try:
        _check(who, name)
    except Forbidden:
        AUTH_FAILURES.labels("collection").inc()
        raise


def check_job(request: Request, kind: str) -> None:
    """Refuse a job of a kind the key's scopes do not cover (reindex: admin; ingest: write or admin).

    Raises:
        Forbidden: The key lacks the scope.
    """
    who: Principal = getattr(request.state, "principal", OPEN)
    any_of = {"write", "admin"} if kind == "ingest" else {"admin"}
    if not who.scopes & any_of:
        AUTH_FAILURES.labels("scope").inc()
        raise Forbidden(f"{_who(who)} has scopes {','.join(sorted(who.scopes))}; a {kind} job needs "
                        + " or ".join(f"'{s}'" for s in sorted(any_of)))


def collections_of(request: Request) -> frozenset[str] | None:
    """The collections the request's key is limited to (``None``: all of its tenant's)."""
    who: Principal = getattr(request.state, "principal", OPEN)
    return who.collections


def allowed(request: Request, name: str) -> bool:
    """Whether the request's key may see collection ``name`` (for listings)."""
    who: Principal = getattr(request.state, "principal", OPEN)
    return who.collections is None or name in who.collections


def audit(request: Request, action: str, target: str | None = None, **detail: Any) -> None:
    """Log an admin action to the state of record's audit log with the key and tenant that did it."""
    who: Principal = getattr(request.state, "principal", OPEN)
    access: Access = request.app.state.access
    access.state.append_audit(
        AuditEntry(action=action, key_id=who.key_id, tenant_id=who.tenant_id, target=target, detail=detail)
    )


def _check(who: Principal, name: str) -> None:
    if who.collections is not None and name not in who.collections:
        raise Forbidden(
            f"{_who(who)} may use collections {', '.join(sorted(who.collections))}; not {clip(name)}",
            reason="collection",
        )


def _who(who: Principal) -> str:
    return "this server's open access" if who.key_id is None else f"API key qk_{who.key_id}_…"


def is_loopback(host: str) -> bool:
    """Whether a bind address only accepts this machine's connections (``localhost`` counts)."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, state: StateStore, settings: AuthSettings) -> None:
    """Refuse to serve beyond loopback with no API keys, unless keys are required or insecure is allowed.

    With ``QUARRY_AUTH__REQUIRED=true`` nothing but the open routes (health, readiness, metrics)
    answers without a key, so a server may start before its first key exists (a container's
    first start: create the key then, in the shared docstore).

    Raises:
        ConfigError: ``host`` is not loopback, no key exists, keys are not required and insecure
            serving is not allowed.
    """
    if is_loopback(host) or settings.allow_insecure or settings.required or state.list_api_keys():
        return
    raise ConfigError(
        f"refusing to serve on {host!r} with no API keys: anyone reaching the port could read and drop every "
        "collection. Create a key ('quarry keys create --tenant default --scopes read,write,admin'), bind to "
        "127.0.0.1, require keys (QUARRY_AUTH__REQUIRED=true: every request is 401 until a key exists), or set "
        "QUARRY_AUTH__ALLOW_INSECURE=true"
    )
