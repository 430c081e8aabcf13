"""Route a filtered search by how many rows the filter matches, whatever the filter's form.

A selective filter is best answered by an exact scan of the rows it matches; a broad one by
the ANN index searched with the filter. Engines choose between the two from their own
estimate, and that estimate depends on how the filter is written: Qdrant's cardinality
estimate of a ``$in`` on numbers (a ``should`` of ranges) or of a range is not that of an
equality on the same rows, pgvector's payload GIN index serves equalities but not ranges.
So every backend asks one :class:`FilterRouter` instead: it counts the matching rows through
the engine's own count with the filter (capped where the engine can stop early), keeps the
count for ``ttl_s`` seconds per ``(collection, filter, top_k)``, and routes

* ``"exact"`` when at most :meth:`FilterRouter.limit` rows match: an exact scan of them;
* ``"index"`` otherwise: the ANN index with the filter, with the engine knobs that keep
  ``top_k`` hits (see each backend's module docstring).

The limit is ``exact_rows`` when set (``StoreSettings.exact_filter_rows``), else
``max(1000, sqrt(13 * top_k * n))`` for ``n`` rows in the collection (about 3,600 of 100k for
``top_k`` 10): a filtered graph walk visits about ``top_k * n / m`` nodes to find ``top_k`` of
``m`` matching rows, an exact scan reads the ``m`` rows, and one visit cost 13 row reads in
pgvector 0.8 on GloVe-100k (35 ms for the walk at 1 %, 2.7 ms for the scan of the 1,000 rows).

Filters an engine cannot express (Milvus: ``$ne``/``$nin``/``$exists``/``$prefix``; Qdrant:
``$prefix``) take the id-set route: the store reads the payloads of the rows, evaluates the
condition with :func:`stores.filters.matches` (:func:`scanned_ids`) and searches with an id
filter (Milvus ``id in [...]``, Qdrant ``has_id``); at most :attr:`FilterRouter.max_scan_ids`
ids (``QUARRY_STORE__MAX_SCAN_IDS``), past which the search is refused with ``InvalidFilter``.

A process's own writes to a collection drop its counts (:meth:`FilterRouter.forget`); other
writers are seen after ``ttl_s``. A stale count only moves a search between two correct routes.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from quarry.errors import InvalidFilter
from stores.filters import Filter, matches

Route = Literal["exact", "index"]
ITERATIVE_TO_EXACT_COST = 13.0
"""Cost of one node a filtered graph walk visits, in rows an exact scan reads (pgvector 0.8)."""
EXACT_ROWS_MIN = 1000
DEFAULT_TTL_S = 10.0
CACHE_SIZE = 4096
DEFAULT_MAX_SCAN_IDS = 10_000
"""Most ids a condition evaluated on the payloads may resolve to (:func:`scanned_ids`)."""


def scanned_ids(
    flt: Filter, rows: Iterable[tuple[str, Mapping[str, Any]]], limit: int, engine: str
) -> list[str]:
    """The ids of ``rows`` whose payload matches ``flt`` (the id-set route of a filter).

    Args:
        flt: The condition the engine cannot express.
        rows: ``(record id, payload)`` pairs, read from the engine.
        limit: Most matching ids (``StoreSettings.max_scan_ids``).
        engine: The engine's name, for the message.

    Returns:
        The matching record ids, in scan order.

    Raises:
        InvalidFilter: More than ``limit`` rows match (HTTP 400; the message says what to do).
    """
    ids: list[str] = []
    for rid, payload in rows:
        if matches(flt, payload):
            ids.append(rid)
            if len(ids) > limit:
                raise InvalidFilter(
                    f"this filter's {_op_name(flt)} is evaluated on the payloads on {engine} and matches "
                    f"more than {limit:,} records; the limit is {limit:,} (QUARRY_STORE__MAX_SCAN_IDS): "
                    "narrow it (AND it with $eq/$in/a range on a selective field, or a longer prefix), "
                    "raise the limit, or use a pgvector collection, which compiles it natively"
                )
    return ids


def _op_name(flt: Filter) -> str:
    names = {"Ne": "$ne", "Nin": "$nin", "Exists": "$exists", "Prefix": "$prefix"}
    return names.get(type(flt).__name__, "condition")


def exact_row_limit(top_k: int, n_rows: float, exact_rows: int | None = None) -> int:
    """Most matching rows for which an exact scan of them beats the filtered index search.

    Args:
        top_k: Hits per query.
        n_rows: Rows in the collection (0 or negative when unknown).
        exact_rows: A fixed limit (``StoreSettings.exact_filter_rows``); ``None``: the rule.

    Returns:
        ``exact_rows``, else ``max(1000, sqrt(13 * top_k * n_rows))``.
    """
    if exact_rows is not None:
        return exact_rows
    return max(EXACT_ROWS_MIN, int(math.sqrt(ITERATIVE_TO_EXACT_COST * top_k * max(n_rows, 0.0))))


@dataclass(frozen=True)
class Decision:
    """How one filtered search is answered.

    Attributes:
        route: ``"exact"`` or ``"index"``.
        matching: Rows the filter matches, or ``limit + 1`` when it matches more (counts stop there).
        limit: The exact-scan limit the count was compared with.
    """

    route: Route
    matching: int
    limit: int


class FilterRouter:
    """One selectivity estimate per ``(collection, filter)``, shared by every form of a filter.

    Args:
        exact_rows: Fixed exact-scan limit in rows; ``None`` uses :func:`exact_row_limit`'s rule.
        ttl_s: Seconds a count is reused (0 counts on every search).
        max_scan_ids: Most ids a condition on the id-set route may resolve to (:func:`scanned_ids`).

    Attributes:
        routes: How many searches took each route (for tests and metrics).
    """

    def __init__(
        self, exact_rows: int | None = None, ttl_s: float = DEFAULT_TTL_S, max_scan_ids: int = DEFAULT_MAX_SCAN_IDS
    ) -> None:
        self.exact_rows = exact_rows
        self.ttl_s = ttl_s
        self.max_scan_ids = max_scan_ids
        self.routes: Counter[Route] = Counter()
        self._counts: OrderedDict[tuple[str, str, int], tuple[float, int, int]] = OrderedDict()
        self._lock = threading.Lock()

    def limit(self, top_k: int, n_rows: float) -> int:
        """The exact-scan limit for a search of ``top_k`` hits in ``n_rows`` rows."""
        return exact_row_limit(top_k, n_rows, self.exact_rows)

    def decide(
        self,
        collection: str,
        flt: Filter,
        top_k: int,
        n_rows: Callable[[], float],
        count: Callable[[int], int],
    ) -> Decision:
        """Route a search of ``collection`` filtered by ``flt``.

        Args:
            collection: The collection (counts are kept per collection name).
            flt: The filter; its key is its ``repr``, which keeps ``1``, ``1.0`` and ``True`` apart.
            top_k: Hits per query.
            n_rows: Returns the rows in the collection (an estimate will do); called on a miss.
            count: ``count(cap)`` returns the matching rows, or any number above ``cap`` once it
                knows there are more (the engine's count with the filter); called on a miss.

        Returns:
            The decision; :attr:`routes` counts it.
        """
        key = (collection, repr(flt), top_k)
        now = time.monotonic()
        with self._lock:
            cached = self._counts.get(key)
            if cached is not None and now - cached[0] > self.ttl_s:
                cached = None
            if cached is not None:
                self._counts.move_to_end(key)
        if cached is None:
            limit = self.limit(top_k, n_rows())
            cached = (now, min(int(count(limit)), limit + 1), limit)
            with self._lock:
                self._counts[key] = cached
                while len(self._counts) > CACHE_SIZE:
                    self._counts.popitem(last=False)
        _, matching, limit = cached
        route: Route = "exact" if matching <= limit else "index"
        with self._lock:
            self.routes[route] += 1
        return Decision(route, matching, limit)

    def forget(self, collection: str | None = None) -> None:
        """Drop the counts of ``collection`` (after a write to it), or all of them."""
        with self._lock:
            for key in [k for k in self._counts if collection is None or k[0] == collection]:
                del self._counts[key]
