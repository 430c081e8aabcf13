"""Feedback on served requests: a thumbs up or down, or a click on a hit, tied to the request id.

Each search (and so each answer and chat completion, whose retrieval is one; an answer the answer
cache replays: :func:`note_replayed`) that a request with an id serves is noted by :func:`note`
under ``(tenant, collection, API key id, request id)``: the version that served it, its role in a
gray release (``candidate``/``live``, ``None`` without one), the rollout's step, and the first
:data:`HITS_KEPT` hits' document ids (their 64-bit ``hash()``, this process's: ~0.5 kB an entry
with 10 hits, ~9 MB for 20,000). The request id is the request's ``X-Request-ID`` (the client's
when it is a safe token, else the server's, echoed in the reply: :mod:`quarry.api.observe`). The
newest ``QUARRY_MONITOR__FEEDBACK_REQUESTS`` of a tenant are kept (its own collections' together;
in the shared collections, each tenant's apart: another tenant's searches push none of them out,
while the tenant's other keys' searches do), each for ``QUARRY_MONITOR__FEEDBACK_TTL_S``, in this
process (as the rollout's figures are: feedback reaches the replica that served the request, e.g.
by session affinity).

:func:`give` records a client's feedback on one of them: at most one rating per request (the
last one sent counts) and the set of hits clicked (a click sent twice counts once), so a retried
``POST`` changes nothing. It is counted in ``quarry_feedback_total{tenant,collection,signal,role}``
and, while the rollout's step that served the request lasts, in its window
(:func:`quarry.services.rollout.count_feedback`), where the feedback gates read it
(:func:`indexing.rollout.evaluate`: thumbs-down share and click-through rate, candidate vs live).

Only the key that asked may rate a request, and a request id another key sends replaces nothing
of this key's (another key's, another tenant's, an unknown or an expired id are alike: ``NotFound``).
"""

from __future__ import annotations

import threading
import time
import weakref
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from quarry.errors import CollectionNotFound, InvalidRequest, NotFound, clip
from quarry.logs import REQUEST_ID
from quarry.metrics import FEEDBACK
from quarry.services import rollout
from quarry.services.view import TenantSpace, View
from retrieval.results import SearchResult

Rating = Literal["up", "down"]
MAX_CLICKS = 100  # document ids in one feedback request
HITS_KEPT = 100  # a request's first hits a click may name


def _hashes(document_ids: Sequence[str]) -> array[int]:
    """The ids' ``hash()`` values, 64-bit: stable within this process, where the ledger lives (~0.1 us an id)."""
    return array("q", map(hash, document_ids))


@dataclass(slots=True)
class Served:
    """One served request as feedback finds it.

    Attributes:
        version: The collection version that served it.
        role: ``candidate`` or ``live`` while a rollout routed it, else ``None``.
        step_started_at: The rollout step's start (Unix seconds) it was served in (``None``: no rollout).
        hits: The first :data:`HITS_KEPT` document ids it returned, as :func:`_hashes`.
        at: When it was served (``time.monotonic()`` seconds).
        rating: The client's rating so far.
        clicks: The hits the client clicked so far, as a bit mask of their ranks (bit 0: the first hit):
            an entry's size never grows with what a client sends.
    """

    version: int
    role: str | None
    step_started_at: float | None
    hits: array[int]
    at: float
    rating: Rating | None = None
    clicks: int = 0


@dataclass(eq=False)
class _Ledger:
    lock: threading.Lock = field(default_factory=threading.Lock)
    served: OrderedDict[tuple[str, str, str | None, str], Served] = field(default_factory=OrderedDict)


# a space's ledgers by tenant: one for a tenant's own space, one per tenant in the shared space
_LEDGERS: weakref.WeakKeyDictionary[TenantSpace, dict[str, _Ledger]] = weakref.WeakKeyDictionary()
_LEDGERS_LOCK = threading.Lock()


def _ledger(v: View) -> _Ledger:
    """The caller's tenant's ledger in its space: in the shared space each tenant has its own.

    So another tenant's searches of a shared collection evict none of this tenant's requests
    (``feedback_requests`` bounds each tenant, as in a tenant's own space).
    """
    found = _LEDGERS.get(v.space, {}).get(v.tenant_id)
    if found is None:
        with _LEDGERS_LOCK:
            found = _LEDGERS.setdefault(v.space, {}).setdefault(v.tenant_id, _Ledger())
    return found


def note(v: View, name: str, result: SearchResult, chosen: rollout.Route | None) -> None:
    """Keep ``result`` (served for the current request) for feedback on its request id.

    A request without an id (the CLI, a background job) is not kept; a second search of the
    same collection under the same id replaces the first. Entries past their time to live are
    dropped from the oldest end. O(1) amortised under the ledger's lock (~5 us with 10 hits, measured).
    """
    if result.version is None:
        return
    step_at = chosen.rollout.step_started_at if chosen is not None else None
    _keep(v, name, result.version, result.rollout, step_at, [h.document_id for h in result.hits[:HITS_KEPT]])


def note_replayed(v: View, name: str, version: int | None, role: str | None, document_ids: Sequence[str]) -> None:
    """Keep an answer the answer cache replayed (no search ran) for feedback on its request id.

    ``version`` and ``role``: those the cached ``sources`` event names; ``document_ids``: its
    sources'. Its feedback is counted in ``quarry_feedback_total`` but in no rollout window (the
    window never counted it as served: a step's gates compare searches the versions ran).
    """
    if version is not None:
        _keep(v, name, version, role, None, document_ids[:HITS_KEPT])


def _keep(  # noqa: PLR0913 - one served request's parts
    v: View, name: str, version: int, role: str | None, step_at: float | None, document_ids: Sequence[str],
) -> None:
    """Note one served request under the current request id and key (see :func:`note`)."""
    settings = v.settings.monitor
    kept, rid = settings.feedback_requests, REQUEST_ID.get()
    if kept <= 0 or rid == "-":
        return
    now = time.monotonic()
    hits = _hashes(document_ids)
    entry = Served(version, role, step_at, hits, now)
    ledger = _ledger(v)
    key = (v.tenant_id, name, rollout.ROUTE_KEY.get(), rid)
    with ledger.lock:
        served = ledger.served
        served.pop(key, None)
        served[key] = entry
        while len(served) > kept or now - next(iter(served.values())).at > settings.feedback_ttl_s:
            served.popitem(last=False)


def _ranks_of(entry: Served, clicks: list[str], request_id: str) -> int:
    """The bit mask of the ranks of ``clicks`` among ``entry``'s kept hits (each at its first rank).

    Raises:
        InvalidRequest: A clicked id is not one of them.
    """
    ranks: dict[int, int] = {}
    for rank, h in enumerate(entry.hits):
        ranks.setdefault(h, rank)
    bits = 0
    for d in clicks:
        found = ranks.get(hash(d))
        if found is None:
            raise InvalidRequest(f"clicked document {clip(d)} is not one of the first {len(ranks)} hits "
                                 f"request {clip(request_id)} returned (clicks count on the first {HITS_KEPT})")
        bits |= 1 << found
    return bits


def give(
    v: View, name: str, request_id: str, *, rating: Rating | None = None, clicked: list[str] | None = None,
) -> dict[str, Any]:
    """Record a client's feedback on the request ``request_id`` served from collection ``name``.

    Args:
        v: The caller's view.
        name: The collection the request searched.
        request_id: The request's ``X-Request-ID``.
        rating: ``up`` or ``down`` (replaces an earlier rating of the same request), or ``None``.
        clicked: Document ids of its hits the client clicked (at most :data:`MAX_CLICKS`).

    Returns:
        ``{"request_id", "collection", "version", "rollout", "rating", "clicks"}``: the request's
        feedback as now recorded (``clicks``: how many distinct hits were clicked), its serving
        version and role.

    Raises:
        CollectionNotFound: No such collection.
        InvalidRequest: Neither a rating nor a click; too many clicks; a clicked id that is not
            one of the request's hits; feedback turned off.
        NotFound: No request of that id of this collection is known to this process for the
            caller (unknown, expired, evicted, or another key's or tenant's).
    """
    clicks = list(dict.fromkeys(clicked or ()))
    if rating is None and not clicks:
        raise InvalidRequest("feedback needs a rating ('up' or 'down') or at least one clicked document id")
    if len(clicks) > MAX_CLICKS:
        raise InvalidRequest(f"at most {MAX_CLICKS} clicked document ids per request, got {len(clicks)}")
    if v.docstore.collection_config(name) is None:
        raise CollectionNotFound(name)
    settings = v.settings.monitor
    if settings.feedback_requests <= 0:
        raise InvalidRequest("feedback is off on this server (QUARRY_MONITOR__FEEDBACK_REQUESTS=0)")
    ledger = _ledger(v)
    route_key = rollout.ROUTE_KEY.get()
    key = (v.tenant_id, name, route_key, request_id)
    current = v.docstore.get_rollout(name)  # cached; read before the ledger's lock (a search notes under it)
    with ledger.lock:
        entry = ledger.served.get(key)
        if entry is not None and time.monotonic() - entry.at > settings.feedback_ttl_s:
            del ledger.served[key]
            entry = None
        if entry is None:
            raise NotFound(
                f"no request {clip(request_id)} of collection {clip(name)} is known here: feedback names the "
                f"X-Request-ID of a search or answer this server served to the same key within "
                f"{settings.feedback_ttl_s:g} s (QUARRY_MONITOR__FEEDBACK_TTL_S)")
        bits = _ranks_of(entry, clicks, request_id)
        was_rated, was_down, was_clicked = entry.rating is not None, entry.rating == "down", entry.clicks != 0
        new_rating = rating is not None and rating != entry.rating
        new_clicks = (bits & ~entry.clicks).bit_count()
        if rating is not None:
            entry.rating = rating
        entry.clicks |= bits
        out = {"request_id": request_id, "collection": name, "version": entry.version, "rollout": entry.role,
               "rating": entry.rating, "clicks": entry.clicks.bit_count()}
        delta = ((entry.rating is not None) - was_rated, (entry.rating == "down") - was_down,
                 (entry.clicks != 0) - was_clicked)
        role, step_at = entry.role, entry.step_started_at
        if role is not None and step_at is not None and any(delta):  # under the lock: changes land in order
            unit = f"k:{route_key}" if route_key else f"q:{request_id}"
            rollout.count_feedback(v, name, current, (step_at, role == "candidate"), delta, unit)
    tenant, role_label = v.tenant_id, role or "none"
    if new_rating and rating is not None:
        FEEDBACK.labels(tenant, name, rating, role_label).inc()
    if new_clicks:
        FEEDBACK.labels(tenant, name, "click", role_label).inc(new_clicks)
    return out
