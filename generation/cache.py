"""The semantic answer cache: a finished answer served again to the same or a paraphrased question.

An entry is found by its question's embedding (the service's query encoder; rows L2-normalised,
so cosine is a dot product) and served only when all of these hold:

* its :class:`CacheKey` ``scope`` is the request's exactly: collection, filters, ``top_k``,
  mode, rerank, context budget, LLM model, prompt template, ``max_tokens``, temperature, seed,
  support threshold, query encoder (canonical JSON, compared as a string);
* its ``version`` is the collection's now: the collection's creation time and its write counter
  (:meth:`indexing.docstore.DocStore.version`, bumped by every upsert and delete), so any write
  makes older entries unusable (they are dropped when met);
* cosine with the request's question ``>= threshold`` (the collection's ``cache_threshold``, else
  ``QUARRY_CACHE__THRESHOLD``);
* the lexical guard finds no contradiction (:func:`generation.cache_guard.contradiction`);
* it is younger than ``ttl_s``.

The state is behind :class:`AnswerCache` (get/put/stats); :func:`open_cache` picks the backend
(``memory``: :class:`MemoryCache`, this process's, bounded and LRU). A shared backend for
several replicas implements the same three methods.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from generation.cache_guard import Terms, contradiction
from quarry.errors import ConfigError
from quarry.settings import CacheSettings

Vector = npt.NDArray[np.float32]


@dataclass(frozen=True)
class CacheKey:
    """Where an answer may be reused.

    Attributes:
        scope: Canonical JSON of every parameter that changes the answer (compared exactly).
        version: The collection's state the answer was built from (``"<created_at>:<writes>"``).
    """

    scope: str
    version: str


@dataclass(frozen=True)
class Question:
    """A question as the cache compares it.

    Attributes:
        text: As asked.
        vector: ``(dim,) float32``, L2-normalised (the query encoder's output).
        terms: The lexical guard's view (:func:`generation.cache_guard.terms`).
    """

    text: str
    vector: Vector
    terms: Terms


@dataclass
class Entry:
    """A stored answer: the question, the events to replay, when it was stored (clock seconds)."""

    key: CacheKey
    question: Question
    events: tuple[Any, ...]
    stored_at: float


@dataclass(frozen=True)
class Lookup:
    """A lookup's outcome: the entry (a hit) or why not.

    Attributes:
        entry: The entry to serve, or ``None``.
        reason: On a miss: ``empty`` (nothing stored for this scope), ``invalidated`` (what
            was stored is of another state of the collection: written since), ``below_threshold``
            (none close enough), or ``guard:<rule>`` for the closest entry the lexical guard
            refused (``guard:number``, ``guard:negation``, ``guard:content``, ``guard:antonym``,
            ``guard:unit``, ``guard:date``, ``guard:entity``, ``guard:order``);
            ``None`` on a hit.
        similarity: Cosine of the closest entry (``None`` when there was none).
    """

    entry: Entry | None
    reason: str | None = None
    similarity: float | None = None


@runtime_checkable
class AnswerCache(Protocol):
    """Contract of a cache backend (thread-safe)."""

    def get(self, key: CacheKey, question: Question, threshold: float | None = None) -> Lookup:
        """The usable entry closest to ``question`` under ``key``, or a miss and its reason.

        ``threshold``: least cosine for a hit (the collection's ``cache_threshold``); ``None``:
        the cache's own.
        """
        ...

    def put(self, key: CacheKey, question: Question, events: Sequence[Any]) -> None:
        """Store a complete answer's events (an entry for the same scope and text is replaced)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counters of this cache.

        ``entries``, ``hits``, ``misses`` (with ``miss_reasons``), ``stores``, ``evicted`` (size
        bound), ``expired`` (TTL), ``invalidated`` (collection written).
        """
        ...


class MemoryCache:
    """:class:`AnswerCache` in this process: at most ``max_entries``, least recently used out first.

    Args:
        threshold: Least cosine for a hit (0-1).
        ttl_s: Seconds an entry is served after it was stored.
        max_entries: Size bound (entries across all scopes).
        clock: Seconds, monotonic (injectable for tests).
    """

    def __init__(
        self, threshold: float, ttl_s: float, max_entries: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.threshold, self.ttl_s, self.max_entries = threshold, ttl_s, max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._lru: OrderedDict[int, Entry] = OrderedDict()
        self._scopes: dict[str, dict[int, Entry]] = {}
        self._next = 0
        self._counts: Counter[str] = Counter()
        self._reasons: Counter[str] = Counter()

    def get(self, key: CacheKey, question: Question, threshold: float | None = None) -> Lookup:
        """See :meth:`AnswerCache.get`."""
        least = self.threshold if threshold is None else threshold
        with self._lock:
            invalidated = self._counts["invalidated"]
            entries = self._usable(key)
            if not entries:  # nothing stored, or all of it for another state of the collection
                return self._miss("invalidated" if self._counts["invalidated"] > invalidated else "empty", None)
            ids = list(entries)
            sims = np.stack([entries[i].question.vector for i in ids]) @ question.vector
            order = np.argsort(-sims)
            best = float(sims[order[0]])
            reason = "below_threshold"
            for j in order:
                if sims[j] < least:
                    break
                entry = entries[ids[j]]
                why = contradiction(question.terms, entry.question.terms)
                if why is None:
                    self._lru.move_to_end(ids[j])
                    self._counts["hits"] += 1
                    return Lookup(entry, None, float(sims[j]))
                if reason == "below_threshold":
                    reason = f"guard:{why}"
            return self._miss(reason, best)

    def put(self, key: CacheKey, question: Question, events: Sequence[Any]) -> None:
        """See :meth:`AnswerCache.put`."""
        with self._lock:
            scope = self._usable(key)
            text = _normal(question.text)
            for i, old in list(scope.items()):
                if _normal(old.question.text) == text:
                    self._drop(i)
            ident, self._next = self._next, self._next + 1
            entry = Entry(key, question, tuple(events), self._clock())
            self._lru[ident] = entry
            self._scopes.setdefault(key.scope, {})[ident] = entry
            self._counts["stores"] += 1
            while len(self._lru) > self.max_entries:
                self._drop(next(iter(self._lru)))
                self._counts["evicted"] += 1

    def stats(self) -> dict[str, Any]:
        """See :meth:`AnswerCache.stats`."""
        with self._lock:
            counts = {k: self._counts[k] for k in ("hits", "misses", "stores", "evicted", "expired", "invalidated")}
            return {"entries": len(self._lru), **counts, "miss_reasons": dict(self._reasons)}

    def _usable(self, key: CacheKey) -> dict[int, Entry]:
        """The scope's entries, after dropping those of another version or past their TTL."""
        scope = self._scopes.get(key.scope, {})
        now = self._clock()
        for i, entry in list(scope.items()):
            if entry.key.version != key.version:
                self._drop(i)
                self._counts["invalidated"] += 1
            elif now - entry.stored_at > self.ttl_s:
                self._drop(i)
                self._counts["expired"] += 1
        return self._scopes.get(key.scope, {})

    def _drop(self, ident: int) -> None:
        entry = self._lru.pop(ident)
        scope = self._scopes[entry.key.scope]
        del scope[ident]
        if not scope:
            del self._scopes[entry.key.scope]

    def _miss(self, reason: str, similarity: float | None) -> Lookup:
        self._counts["misses"] += 1
        self._reasons[reason] += 1
        return Lookup(None, reason, similarity)


BACKENDS = ("memory",)


def open_cache(settings: CacheSettings) -> AnswerCache | None:
    """The backend ``settings.backend`` names, or ``None`` when the cache is disabled.

    Raises:
        ConfigError: Unknown backend.
    """
    if not settings.enabled:
        return None
    if settings.backend == "memory":
        return MemoryCache(settings.threshold, settings.ttl_s, settings.max_entries)
    raise ConfigError(f"unknown answer cache backend {settings.backend!r}; use one of {', '.join(BACKENDS)}")


def _normal(text: str) -> str:
    return " ".join(text.casefold().split())
