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

and leaves the :class:`~quarry.api.keys.Principal` in ``request.state.principal``. Handlers that
take a collection name from the body call :func:`check_collection`; admin actions call
:func:`audit`.

Counters (their names and labels are shared with the metrics work of issue 27):
``quarry_auth_failures_total{reason}``, ``quarry_rate_limited_total``, ``quarry_shed_total{priority}``,
``quarry_token_limited_total``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import ipaddress
import logging
import math
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from limits import RateLimitItem, RateLimitItemPerMinute, RateLimitItemPerSecond
from limits.storage import MemoryStorage, Storage, storage_from_string
from limits.strategies import MovingWindowRateLimiter
from starlette.datastructures import Headers

from indexing.docstore import AuditEntry, StateStore, off_loop
from quarry.api import pacing
from quarry.api.keys import OPEN, CheckSlots, KeyVerifier, Principal
from quarry.errors import ConfigError, Forbidden, Overloaded, RateLimited, Unauthenticated, clip
from quarry.metrics import AUTH_FAILURES, IN_FLIGHT, RATE_LIMITED, SHED, TOKEN_LIMITED
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
    ("POST", "/v1/chat/completions"): "read",
    # OpenAI's models (the collections the key may read) and embeddings (with a collection's model)
    ("GET", "/v1/models"): "read",
    ("GET", "/v1/models/{model:whole}"): "read",
    ("POST", "/v1/embeddings"): "read",
}


class RateLimiter:
    """Requests per second per key, in a moving window of one second (a rate under 1/s: per minute).

    ``storage_uri`` ``memory://`` (this process) keeps each key's request times in a deque,
    counted on the caller's thread. ``limits``' own ``MemoryStorage`` starts a timer thread every
    10 ms to expire its windows, and each ``Thread.start()`` held the event loop until the OS ran
    the new thread: on the shared 2-core machine a server with one rate-limited key answered
    ~50 req/s instead of ~300-500, 1-client p50 18-24 ms instead of 1.5 ms (``bench/access.py``).
    Shared storages for replicas go through the ``limits`` library (its moving window):
    ``redis://host:6379``, ``memcached://host:11211`` (install the driver).
    """

    def __init__(self, storage_uri: str = "memory://") -> None:
        """Open the storage.

        Raises:
            ConfigError: ``limits`` does not know the URI's scheme, or its driver is missing.
        """
        self._windows: dict[str, deque[float]] | None = None
        self._lock = threading.Lock()
        # key id -> (time.time() until which its window is full, its rate), set by a refusal:
        # limited_early's answer before routing, dropped once that time has passed
        self._full_until: dict[str, tuple[float, float]] = {}
        self.storage: Storage | None = None
        if storage_uri.startswith("memory://"):
            self._windows = {}
            return
        try:
            storage = storage_from_string(storage_uri)
        except Exception as exc:  # limits raises ConfigurationError / ImportError variants
            raise ConfigError(f"rate-limit storage {clip(storage_uri)}: {exc}") from exc
        if not isinstance(storage, Storage):
            raise ConfigError(f"rate-limit storage {clip(storage_uri)}: an async storage; name the plain one")
        self.storage = storage
        self.limiter = MovingWindowRateLimiter(storage)
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
        wait = self._local(key_id, rate) if self._windows is not None else self._shared(key_id, rate)
        if wait is None:
            return
        self._full_until[key_id] = (time.time() + wait, rate)
        RATE_LIMITED.inc()
        raise self.refusal(key_id, rate, wait)

    @staticmethod
    def refusal(key_id: str, rate: float, wait: float) -> RateLimited:
        """The 429 of a key over its rate, ``wait`` seconds before its window has room."""
        return RateLimited(
            f"API key qk_{key_id}_… is limited to {rate:g} requests/s; retry in {math.ceil(wait) or 1} s",
            retry_after_s=max(wait, 1.0),
        )

    def full(self, key_id: str) -> RateLimited | None:
        """The 429 of ``key_id`` while its window is full, as its last refusal found it; ``None``: it may have room.

        A dictionary lookup: what :func:`limited_early` asks before routing. A window found full
        stays full until its oldest request leaves it (a refused request does not count).
        """
        found = self._full_until.get(key_id)
        if found is None:
            return None
        wait = found[0] - time.time()
        if wait <= 0:
            self._full_until.pop(key_id, None)
            return None
        RATE_LIMITED.inc()
        return self.refusal(key_id, found[1], wait)

    def _local(self, key_id: str, rate: float) -> float | None:
        """Count in this process: ``None``, or the seconds until the window's oldest request leaves it."""
        assert self._windows is not None
        limit, window_s = (int(rate), 1.0) if rate >= 1 else (max(1, round(rate * 60)), 60.0)
        now = time.time()
        with self._lock:
            times = self._windows.get(key_id)
            if times is None:
                times = self._windows[key_id] = deque()
            while times and times[0] <= now - window_s:
                times.popleft()
            if len(times) >= limit:
                return times[0] + window_s - now
            times.append(now)
        return None

    def _shared(self, key_id: str, rate: float) -> float | None:
        item = self._item(rate)
        if self.limiter.hit(item, "quarry", key_id):
            return None
        reset = self.limiter.get_window_stats(item, "quarry", key_id).reset_time
        return max(0.0, reset - time.time())


class TokenQuota:
    """LLM tokens per key on the answer path, in a moving window of 60 s (the ``limits`` library, ``cost=``).

    A key's ``token_rate`` (tokens/s, ``quarry keys create --tokens 20000/min``) allows
    ``round(token_rate * 60)`` tokens in any 60 s. Before the LLM is asked, :meth:`reserve` spends
    the prompt's tokens or refuses (429, the LLM not asked); after the answer :meth:`charge` spends
    the completion's tokens (the LLM's ``usage``, else the path's own count), as far as the
    window holds them (``limits`` cannot overdraw a window: a long completion fills it, and the
    key waits for it to empty). The storage is the request limiter's (``QUARRY_AUTH__RATE_STORAGE``):
    ``limits``' ``MemoryStorage`` in this process (made on the first answer of a key with a quota;
    its expiry timer thread starts on such answers only, never on other requests), or the shared
    store of the replicas.
    """

    WINDOW_S = 60

    def __init__(self, storage: Storage | None = None) -> None:
        """Count in ``storage`` (a ``limits`` storage); ``None``: a ``MemoryStorage``, made on first use."""
        self._storage = storage
        self._limiter: MovingWindowRateLimiter | None = None
        self._items: dict[float, RateLimitItem] = {}

    @property
    def limiter(self) -> MovingWindowRateLimiter:
        """The moving-window limiter (its ``MemoryStorage`` starts a timer thread: only once a quota is used)."""
        if self._limiter is None:
            self._limiter = MovingWindowRateLimiter(self._storage or MemoryStorage())
        return self._limiter

    def _item(self, token_rate: float) -> RateLimitItem:
        item = self._items.get(token_rate)
        if item is None:
            item = self._items[token_rate] = RateLimitItemPerMinute(max(1, round(token_rate * self.WINDOW_S)))
        return item

    def reserve(self, key_id: str, token_rate: float, tokens: int) -> None:
        """Spend ``tokens`` prompt tokens of ``key_id``'s window, or refuse.

        Raises:
            RateLimited: The window has no room for them (``retry_after_s``: when its oldest tokens
                leave it, at least 1 s), or they exceed the whole quota (retry after the window).
        """
        item, tokens = self._item(token_rate), max(1, tokens)
        if tokens > item.amount:
            TOKEN_LIMITED.inc()
            raise RateLimited(
                f"API key qk_{key_id}_… has a token quota of {item.amount} LLM tokens/min; this answer's prompt "
                f"needs {tokens}: ask for fewer sources (context_tokens, top_k)",
                retry_after_s=float(self.WINDOW_S),
            )
        if self.limiter.hit(item, "quarry-tokens", key_id, cost=tokens):
            return
        stats = self.limiter.get_window_stats(item, "quarry-tokens", key_id)
        wait = max(1.0, stats.reset_time - time.time())
        TOKEN_LIMITED.inc()
        raise RateLimited(
            f"API key qk_{key_id}_… has used its token quota of {item.amount} LLM tokens/min ({stats.remaining} "
            f"left, this answer's prompt needs {tokens}); retry in {math.ceil(wait)} s",
            retry_after_s=wait,
        )

    def charge(self, key_id: str, token_rate: float, tokens: int) -> int:
        """Spend ``tokens`` completion tokens, as many as the window holds; the number spent."""
        item = self._item(token_rate)
        room = self.limiter.get_window_stats(item, "quarry-tokens", key_id).remaining
        cost = min(max(0, tokens), room)
        if cost and not self.limiter.hit(item, "quarry-tokens", key_id, cost=cost):
            return 0  # another request took the room meanwhile
        return cost


@dataclass(frozen=True)
class KeyTokens:
    """One request's key and its token quota (see :func:`tokens`)."""

    quota: TokenQuota
    key_id: str
    token_rate: float

    def reserve(self, tokens: int) -> None:
        """:meth:`TokenQuota.reserve` for this key.

        Raises:
            RateLimited: See :meth:`TokenQuota.reserve`.
        """
        self.quota.reserve(self.key_id, self.token_rate, tokens)

    def charge(self, tokens: int) -> int:
        """:meth:`TokenQuota.charge` for this key."""
        return self.quota.charge(self.key_id, self.token_rate, tokens)


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
        every other request for that long (h-attack, 2026-12-03). Concurrent requests presenting
        the same key (keyed by its SHA-256, never the key) wait on one verification in flight and
        share its outcome, success or failure: 32 clients arriving at once with a new key cost one
        scrypt, not 32 (h-keys, 2026-12-03). A request that joined a successful verification takes
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
    shed = _shedding(access.settings, who.priority)
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
    shed = _shedding(access.settings, who.priority)
    if shed is not None:
        if shed.policy == "reject" or (request.method, template) not in CHEAP_ROUTES:
            raise await shed.refused()
        request.state.shed = shed  # the handler answers from the cache or BM25, or refuses
    return who


# routes with a cheaper honest answer than their full one (the semantic cache, BM25 alone)
CHEAP_ROUTES = frozenset({
    ("POST", "/v1/collections/{name}/search"), ("POST", "/v1/collections/{name}/answer"),
    ("POST", "/v1/chat/completions"),
})


@dataclass(frozen=True)
class Shed:
    """A request the saturated server sheds: its priority's policy and how to refuse it.

    ``hold_s`` and ``hold_max``: how long its 503 is held, and the most requests held at once
    (``QUARRY_AUTH__SHED_HOLD_S``, ``__SHED_HOLD_MAX``; :mod:`quarry.api.pacing`).
    """

    priority: str
    policy: str
    in_flight: int
    retry_after_s: float
    hold_s: float = 0.0
    hold_max: int = 0

    def refuse(self) -> Overloaded:
        """The 503 (counted in ``quarry_shed_total{priority}``) when no cheap answer exists."""
        SHED.labels(self.priority).inc()
        return Overloaded(
            f"the server is saturated ({self.in_flight} requests in flight) and sheds {self.priority}-priority "
            f"keys first; retry in {self.retry_after_s:g} s",
            retry_after_s=self.retry_after_s,
        )

    async def refused(self) -> Overloaded:
        """:meth:`refuse`'s 503 after the request's hold (Retry-After pacing, :func:`quarry.api.pacing.hold`)."""
        await pacing.hold(self.hold_s, self.retry_after_s, self.hold_max)
        return self.refuse()


def _shedding(settings: AuthSettings, priority: int) -> Shed | None:
    """The shed decision of a key of ``priority`` now (``None``: served in full)."""
    if not settings.shed_in_flight or priority > 0:
        return None
    name, policy = ("low", settings.shed_low) if priority < 0 else ("normal", settings.shed_normal)
    in_flight = IN_FLIGHT.count
    if policy == "off" or in_flight <= settings.shed_in_flight:
        return None
    return Shed(name, policy, in_flight, settings.shed_retry_after_s, settings.shed_hold_s, settings.shed_hold_max)


def shed(request: Request) -> Shed | None:
    """The request's :class:`Shed` when the access layer let it through for a cheap answer."""
    found: Shed | None = getattr(request.state, "shed", None)
    return found


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
