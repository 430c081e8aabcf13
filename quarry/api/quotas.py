"""Per-key request rates and LLM token quotas: the windows :mod:`quarry.api.access` spends (step 4)."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass

from limits import RateLimitItem, RateLimitItemPerMinute, RateLimitItemPerSecond
from limits.storage import MemoryStorage, Storage, storage_from_string
from limits.strategies import MovingWindowRateLimiter

from quarry.errors import ConfigError, RateLimited, clip
from quarry.metrics import RATE_LIMITED, TOKEN_LIMITED


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
