"""API keys: how one is made, stored, parsed and checked (no HTTP here; :mod:`quarry.api.access` uses it).

A key reads ``qk_<id>_<secret>``: ``id`` (12 hex digits) finds its record in the state of record
(:class:`~indexing.docstore.ApiKeyRecord`), ``secret`` (256 random bits, URL-safe base64) is never
stored: the record keeps ``scrypt$<n>$<r>$<p>$<salt>$<digest>`` (:func:`hashlib.scrypt`, a random
16-byte salt per key), compared in constant time (:func:`hmac.compare_digest`). The key is shown
once, by ``quarry keys create``.

scrypt costs ~50 ms by design, too much for every request: :class:`KeyVerifier` remembers, in
this process's memory only, a SHA-256 of each presented key it has verified (and of the last
wrong ones, so a flood of bad secrets for a real id costs one scrypt each); a changed hash (a key
re-created under its id) invalidates the memo. Reading the key's record on every request is what
makes a revoke (by the CLI, by another worker or replica) count at once, but it cost ~0.2 ms of the
event loop per request on SQLite (a transaction on the docstore's shared connection,
``bench/access.py``). So where the state of record offers ``change_token()`` (SQLite: ``PRAGMA
data_version``, which moves on any commit of any process, ~20 µs) the verifier also keeps the
principal of each verified key, under the SHA-256 of the presented key, with the token read before
its record was: while the token is unchanged nothing was revoked, and the first request after any
commit reads the record again. PostgreSQL's token counts the ``NOTIFY`` every write of a key sends
(:mod:`indexing.state_postgres`); while its listener is down there is none, and the record is read on
every request.

A key id is no secret (messages, logs and the audit name it), and each *new* wrong secret for a
real id costs one scrypt: so at most ``wrong_per_s`` (default 5) secrets per key id are checked
in any second; more are 429 ``RateLimited`` without hashing (a key verified before is still
recognised from its memo, and a right secret gives its place back). A check takes its place
*before* it hashes, under the verifier's lock, so concurrent requests cannot all pass a count
that only grows after their hashes (32 client threads made 26.8 checks/s before); with
:class:`CheckSlots` (the access layer's verifier) the place is also one of ``wrong_per_s`` leases
of the state of record, taken by a compare-and-set for one second, so every worker and replica
sharing the state counts against the same bound. The access layer runs a verification that is not a memo hit in a
worker thread, off the event loop, once for all the requests that present the same key at once
(:meth:`quarry.api.access.Access.principal_async`: 32 clients arriving with a new key cost one scrypt).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from indexing.docstore import DEFAULT_TENANT, ApiKeyRecord, StateStore
from quarry.errors import InvalidRequest, RateLimited, Unauthenticated, clip

SCOPES = ("read", "write", "admin", "metrics")  # metrics: GET /metrics only (a Prometheus key)
PRIORITIES = {"low": -1, "normal": 0, "high": 1}
# no "__": a tenant's vector-store names are t_<tenant>__<collection>, and collection names may hold
# "__", so tenant "acme" collection "corp__docs" and tenant "acme__corp" collection "docs" were one
# physical collection (the second 409, and listed as the other's)
TENANT = re.compile(r"(?!.*__)[a-z][a-z0-9_]{0,31}")
_KEY = re.compile(r"qk_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}
_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*")
_PER = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}
_DURATION = re.compile(r"\s*(\d+)\s*([smhdw])\s*")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True)
class Principal:
    """Who a request is: the key's id (``None``: no keys are configured), tenant, scopes and limits.

    Attributes:
        key_id: The key's id, or ``None`` for the open server of the demo (no keys exist).
        tenant_id: The tenant whose collections the request sees.
        scopes: Some of :data:`SCOPES`.
        collections: The collections the key may name, or ``None`` for all of its tenant's.
        rate: Requests per second allowed (``None``: unlimited).
        priority: ``-1`` low, ``0`` normal, ``1`` high (:data:`PRIORITIES`).
        token_rate: LLM tokens per second allowed on the answer path, over a moving window of 60 s
            (``None``: unlimited; :class:`quarry.api.quotas.TokenQuota`).
    """

    key_id: str | None
    tenant_id: str
    scopes: frozenset[str]
    collections: frozenset[str] | None = None
    rate: float | None = None
    priority: int = 0
    token_rate: float | None = None


OPEN = Principal(None, DEFAULT_TENANT, frozenset(SCOPES))


def hash_secret(secret: str, salt: bytes | None = None) -> str:
    """``scrypt$n$r$p$salt_hex$digest_hex`` of a key's secret (a new random salt unless given)."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(secret.encode(), salt=salt, maxmem=64 * 1024 * 1024, dklen=32, **_SCRYPT)
    return f"scrypt${_SCRYPT['n']}${_SCRYPT['r']}${_SCRYPT['p']}${salt.hex()}${digest.hex()}"


def check_secret(secret: str, stored: str) -> bool:
    """Whether ``secret`` hashes to ``stored`` (its own parameters and salt), in constant time."""
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt":
            return False
        got = hashlib.scrypt(
            secret.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r), p=int(p), maxmem=64 * 1024 * 1024, dklen=32
        )
    except ValueError:
        return False
    return hmac.compare_digest(got.hex(), digest)


def parse_key(key: str) -> tuple[str, str]:
    """``(id, secret)`` of a presented key.

    Raises:
        Unauthenticated: It is not of the form ``qk_<12 hex>_<43 base64url>`` (never echoed).
    """
    match = _KEY.fullmatch(key.strip())
    if match is None:
        raise Unauthenticated(
            f"the API key is malformed: expected qk_<id>_<secret> as printed by 'quarry keys create' "
            f"({len(key)} characters received)",
            reason="malformed",
        )
    return match.group(1), match.group(2)


def parse_rate(text: str | None, what: str = "rate") -> float | None:
    """Per second of ``"50/s"``, ``"600/min"``, ``"1000/h"`` (``None`` or ``""``: unlimited).

    ``what`` names the option in the error (``"rate"``, ``"token rate"``).

    Raises:
        InvalidRequest: Another form, or a rate of zero.
    """
    if not text:
        return None
    match = _RATE.fullmatch(text)
    if match is None or float(match.group(1)) <= 0:
        raise InvalidRequest(f"{what} {clip(text)} is not N/s, N/min or N/h with N > 0 (e.g. 50/s)")
    return float(match.group(1)) / _PER[match.group(2)]


def parse_duration(text: str) -> float:
    """Seconds of ``"30d"``, ``"12h"``, ``"2w"``, ``"90m"``, ``"45s"``.

    Raises:
        InvalidRequest: Another form.
    """
    match = _DURATION.fullmatch(text)
    if match is None or int(match.group(1)) <= 0:
        raise InvalidRequest(f"duration {clip(text)} is not N followed by s, m, h, d or w (e.g. 30d)")
    return int(match.group(1)) * _SECONDS[match.group(2)]


def new_key(  # noqa: PLR0913 - the key's attributes
    tenant_id: str,
    scopes: list[str],
    *,
    collections: list[str] | None = None,
    rate: float | None = None,
    token_rate: float | None = None,
    priority: str = "normal",
    expires_in_s: float | None = None,
    name: str = "",
) -> tuple[str, ApiKeyRecord]:
    """A new key and the record to store (the key is in the first item only).

    Raises:
        InvalidRequest: Unknown scope or priority, bad tenant id (``__`` included: see :data:`TENANT`), no scope.
    """
    if not TENANT.fullmatch(tenant_id):
        raise InvalidRequest(
            f"tenant id {clip(tenant_id)}: lower-case letter first; a-z, 0-9 and '_' (never '__'); at most 32"
        )
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown or not scopes:
        raise InvalidRequest(f"scopes {clip(scopes)}: give one or more of {', '.join(SCOPES)}")
    if priority not in PRIORITIES:
        raise InvalidRequest(f"priority {clip(priority)}: one of {', '.join(PRIORITIES)}")
    key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    now = time.time()
    record = ApiKeyRecord(
        id=key_id, tenant_id=tenant_id, prefix=f"qk_{key_id}", hash=hash_secret(secret), name=name,
        scopes=sorted(set(scopes)), collections=sorted(set(collections)) if collections else None, rate=rate,
        priority=PRIORITIES[priority], token_rate=token_rate, created_at=now,
        expires_at=now + expires_in_s if expires_in_s else None,
    )
    return f"qk_{key_id}_{secret}", record


class CheckSlots:
    """At most ``per_s`` secret checks per key id in any ``window_s``, across every process sharing the state.

    Slot ``i`` of key id ``K`` is the lease ``auth-check:K:i`` (``i < per_s``) of the state of
    record (:meth:`~indexing.docstore.StateStore.acquire_lease`: one compare-and-set statement; of
    processes racing for a slot exactly one gets it), held ``window_s`` by the database's clock. A
    check takes a free slot before it hashes, and gives it back when the secret was right; a wrong
    one keeps it until it lapses. No free slot: the check is refused. At most ``per_s`` rows per
    key id that ever got a check; slots are tried from a random one (racing checks rarely collide).
    """

    PREFIX = "auth-check"

    def __init__(self, state: StateStore, per_s: int = 5, window_s: float = 1.0) -> None:
        """Count in ``state``'s leases; ``per_s`` slots per key id, each held ``window_s`` seconds."""
        self.state = state
        self.per_s = per_s
        self.window_s = window_s

    def take(self, key_id: str) -> tuple[str, str] | None:
        """A free slot of ``key_id``, now held (``(lease name, owner)``), or ``None`` when all are held.

        Raises:
            StoreError: The state of record failed (as the key's record read before it would).
        """
        owner = secrets.token_hex(8)
        first = secrets.randbelow(self.per_s)
        for i in range(self.per_s):
            name = f"{self.PREFIX}:{key_id}:{(first + i) % self.per_s}"
            if self.state.acquire_lease(name, owner, self.window_s):
                return name, owner
        return None

    def give_back(self, slot: tuple[str, str]) -> None:
        """Free a slot a right secret held (it does not count against the bound)."""
        self.state.release_lease(*slot)


class KeyVerifier:
    """Turns a presented key into a :class:`Principal`, its record read again after any commit (see module doc).

    Thread-safe. ``clock`` is Unix seconds (expiry is compared with it).
    """

    def __init__(  # noqa: PLR0913 - the verifier's knobs
        self, state: StateStore, *, memo_size: int = 4096, clock: Callable[[], float] = time.time, wrong_per_s: int = 5,
        slots: CheckSlots | None = None,
    ) -> None:
        """Check keys against ``state``'s ``api_keys``; remember up to ``memo_size`` verified digests.

        ``wrong_per_s``: secrets checked (scrypt) per key id and second, in this process (by
        ``clock``); more are 429. ``slots``: the same bound across every process sharing the state
        of record (:class:`CheckSlots`; ``None``: this process only).
        """
        self.state = state
        self._now = clock
        self._wrong_per_s = wrong_per_s
        self._slots = slots
        # key id (of a stored record) -> times of its checks in flight and of its recent wrong secrets
        self._wrong: dict[str, deque[float]] = {}
        self._good: OrderedDict[tuple[str, str], bytes] = OrderedDict()  # (id, stored hash) -> sha256(secret)
        self._bad: OrderedDict[bytes, None] = OrderedDict()
        self._verified: OrderedDict[bytes, None] = OrderedDict()  # sha256(presented key) of keys verified
        # sha256(presented key) -> (change token before its record was read, expires_at, principal)
        self._principals: OrderedDict[bytes, tuple[int, float | None, Principal]] = OrderedDict()
        self._size = memo_size
        self._lock = threading.Lock()

    def verify(self, key: str) -> Principal:
        """The principal of a presented key.

        Raises:
            Unauthenticated: Malformed, unknown, wrong secret, revoked or expired (the message says
                which, with the key's id where it parsed, never its secret).
            RateLimited: More than ``wrong_per_s`` wrong secrets for this key id in the last second
                (this secret was not checked).
        """
        token = self._token()
        seen = hashlib.sha256(key.encode()).digest()
        hit = self._cached(seen, token)
        if hit is not None:
            return hit
        key_id, secret = parse_key(key)
        record = self.state.get_api_key(key_id)
        if record is None:
            raise Unauthenticated(f"API key qk_{key_id}_… is not known to this server", reason="unknown")
        if not self._secret_ok(record, secret):
            raise Unauthenticated(f"API key qk_{key_id}_… has a wrong secret")
        if record.revoked_at is not None:
            raise Unauthenticated(f"API key qk_{key_id}_… was revoked at {_iso(record.revoked_at)}", reason="revoked")
        if record.expires_at is not None and record.expires_at <= self._now():
            raise Unauthenticated(f"API key qk_{key_id}_… expired at {_iso(record.expires_at)}", reason="expired")
        who = Principal(
            key_id=record.id, tenant_id=record.tenant_id, scopes=frozenset(record.scopes),
            collections=None if record.collections is None else frozenset(record.collections),
            rate=record.rate, priority=record.priority, token_rate=record.token_rate,
        )
        with self._lock:
            self._verified[seen] = None
            while len(self._verified) > self._size:
                self._verified.popitem(last=False)
            if token is not None:
                self._principals[seen] = (token, record.expires_at, who)
                while len(self._principals) > self._size:
                    self._principals.popitem(last=False)
        return who

    def throttled(self, key_id: str, key: str) -> RateLimited | None:
        """The 429 a check of ``key`` would get now without reading anything, or ``None``.

        ``key_id``'s secret checks fill the last second, and ``key`` is not one verified before
        (such a key is verified as usual: its record read again, its secret from the memo).
        """
        places = self._wrong.get(key_id)
        if places is None or len(places) < self._wrong_per_s:
            return None
        now = self._now()
        with self._lock:
            recent = [t for t in places if t > now - 1.0]
            if len(recent) < self._wrong_per_s or hashlib.sha256(key.encode()).digest() in self._verified:
                return None
        return RateLimited(
            f"API key qk_{key_id}_… got {len(recent)} wrong secrets in the last second; retry in 1 s",
            retry_after_s=max(1.0, recent[0] + 1.0 - now),
        )

    def cached(self, key: str) -> Principal | None:
        """The principal of a key verified before, if nothing was committed since (no record read); else ``None``."""
        return self._cached(hashlib.sha256(key.encode()).digest(), self._token())

    def _cached(self, seen: bytes, token: int | None) -> Principal | None:
        if token is None:
            return None
        with self._lock:
            hit = self._principals.get(seen)
        if hit is not None and hit[0] == token and (hit[1] is None or hit[1] > self._now()):
            return hit[2]
        return None

    def _token(self) -> int | None:
        """The state of record's change token, or ``None`` where it has none (read every record)."""
        change_token = getattr(self.state, "change_token", None)
        token = None if change_token is None else change_token()  # None: no listener now (PostgreSQL)
        return None if token is None else int(token)

    def _secret_ok(self, record: ApiKeyRecord, secret: str) -> bool:
        """Whether ``secret`` is the record's: from the memos, else one check (scrypt) within the bound.

        Raises:
            RateLimited: The key id's checks fill the last second (here, or in the state's slots).
        """
        seen = hashlib.sha256(f"{record.id}:{record.hash}:{secret}".encode()).digest()
        with self._lock:
            known = self._good.get((record.id, record.hash))
            if known is not None and hmac.compare_digest(known, seen):
                return True
            if seen in self._bad:
                return False
            taken = self._throttle(record.id)  # this check's place, taken before it hashes
        slot = None
        try:
            if self._slots is not None:
                slot = self._slots.take(record.id)
                if slot is None:
                    raise RateLimited(
                        f"API key qk_{record.id}_… got {self._wrong_per_s} wrong secrets in the last second on "
                        "the servers sharing this state; retry in 1 s",
                        retry_after_s=1.0,
                    )
            ok = check_secret(secret, record.hash)
        except BaseException:
            self._give_back(record.id, taken)  # not checked here: the place goes back
            raise
        with self._lock:
            memo: OrderedDict[tuple[str, str], bytes] | OrderedDict[bytes, None]
            if ok:
                self._good[(record.id, record.hash)] = seen
                memo = self._good
            else:
                self._bad[seen] = None
                memo = self._bad
            while len(memo) > self._size:
                memo.popitem(last=False)
        if ok:  # a right secret does not count against the bound
            self._give_back(record.id, taken)
            if slot is not None and self._slots is not None:
                self._slots.give_back(slot)
        return ok

    def _give_back(self, key_id: str, taken: float) -> None:
        """Drop a place :meth:`_throttle` took (a right secret, or a check that never ran)."""
        with self._lock:
            places = self._wrong.get(key_id)
            if places is not None and taken in places:
                places.remove(taken)


    def _throttle(self, key_id: str) -> float:
        """Take a place for one check of ``key_id``'s secret, or refuse (under the lock): its time.

        The places are the checks in flight and the wrong secrets of the last second; a right
        secret gives its place back (:meth:`_give_back`).

        Raises:
            RateLimited: ``wrong_per_s`` places taken in the last second.
        """
        now = self._now()
        places = self._wrong.get(key_id)
        if places is None:
            places = self._wrong[key_id] = deque()  # bounded by the stored keys; emptied as they calm down
        while places and places[0] <= now - 1.0:
            places.popleft()
        if len(places) >= self._wrong_per_s:
            raise RateLimited(
                f"API key qk_{key_id}_… got {len(places)} wrong secrets in the last second; retry in 1 s",
                retry_after_s=max(1.0, places[0] + 1.0 - now),
            )
        places.append(now)
        return now


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
