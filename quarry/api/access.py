"""The access layer, in one place: who a request is, what it may do, and how fast.

:func:`authorize` is a dependency of every router ``create_app`` includes; for each request it

1. finds the route's required scope in :data:`POLICY` (``None``: open, as ``/healthz``; a route
   missing from the table needs ``admin``: new routes fail closed);
2. reads the key from ``Authorization: Bearer qk_…`` or ``api-key: qk_…`` and verifies it
   (:class:`~quarry.api.keys.KeyVerifier`: record read again after any commit, so a revoke is immediate);
   with no key sent it is 401 once any key exists (or ``QUARRY_AUTH__REQUIRED=true``), else the
   request is the open server's :data:`~quarry.api.keys.OPEN` principal (the demo);
3. checks the scope and the ``{name}`` collection against the key (403);
4. spends one request of the key's rate (:class:`RateLimiter`, the ``limits`` library; 429 with
   ``Retry-After``); an answer request of a key with a token quota is checked later, once its
   prompt is built (:class:`TokenQuota`, :func:`tokens`);
5. sheds a low-priority (and, if set, normal-priority) key's request while more than
   ``QUARRY_AUTH__SHED_IN_FLIGHT`` requests are in flight (``quarry.metrics.IN_FLIGHT``): with
   ``QUARRY_AUTH__SHED_LOW=cheapest`` (default) a search or answer request goes on marked
   ``request.state.shed`` and gets the cheapest honest answer (:func:`shed`: the semantic
   cache's answer, else a hybrid search answered by BM25 alone, marked ``degraded``), any other
   request (or ``reject``) 503 ``Overloaded`` with ``Retry-After``, held a moment first
   (``QUARRY_AUTH__SHED_HOLD_S``, :mod:`quarry.api.pacing`);

and leaves the :class:`~quarry.api.keys.Principal` in ``request.state.principal``. The rate and
token windows are :mod:`quarry.api.quotas`; the shed decision :mod:`quarry.api.shedding`. Handlers that
take a collection name from the body call :func:`check_collection`; admin actions call
:func:`audit`.

Counters (names and labels shared with :mod:`quarry.metrics`):
``quarry_auth_failures_total{reason}``, ``quarry_rate_limited_total``, ``quarry_shed_total{priority}``,
``quarry_token_limited_total``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import ipaddress
import logging
import re
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from starlette.datastructures import Headers

from indexing.docstore import AuditEntry, StateStore, off_loop
from quarry.api.keys import OPEN, CheckSlots, KeyVerifier, Principal
from quarry.api.quotas import KeyTokens, RateLimiter, TokenQuota
from quarry.api.shedding import CHEAP_ROUTES, Shed, shedding
from quarry.errors import ConfigError, Forbidden, RateLimited, Unauthenticated, clip
from quarry.metrics import AUTH_FAILURES, IN_FLIGHT
from quarry.service import Quarry
from quarry.settings import AuthSettings

log = logging.getLogger(__name__)


# (method, route template) -> scope needed; None: open to anyone who reaches the port.
# A tuple: any one of those scopes. docs/access.md's scope table and the OpenAPI's per-route
# security (quarry.api.security) say the same (tests/core/test_scopes.py walks the routes).
POLICY: dict[tuple[str, str], str | tuple[str, ...] | None] = {
    ("GET", "/healthz"): None,
    ("GET", "/readyz"): None,
    # every tenant's collection names are label values: a Prometheus key (or an admin's); a key
    # of a tenant other than the operator's sees its own tenant's series only (metrics.TenantView)
    ("GET", "/metrics"): ("metrics", "admin"),
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
    # a gray release (quarry.api.routes.rollout): the operator's, as a reindex
    ("POST", "/v1/collections/{name}/rollout"): "admin",
    ("GET", "/v1/collections/{name}/rollout"): "admin",
    ("POST", "/v1/collections/{name}/rollout/step"): "admin",
    ("POST", "/v1/collections/{name}/rollout/promote"): "admin",
    ("POST", "/v1/collections/{name}/rollout/abort"): "admin",
    ("GET", "/v1/collections/{name}/rollout/report"): "admin",
    # submitting an ingest job writes documents, as an upsert does: write. Reading or cancelling a
    # job: a reindex job's needs admin, an ingest job's write or admin (the handler's check_job);
    # the tenant is checked in Quarry.get_job, the key's collections in ingest_jobs.job_or_404
    # listing: the tenant's jobs a key may read (reindex jobs for admin only; its collections only)
    ("GET", "/v1/jobs"): ("write", "admin"),
    ("GET", "/v1/jobs/{job_id}"): ("write", "admin"),
    ("DELETE", "/v1/jobs/{job_id}"): ("write", "admin"),
    ("POST", "/v1/collections/{name}/jobs"): "write",
    ("POST", "/v1/collections/{name}/search"): "read",
    ("POST", "/v1/collections/{name}/answer"): "read",
    # a thumbs or a click on a request the same key was served (quarry.services.feedback checks the key)
    ("POST", "/v1/collections/{name}/feedback"): "read",
    ("POST", "/v1/chat/completions"): "read",
    # quarry eval's run folders on the server's disk (QUARRY_EVAL__REPORTS_DIR): the operator's, of every tenant
    ("GET", "/v1/reports"): "admin",
    ("GET", "/v1/reports/{report_id}"): "admin",
    ("GET", "/v1/reports/{report_id}/{file}"): "admin",
    # the web console's static files hold no data; its calls send the key (quarry.api.routes.console)
    ("GET", "/console"): None,
    ("GET", "/console/console.js"): None,
    ("GET", "/console/console.css"): None,
    ("GET", "/v1/audit"): "admin",  # the key's tenant's entries only
    # OpenAI's models (the collections the key may read) and embeddings (with a collection's model)
    ("GET", "/v1/models"): "read",
    ("GET", "/v1/models/{model:whole}"): "read",
    ("POST", "/v1/embeddings"): "read",
}


def tokens(request: Request) -> KeyTokens | None:
    """The request's key's token quota (``None``: the key has none, or no key: unlimited)."""
    who: Principal = getattr(request.state, "principal", OPEN)
    access: Access | None = getattr(request.app.state, "access", None)
    if who.token_rate is None or who.key_id is None or access is None:
        return None
    return KeyTokens(access.tokens, who.key_id, who.token_rate)


class Access:
    """The access layer's state for one app: the key verifier, the rate limiter and the settings."""

    def __init__(self, state: StateStore, settings: AuthSettings, *, verifier: KeyVerifier | None = None) -> None:
        """Check keys against ``state``; rates in ``settings.rate_storage``."""
        self.state = state
        self.settings = settings
        # the wrong-secret bound counted in the state of record too, where replicas and workers share
        # it (PostgreSQL). A SQLite state belongs to one server (--workers needs PostgreSQL), and a
        # slot's commit would move its change token, which keeps every verified key's principal.
        shared = getattr(state, "change_token", None) is None
        self.verifier = verifier or KeyVerifier(state, slots=CheckSlots(state) if shared else None)
        self.limiter = RateLimiter(settings.rate_storage)
        self.tokens = TokenQuota(self.limiter.storage)
        self._keys_exist = False
        self._no_keys_at: int | None = None  # the change token at which no key existed
        # sha256(presented key) -> its verification in flight (principal_async: one per key at once)
        self._flights: dict[bytes, asyncio.Task[Principal]] = {}

    def keys_required(self) -> bool:
        """Whether a request must carry a key: forced by settings, or some key (even revoked) exists.

        Once true it stays true for this process (keys are never deleted, only revoked). While
        none exists the state is asked again only after a commit (its change token moved): a key
        created by the CLI or another replica counts on the next request. On an event loop call
        it inside :func:`~indexing.docstore.cache_only` (it raises ``CacheMiss`` when it would
        have to read).
        """
        if self.settings.required or self._keys_exist:
            return True
        token = self.state.change_token()
        if token is not None and token == self._no_keys_at:
            return False
        self._keys_exist = self.state.any_api_key()
        self._no_keys_at = None if self._keys_exist else token
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

    async def principal_async(self, request: Request) -> Principal:
        """:meth:`principal`, a key not verified before checked in a worker thread, once per key at once.

        A verification that is not a memo hit reads the key's record and may run scrypt (~50-95 ms
        of CPU, by design): on the event loop, each new wrong secret for a known key id held
        every other request for that long. Concurrent requests presenting
        the same key (keyed by its SHA-256, never the key) wait on one verification in flight and
        share its outcome, success or failure: 32 clients arriving at once with a new key cost one
        scrypt, not 32. A request that joined a successful verification takes
        its principal only while nothing was committed since (else the record is read again, from
        the memo, without scrypt): a revoke committed before the request came still counts.

        Raises:
            Unauthenticated: See :meth:`principal`.
            RateLimited: See :meth:`~quarry.api.keys.KeyVerifier.verify`.
        """
        if not await off_loop(self.keys_required):  # a read only after a commit, and then in a thread
            return OPEN
        key = _presented_key(request)
        if key is None:
            return self.principal(request)  # 401 at once: no key sent (the keys were just counted)
        who = self.verifier.cached(key)
        if who is not None:
            return who
        seen = hashlib.sha256(key.encode()).digest()
        loop = asyncio.get_running_loop()
        flight = self._flights.get(seen)
        if flight is None or flight.get_loop() is not loop:
            # a task of its own: a leader's client that goes away does not cancel the others' answer
            flight = loop.create_task(run_in_threadpool(self.verifier.verify, key))
            self._flights[seen] = flight
            flight.add_done_callback(functools.partial(self._landed, seen))
            return await asyncio.shield(flight)
        await asyncio.shield(flight)  # its failure is this request's too
        who = self.verifier.cached(key)
        return who if who is not None else await run_in_threadpool(self.verifier.verify, key)

    def _landed(self, seen: bytes, flight: asyncio.Task[Principal]) -> None:
        """Forget a finished verification (the next request after it checks the memo or verifies anew)."""
        if self._flights.get(seen) is flight:
            del self._flights[seen]
        if not flight.cancelled():
            flight.exception()  # retrieved, though every request waiting on it may have gone


def _presented_key(request: Request | None, headers: Headers | None = None) -> str | None:
    headers = request.headers if request is not None else headers
    assert headers is not None
    auth = headers.get("authorization")
    if auth is not None:
        kind, _, token = auth.partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            raise Unauthenticated("the Authorization header must read 'Bearer qk_…'", reason="malformed")
        return token.strip()
    return headers.get("api-key")


_KEY_ID = re.compile(r"\s*qk_([0-9a-f]{12})_")


def presented_key_id(headers: Headers) -> str | None:
    """The id of the API key :func:`authorize` verifies for a request with ``headers``, parsed (nothing is read).

    The same header the verification reads (``Authorization`` when present, else ``api-key``;
    the first of each), so that what keys on it (a canary's routing, the feedback ledger:
    :data:`quarry.services.rollout.ROUTE_KEY`) names the key that was checked, never another
    header's. ``None``: no key sent, a malformed ``Authorization``, or no ``qk_<12 hex>_`` prefix.
    """
    try:
        key = _presented_key(None, headers)
    except Unauthenticated:
        return None
    match = None if key is None else _KEY_ID.match(key)
    return None if match is None else match.group(1)


def limited_early(access: Access, headers: Headers) -> RateLimited | None:
    """The 429 to answer before routing, or ``None``: the key's id is over its rate, or under a wrong-secret flood.

    Two dictionary lookups by the key's id (parsed from the header, nothing read from the
    state): its request window was found full by a refusal that still holds
    (:meth:`RateLimiter.full`: only a key that passed authentication ever fills one), or its
    secret checks fill the last second and the key presented is not one verified before
    (:meth:`~quarry.api.keys.KeyVerifier.throttled`). Either way :func:`authorize` would refuse
    the request the same way, after routing, body parsing, the dependencies and a worker thread
    (an over-rate key's 429s cost ~420 µs of server CPU each that way, ~70 µs here: ``bench/abuse.py``).
    """
    try:
        key = _presented_key(None, headers)
    except Unauthenticated:
        return None
    match = None if key is None else _KEY_ID.match(key)
    if match is None or key is None:
        return None
    key_id = match.group(1)
    return access.limiter.full(key_id) or access.verifier.throttled(key_id, key)


def shed_early(access: Access, method: str, path: str, headers: Headers) -> Shed | None:
    """Step 5 before routing, for a key verified before: the :class:`Shed` to refuse now, or ``None``.

    The outer middleware asks this first, so that a shed request costs no routing, body parsing
    or dependency solving (under 32 low-priority clients the 503s themselves were what kept a
    high-priority request waiting, ``bench/access.py``). Only a key whose principal the verifier
    holds (nothing committed since it was verified) is shed here; any other request goes through
    :func:`authorize`, which decides the same way.
    """
    shed_at = access.settings.shed_in_flight
    if not shed_at or IN_FLIGHT.count <= shed_at or not path.startswith("/v1/"):
        return None
    try:
        key = _presented_key(None, headers)
    except Unauthenticated:
        return None
    who = None if key is None else access.verifier.cached(key)
    if who is None:
        return None
    shed = shedding(access.settings, who.priority)
    if shed is None:
        return None
    if shed.policy != "reject" and method == "POST" and _CHEAP_PATH.fullmatch(path):
        return None  # a cheaper honest answer exists: authorize() marks the request for it
    return shed


# CHEAP_ROUTES' paths before routing (the early shed has no route template yet)
_CHEAP_PATH = re.compile(r"/v1/collections/[^/]+/(?:search|answer)|/v1/chat/completions")


async def authorize(request: Request) -> Principal:
    """The dependency every route runs first (see the module doc).

    Raises:
        Unauthenticated: 401, see :meth:`Access.principal`.
        Forbidden: 403, the key lacks the route's scope or the ``{name}`` collection.
        RateLimited: 429, the key's rate is spent, or its id got too many wrong secrets.
    """
    route = request.scope.get("route")
    template = getattr(route, "path", request.url.path)
    needed = POLICY.get((request.method, template), "admin")
    if needed is None:
        return OPEN
    access: Access = request.app.state.access
    any_of = (needed,) if isinstance(needed, str) else needed
    try:
        who = await access.principal_async(request)
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
    request.state.principal = who
    shed = shedding(access.settings, who.priority)
    if shed is not None:
        if shed.policy == "reject" or (request.method, template) not in CHEAP_ROUTES:
            raise await shed.refused()
        request.state.shed = shed  # the handler answers from the cache or BM25, or refuses
    return who


def service(request: Request) -> Quarry:
    """The service as the request's tenant sees it (:meth:`~quarry.service.Quarry.for_tenant`).

    For a route naming a shared collection, that collection scoped to the tenant
    (:meth:`~quarry.service.Quarry.for_collection`, :mod:`quarry.services.namespace`).

    Raises:
        Forbidden: The key's tenant is unknown (never an unscoped service).
    """
    who: Principal = getattr(request.state, "principal", OPEN)
    root: Quarry = request.app.state.quarry
    name = request.path_params.get("name")
    try:
        view = root.for_tenant(who.tenant_id)
        return view if name is None else view.for_collection(name)  # a shared one: scoped to the tenant
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


def may_see_job(request: Request, kind: str, collection: str | None) -> bool:
    """Whether the request's key may read a job of this kind and collection (a listing's filter)."""
    who: Principal = getattr(request.state, "principal", OPEN)
    any_of = {"write", "admin"} if kind == "ingest" else {"admin"}
    return bool(who.scopes & any_of) and (who.collections is None or collection is None
                                          or collection in who.collections)


def tenant_of(request: Request) -> str:
    """The tenant of the request's key (the open server's: ``default``)."""
    who: Principal = getattr(request.state, "principal", OPEN)
    return who.tenant_id


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

    With ``QUARRY_AUTH__REQUIRED=true`` nothing but the open routes (health, readiness)
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
