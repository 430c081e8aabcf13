"""Gray release of a collection's next version: start, step, promote, abort; route and gate the queries.

Over 500 lines by design: a gray release's lifecycle (start, step, promote, abort) and the
live-traffic figures its gates read (searches, shadow runs, clients' feedback) share one
per-process window and lock per collection, and the gate evaluation that a search or a
feedback starts calls back into the lifecycle (abort, step, promote). The pure policy and the
A/B report are apart already (:mod:`indexing.rollout`, :mod:`quarry.services.rollout_report`).

The policy (states, sticky routing, the ramp, the gates) is :mod:`indexing.rollout`'s, pure; this
module runs it over the state of record, the store and the searcher:

* :func:`start` builds the candidate as a reindex does (:meth:`~indexing.reindex.Reindexer.run`
  with ``swap=False``: copied or re-embedded, index built, recall verified, the writes made
  meanwhile replayed) and records the rollout (``shadow`` or ``canary`` at the ramp's first step);
* :func:`route` picks, for each search, the version that serves it: the rollout row is read
  from the state's cache (a write moves the change token, so every replica reads the new row
  on its next search) and the routing key (:data:`ROUTE_KEY`, the API key id, else the query)
  is hashed with the rollout's salt: two replicas route a key alike;
* :func:`observe` counts each served query per version (latency, error, degraded) in this
  process's window of the step, and runs a sampled share again on the other version in a
  background thread (the top-10 overlap); once the step's sample count is reached, the gates
  are evaluated in a background thread against the live version's figures of the same window
  (recall per version from the recall monitor); a failing gate aborts the rollout;
* :func:`step`, :func:`promote`, :func:`abort` move it by hand; each decision is appended to
  the rollout's ``decisions`` (with its figures) and to the audit log;
* :func:`count_feedback` counts a client's thumbs or click (:mod:`quarry.services.feedback`) on
  a request of the step in its version's window, for the feedback gates;
* :func:`snapshot` copies the record, the step's figures and the shadowed pairs (each shadowed
  query's latency, hits and degraded flag on both versions, the newest :data:`PAIRS_KEPT`) for
  the A/B report (:mod:`quarry.services.rollout_report`).

The candidate holds the writes up to ``synced_seq``; each step and the promote replay the
change log since into it (the promote under the write lock, then the swap, as a rollback does).
Figures are per process: with several replicas each evaluates the queries it served.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

from embedding.base import Embedder, Embeddings
from indexing.collections import CollectionConfig, FusionConfig
from indexing.docstore import AuditEntry, CollectionVersion
from indexing.reindex_build import Build, ReindexReport, new_owner
from indexing.rollout import (
    DEFAULT_SCHEDULE,
    Decision,
    Figures,
    Gates,
    Rollout,
    check_schedule,
    evaluate,
    overlap,
    routing_key,
    serves_candidate,
    stepped,
)
from indexing.versions import live_config
from quarry.errors import CollectionNotFound, ConfigError, Conflict, InvalidRequest, NotFound, QuarryError, clip
from quarry.services.versions import _record_model, live_version
from quarry.services.view import TenantSpace, View
from retrieval.results import DenseTarget, Mode, SearchResult
from retrieval.search import SearchCall
from stores.base import IndexSpec
from stores.filters import Filter

log = logging.getLogger(__name__)

ROUTE_KEY: ContextVar[str | None] = ContextVar("quarry_route_key", default=None)
"""The request's routing key (the API key id); the API sets it per request, ``None``: route by query."""

DROP_GRACE_S = 5.0  # an aborted candidate's store collection is dropped this long after (searches in flight)
SHADOW_QUEUE = 16  # shadow searches waiting at most; more are skipped (never the request path)
SHADOW_BATCH, SHADOW_WAIT_S = 8, 0.25  # shadow searches run together: as many as gathered within 0.25 s, or 8
MAX_WINDOW = 20_000  # latencies kept per version and step
PAIRS_KEPT = 1_000  # shadowed queries kept per collection for the A/B report's paired test (the newest)
MAX_KEYS = 10_000  # routing keys whose served queries a step's window counts (the feedback gates' populations)
MAX_UNITS = 100_000  # feedback senders a window counts per version


@dataclass(frozen=True)
class Route:
    """Where one search goes: the serving version, and the other one to shadow it on (or ``None``)."""

    rollout: Rollout
    version: CollectionVersion
    candidate: bool
    shadow: CollectionVersion | None


@dataclass
class _Window:
    """This process's figures of one step (``started``: the rollout's ``step_started_at``).

    ``order``: the rollout's ``(candidate, step)`` it counts; a search routed in an earlier step
    of the same rollout never replaces it (see :func:`_observe`).
    """

    started: float
    order: tuple[int, int] = (0, -1)
    candidate: Figures = field(default_factory=Figures)
    live: Figures = field(default_factory=Figures)
    next_eval: int = 0
    evaluating: bool = False
    passed: bool = False
    feedback: int = 0  # feedback requests counted in the window
    next_feedback: int = 0  # ... at which the gates are evaluated again (a step held already)
    by_key: dict[str | None, list[int]] = field(default_factory=dict)  # routing key -> [candidate, live] served
    clickers: set[str | None] = field(default_factory=set)  # routing keys that sent a click
    raters: tuple[set[str], set[str]] = field(default_factory=lambda: (set(), set()))  # units that rated each


@dataclass(frozen=True, slots=True)
class Pair:
    """One shadowed query, as both versions ran it (the A/B report's paired test).

    Attributes:
        candidate: The rollout's candidate version number (pairs of an earlier rollout are left out).
        step: The rollout's step when it was served (``-1``: shadow).
        served_by_candidate: Which version served it (the other ran it in the background).
        live_ms: The live version's search latency, milliseconds (the served side: the request's
            search; the shadowed side: from its batch's start to its last stage, see :func:`_compared`).
        candidate_ms: The candidate's.
        live_hits: Hits the live version returned.
        candidate_hits: Hits the candidate returned.
        live_degraded: Whether the live version's answer was degraded.
        candidate_degraded: Whether the candidate's was.
        overlap: Top-10 overlap of the two answers (0..1).
        top1_same: Whether both answers have the same first document.
    """

    candidate: int
    step: int
    served_by_candidate: bool
    live_ms: float
    candidate_ms: float
    live_hits: int
    candidate_hits: int
    live_degraded: bool
    candidate_degraded: bool
    overlap: float
    top1_same: bool


@dataclass(frozen=True)
class _Shadowed:
    """One served search waiting for its shadow run on the other version."""

    v: View
    name: str
    chosen: Route
    result: SearchResult
    asked: Asked
    window: _Window
    served_s: float  # the served search's latency, seconds (the A/B report's pair)


@dataclass(eq=False)
class _Tracker:
    """Per tenant space: the step windows, the shadowed pairs, the shadow runner (one thread, while runs wait)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    windows: dict[str, _Window] = field(default_factory=dict)
    pairs: dict[str, deque[Pair]] = field(default_factory=dict)
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="rollout"))
    waiting: list[_Shadowed] = field(default_factory=list)
    draining: bool = False
    full: threading.Event = field(default_factory=threading.Event)  # SHADOW_BATCH runs wait: no more gathering
    queued: int = 0
    shadowed: int = 0
    skipped: int = 0


_TRACKERS: weakref.WeakKeyDictionary[TenantSpace, _Tracker] = weakref.WeakKeyDictionary()
_TRACKERS_LOCK = threading.Lock()


def _tracker(space: TenantSpace) -> _Tracker:
    found = _TRACKERS.get(space)
    if found is None:
        with _TRACKERS_LOCK:
            found = _TRACKERS.setdefault(space, _Tracker())
    return found


# --- reading -------------------------------------------------------------------------------
def _config(v: View, name: str) -> CollectionConfig:
    raw = v.docstore.collection_config(name)
    if raw is None:
        raise CollectionNotFound(name)
    return CollectionConfig.model_validate(raw)


def _version(v: View, name: str, number: int) -> CollectionVersion:
    cached = v.space.versions.get((name, number))
    if cached is not None:
        return cached
    found = v.docstore.get_version(name, number)
    if found is None:
        raise NotFound(f"collection {clip(name)} has no version {number}")
    v.space.versions[(name, number)] = found
    return found


def get(v: View, name: str) -> Rollout:
    """The collection's newest rollout.

    Raises:
        CollectionNotFound: No such collection.
        NotFound: It never had one.
    """
    _config(v, name)
    found = v.docstore.get_rollout(name)
    if found is None:
        raise NotFound(f"collection {clip(name)} has no rollout")
    return found


def _active(v: View, name: str) -> Rollout:
    found = get(v, name)
    if not found.active:
        raise Conflict(f"the rollout of collection {clip(name)} is {found.state}: start another one")
    return found


def route(v: View, name: str, query: str) -> Route | None:
    """The version that serves this search of ``name``; ``None``: no active rollout (the live one).

    Reads only cached state in the common case (the rollout row, the versions). A rollout whose
    baseline is no longer live (a reindex or a promote swapped meanwhile) routes nothing.
    """
    rollout = v.docstore.get_rollout(name)
    if rollout is None or not rollout.active:
        return None
    live = live_version(v, name)
    if live.version != rollout.baseline:
        return None
    candidate = _version(v, name, rollout.candidate)
    to_candidate = serves_candidate(rollout, routing_key(ROUTE_KEY.get(), query))
    served, other = (candidate, live) if to_candidate else (live, candidate)
    shadow = other if rollout.shadow_rate > 0 and random.random() < rollout.shadow_rate else None  # noqa: S311
    return Route(rollout, served, to_candidate, shadow)


def dense_target(
    v: View, cfg: CollectionConfig, mode: Mode, query: str
) -> tuple[CollectionConfig, DenseTarget | None, CollectionVersion, Route | None]:
    """:func:`quarry.services.versions.dense_target` for the version :func:`route` picks (and the route)."""
    chosen = route(v, cfg.name, query)
    version = live_version(v, cfg.name) if chosen is None else chosen.version
    view = live_config(cfg, version)
    if mode == "bm25":
        return view, None, version, chosen
    return view, DenseTarget(version.physical_name, v.engines.models.model_for(version)[1]), version, chosen


# --- the request path ----------------------------------------------------------------------
@dataclass(frozen=True)
class Asked:
    """A search's own arguments, for running it again on the other version.

    ``embedded``: the query's vector the served search used (asked of the searcher's encoder),
    reused by the shadow run when the other version's model is the same (``None``: embed again).
    """

    cfg: CollectionConfig
    query: str
    top_k: int
    mode: Mode
    flt: Filter | None
    fusion: FusionConfig | None
    within: Any
    embedded: Future[Embeddings] | None = None


def observe(  # noqa: PLR0913 - one served search
    v: View, name: str, chosen: Route | None, elapsed_s: float, result: SearchResult | None, asked: Asked | None,
) -> None:
    """Count one served search in its version's window; queue its shadow run; start the gates when due.

    ``result`` ``None``: it failed. Never raises, never blocks on the state or a store.
    """
    if chosen is None:
        return
    try:
        _observe(v, name, chosen, elapsed_s, result, asked)
    except Exception:  # the request is served; its figures are best effort
        log.exception("rollout of %r: could not record a search", name)


def _observe(  # noqa: PLR0913
    v: View, name: str, chosen: Route, elapsed_s: float, result: SearchResult | None, asked: Asked | None,
) -> None:
    rollout = chosen.rollout
    tracker = _tracker(v.space)
    due = False
    order = (rollout.candidate, rollout.step)
    with tracker.lock:
        window = tracker.windows.get(name)
        if window is not None and window.started != rollout.step_started_at \
                and window.order[0] == order[0] and window.order[1] > order[1]:
            return  # routed before the step moved, ended after: its step's window is gone (kept: the new one's)
        if window is None or window.started != rollout.step_started_at:
            window = tracker.windows[name] = _Window(rollout.step_started_at, order, next_eval=rollout.step_samples)
        figures = window.candidate if chosen.candidate else window.live
        figures.queries += 1
        _count_key(window, chosen.candidate)
        if result is None:
            figures.errors += 1
        else:
            figures.degraded += bool(result.degraded)
            if len(figures.latencies_ms) < MAX_WINDOW:
                figures.latencies_ms.append(elapsed_s * 1000.0)
        held = window.candidate.queries if rollout.state == "canary" else len(window.candidate.overlap)
        if held >= window.next_eval and not window.evaluating:
            window.evaluating, due = True, True
        shadow = chosen.shadow is not None and result is not None and asked is not None
        if shadow and tracker.queued >= SHADOW_QUEUE:
            tracker.skipped += 1
            shadow = False
        if shadow:
            tracker.queued += 1
    if shadow and chosen.shadow is not None and result is not None and asked is not None:
        with tracker.lock:
            tracker.waiting.append(_Shadowed(v, name, chosen, result, asked, window, elapsed_s))
            start, tracker.draining = not tracker.draining, True
            if len(tracker.waiting) >= SHADOW_BATCH:
                tracker.full.set()
        if start:
            tracker.pool.submit(_drain, tracker)
    if due:
        threading.Thread(target=_gate, args=(v, name, rollout, window), name=f"rollout-gate-{name}",
                         daemon=True).start()


def _count_key(window: _Window, candidate: bool) -> None:
    """Count a served query under its routing key (the click gate's population); under the lock."""
    route_key = ROUTE_KEY.get()
    served = window.by_key.get(route_key)
    if served is None and len(window.by_key) < MAX_KEYS:  # past it, a new key's clicks count nowhere
        served = window.by_key[route_key] = [0, 0]
    if served is not None:
        served[0 if candidate else 1] += 1


def _ids(result: SearchResult) -> list[str]:
    return [h.document_id for h in result.hits]


def _drain(tracker: _Tracker) -> None:
    """The shadow runner: run the waiting shadow searches, together, until none is left.

    It lets runs gather for :data:`SHADOW_WAIT_S` (or :data:`SHADOW_BATCH` of them) first: run
    together, their ANN searches share store calls (a lone one costs ~3x the CPU per query).
    """
    while True:
        tracker.full.wait(SHADOW_WAIT_S)
        with tracker.lock:
            batch, tracker.waiting = tracker.waiting, []
            tracker.full.clear()
            if not batch:
                tracker.draining = False
                return
        try:
            _shadow(batch)
        except Exception:  # off the request path: logged, never served
            log.exception("rollout: shadow searches failed")
        finally:
            with tracker.lock:
                tracker.queued -= len(batch)


def _shadow(batch: list[_Shadowed]) -> None:
    """Run each search again on the other version (all at once); note the top-10 overlaps, the candidate's figures."""
    v = batch[0].v
    calls = []
    for job in batch:
        other, asked = job.chosen.shadow, job.asked
        assert other is not None  # noqa: S101 - checked by the caller
        dense = None if asked.mode == "bm25" else DenseTarget(other.physical_name, v.engines.models.model_for(other)[1])
        calls.append(SearchCall(live_config(asked.cfg, other), asked.query, asked.top_k, asked.mode, asked.flt,
                                asked.fusion, dense, asked.within, asked.embedded))
    started = time.perf_counter()
    outcomes = v.space.searcher.search_together(calls, v.settings.search.dense_timeout_s)  # as a served one waits
    for job, call, outcome in zip(batch, calls, outcomes, strict=True):
        try:
            _compared(job, call, outcome, started)
        except Exception:  # off the request path: a failed shadow search is logged, not served
            log.exception("rollout of %r: a shadow search failed", job.name)


def _compared(job: _Shadowed, call: SearchCall, again: SearchResult | Exception, started: float) -> None:
    """One shadow run's outcome in its window: the overlap; in shadow mode the candidate's figures too.

    Its latency runs from the batch's start to its own last stage, plus (when it reused the
    served search's vector) the served search's wait for that vector.

    Raises:
        Exception: The shadow search's own error (counted first as the candidate's, in shadow mode).
    """
    v, chosen, window = job.v, job.chosen, job.window
    tracker = _tracker(v.space)
    other = chosen.shadow
    assert other is not None  # noqa: S101 - checked by the caller
    timed = chosen.rollout.state == "shadow" and other.version == chosen.rollout.candidate
    if isinstance(again, Exception):
        if timed and isinstance(again, QuarryError):
            with tracker.lock:
                window.candidate.queries += 1
                window.candidate.errors += 1
        raise again
    ended = again.stage_times.get("hydrate", (started, time.perf_counter()))[1]
    took_ms = (ended - started) * 1000.0
    if call.embedded is not None and call.target is not None and call.target.encoder is v.engines.query_embedder:
        # the served search's vector was reused: count the wait for it, as a search of its own would
        took_ms += max(0.0, job.result.timings_ms.get("embed", 0.0) - again.timings_ms.get("embed", 0.0))
    served_ids, other_ids = _ids(job.result), _ids(again)
    share = overlap(served_ids, other_ids)
    pair = _pair(chosen, job.served_s * 1000.0, job.result, took_ms, again, share, served_ids[:1] == other_ids[:1])
    with tracker.lock:
        window.candidate.overlap.append(share)
        tracker.shadowed += 1
        _keep(tracker, job.name, pair)
        if timed:  # in shadow mode the candidate serves nobody: its shadow runs are its figures
            window.candidate.queries += 1
            window.candidate.degraded += bool(again.degraded)
            if len(window.candidate.latencies_ms) < MAX_WINDOW:
                window.candidate.latencies_ms.append(took_ms)
    if chosen.rollout.state == "shadow":  # shadow mode: the pairs are what the step is held for
        due = False
        with tracker.lock:
            if len(window.candidate.overlap) >= window.next_eval and not window.evaluating:
                window.evaluating, due = True, True
        if due:
            _gate(v, job.name, chosen.rollout, window)


def _pair(  # noqa: PLR0913 - both sides of one shadowed query
    chosen: Route, served_ms: float, served: SearchResult, shadow_ms: float, shadow: SearchResult, share: float,
    top1_same: bool,
) -> Pair:
    cand, live = (served, shadow) if chosen.candidate else (shadow, served)
    cand_ms, live_ms = (served_ms, shadow_ms) if chosen.candidate else (shadow_ms, served_ms)
    return Pair(chosen.rollout.candidate, chosen.rollout.step, chosen.candidate, live_ms, cand_ms, len(live.hits),
                len(cand.hits), bool(live.degraded), bool(cand.degraded), share, top1_same)


def _keep(tracker: _Tracker, name: str, pair: Pair) -> None:
    """Keep ``pair`` among the newest :data:`PAIRS_KEPT` of ``name`` (a new candidate starts afresh); under the lock."""
    kept = tracker.pairs.get(name)
    if kept is None or (kept and kept[-1].candidate != pair.candidate):
        kept = tracker.pairs[name] = deque(maxlen=PAIRS_KEPT)
    kept.append(pair)


FEEDBACK_EVAL_EVERY = 10  # once a step is held: feedback requests between two gate evaluations they start


def count_feedback(  # noqa: PLR0913 - one feedback's changes
    v: View, name: str, rollout: Rollout | None, served: tuple[float, bool], change: tuple[int, int, int],
    unit: str,
) -> None:
    """Count a client's feedback on a request a step served, in that step's window.

    Args:
        v: The caller's view.
        name: The collection.
        rollout: Its rollout as the caller read it (cached; ``None``: none).
        served: The step's ``step_started_at`` that served the request, and whether the candidate did.
        change: The changes of that version's ``rated``, ``down`` and ``clicked`` counts (-1, 0 or
            +1 each: a request rated again, down then up, moves ``down`` by -1).
        unit: Who sent it, as the gates count populations: ``k:<API key id>``, or ``q:<request id>``
            for a request without a key (routed by its query: each is a unit of its own).

    Feedback on a request of an earlier step (or another process's window) is not counted. Once
    the step is held (its sample count served), every :data:`FEEDBACK_EVAL_EVERY` feedback
    requests evaluate the gates again, in a background thread, as a search does: feedback often
    comes after the searches. Takes only the tracker's lock (the caller may hold the feedback
    ledger's: its changes then land in the order they were made).
    """
    step_started_at, candidate = served
    rated, down, clicked = change
    tracker = _tracker(v.space)
    due = False
    with tracker.lock:
        window = tracker.windows.get(name)
        if window is None or window.started != step_started_at:
            return
        figures = window.candidate if candidate else window.live
        figures.rated += rated
        figures.down += down
        figures.clicked += clicked
        raters = window.raters[0 if candidate else 1]
        if rated > 0 and len(raters) < MAX_UNITS:
            raters.add(unit)
        if clicked > 0:
            window.clickers.add(ROUTE_KEY.get())
        window.feedback += 1
        held = (rollout is not None and rollout.state == "canary" and rollout.step_started_at == step_started_at
                and window.candidate.queries >= rollout.step_samples)
        if held and window.feedback >= window.next_feedback and not window.evaluating:
            window.evaluating, due = True, True
            window.next_feedback = window.feedback + FEEDBACK_EVAL_EVERY
    if due and rollout is not None:
        threading.Thread(target=_gate, args=(v, name, rollout, window), name=f"rollout-gate-{name}",
                         daemon=True).start()


def _populations(window: _Window, candidate: Figures, live: Figures) -> None:
    """Set the feedback populations of ``candidate`` and ``live`` (copies) from ``window``; under the lock.

    ``click_queries``: the queries each version served to the keys that sent a click in the
    window (a key that never clicks, an OpenAI client or a batch job, says nothing of either
    version's click-through); ``clickers``: how many of those keys it served (each request of
    the key-less, routed by its query, a key of its own); ``raters``: the units that rated its
    requests.
    """
    for i, figures in enumerate((candidate, live)):
        served = [(key, window.by_key[key][i]) for key in window.clickers if key in window.by_key]
        figures.click_queries = sum(n for _, n in served)
        figures.clickers = sum(n if key is None else 1 for key, n in served if n > 0)
        figures.raters = len(window.raters[i])


def _gate(v: View, name: str, seen: Rollout, window: _Window) -> None:
    """Evaluate the step's gates (a background thread); abort on a failure, advance when ``auto``."""
    tracker = _tracker(v.space)
    v = View(v.engines, v.space)  # the operator's view of the space: a tenant's search may have started it
    try:
        v.space.monitor.drain(timeout_s=10.0)  # the sampled searches measured so far
        rollout = v.docstore.get_rollout(name)
        if rollout is None or not rollout.active or rollout.step_started_at != seen.step_started_at:
            return  # moved on meanwhile (by hand, or by another replica)
        decision = gates_now(v, name, rollout, window)
        if not decision.passed:
            abort(v, name, by=None, reason="gate failed: " + "; ".join(decision.reasons), decision=decision)
            return
        if window.passed and not rollout.auto:
            return  # said once per step; the gates keep being checked
        record = _decision("gate", rollout, None, decision, "no gate failed" + (
            f" ({', '.join(decision.pending)} without enough samples yet)" if decision.pending else "") + (
            f" ({', '.join(decision.skipped)} skipped: too little feedback)" if decision.skipped else ""))
        fresh = replace(rollout, decisions=(*rollout.decisions, record), updated_at=time.time())
        if not window.passed and v.docstore.put_rollout(fresh, expect=rollout):
            _audit(v, "rollout.gate", name, None, record)
        window.passed = True
        if rollout.auto and not decision.pending:
            if rollout.step + 1 < len(rollout.schedule):
                step(v, name, by=None)
            else:
                promote(v, name, by=None)
    except Exception:
        log.exception("rollout of %r: the gate evaluation failed", name)
    finally:
        with tracker.lock:
            window.evaluating = False
            window.next_eval += max(10, seen.step_samples // 4)


def gates_now(v: View, name: str, rollout: Rollout, window: _Window | None = None) -> Decision:
    """The gates over this process's window of the current step (recall from the recall monitor)."""
    if window is None:
        window = _tracker(v.space).windows.get(name) or _Window(rollout.step_started_at)
    candidate = _version(v, name, rollout.candidate)
    live = _version(v, name, rollout.baseline)
    with _tracker(v.space).lock:
        cand = replace(window.candidate, latencies_ms=list(window.candidate.latencies_ms),
                       overlap=list(window.candidate.overlap))
        base = replace(window.live, latencies_ms=list(window.live.latencies_ms), overlap=list(window.live.overlap))
        _populations(window, cand, base)
    cand.recall = _recall(v, name, candidate, rollout.step_started_at)
    base.recall = _recall(v, name, live, rollout.step_started_at)
    return evaluate(cand, base, Gates.from_json(rollout.gates))


def _recall(v: View, name: str, version: CollectionVersion, since: float) -> list[float]:
    window = v.space.monitor.window(name, version.physical_name, swapped_at=since)
    return [r for values in window.values() for r in values]


# --- the actions ---------------------------------------------------------------------------
def start(  # noqa: PLR0913 - the rollout's parameters
    v: View,
    name: str,
    *,
    model: str | None = None,
    index: str | IndexSpec | None = None,
    mode: str = "canary",
    schedule: Sequence[float] = DEFAULT_SCHEDULE,
    step_samples: int = 200,
    shadow_rate: float = 0.05,
    auto: bool = False,
    gates: dict[str, Any] | None = None,
    by: str | None = None,
) -> Rollout:
    """Build a candidate version of ``name`` beside the live one and start routing to it.

    Args:
        v: The caller's view (a shared collection: the operator's only).
        name: The collection.
        model: Another embedding model's URL (``None``: the live one's).
        index: ``auto``/``None`` (the planner's), an index kind, or a whole :class:`IndexSpec`.
        mode: ``shadow`` (compare only) or ``canary`` (serve the schedule's first share).
        schedule: The ramp in percent, ascending, ending at 100.
        step_samples: Queries each step is held for before its gates are evaluated.
        shadow_rate: Share of queries also run on the other version (0..1).
        auto: Advance (and at the end promote) by itself when a step's gates pass.
        gates: Bounds of :class:`indexing.rollout.Gates` (the others at their defaults).
        by: Who asked (an API key id), for the audit log.

    Raises:
        CollectionNotFound: No such collection.
        Forbidden: A shared collection, asked by another tenant than the operator's.
        InvalidRequest: A bad mode, schedule, sample count, rate or gate, or a ``model`` URL this
            server cannot open (empty, an unknown scheme or model, a missing extra).
        Conflict: A rollout of it is active already.
        ReindexRunning: A reindex of it holds the lease.
        ReindexFailed: The candidate failed its offline recall check (nothing is routed).
    """
    cfg = _config(v, name)
    v.ns.require_operator(name, "roll out")
    if mode not in ("shadow", "canary"):
        raise InvalidRequest(f"mode must be 'shadow' or 'canary', got {clip(mode)}")
    try:
        steps = check_schedule(schedule)
        bounds = Gates.from_json(gates)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"rollout of {clip(name)}: {exc}") from exc
    if step_samples < 1 or not 0.0 <= shadow_rate <= 1.0:
        raise InvalidRequest(f"step_samples must be >= 1 and shadow_rate in [0, 1], got {step_samples}, "
                             f"{shadow_rate:g}")
    if model is not None and not model.strip():
        raise InvalidRequest("model must be an embedding model's URL (or left out: the live one's), got ''")
    current = v.docstore.get_rollout(name)
    if current is not None and current.active:
        raise Conflict(f"a rollout of collection {clip(name)} is {current.state} (version {current.candidate}): "
                       "promote or abort it first")
    space = v.space
    owner = new_owner()
    space.reindexer.acquire(name, owner)
    try:
        live = live_version(v, name)
        embedder, url = _candidate_model(v, live, model)
        same = bool(embedder.fingerprint) and embedder.fingerprint == live.model_fingerprint
        vectors = v.docstore.counts(name)[1]
        spec = index if isinstance(index, IndexSpec) else space.index_spec(index, vectors, embedder.dim, cfg.metric)
        build = Build(live_config(cfg, live), live, embedder, url, same, spec)
        report = space.reindexer.run(build, owner, swap=False)
    finally:
        v.docstore.release_lease(f"reindex:{name}", owner)
    now = time.time()
    canary = mode == "canary"
    rollout = Rollout(
        name, report.version, live.version, "canary" if canary else "shadow",
        percent=steps[0] if canary else 0.0, step=0 if canary else -1, schedule=steps, step_samples=step_samples,
        shadow_rate=shadow_rate, auto=auto, gates={**bounds.__dict__}, salt=uuid.uuid4().hex,
        synced_seq=report.counters.get("seq", 0), started_at=now, updated_at=now, step_started_at=now,
    )
    record = {"at": now, "action": "start", "by": by, "step": rollout.step, "percent": rollout.percent,
              "reason": f"candidate version {report.version} built ({report.chunks} vectors, offline recall "
                        f"{report.recall if report.recall is not None else float('nan'):.3f})",
              "index": build.index.kind if build.index else None}
    rollout = replace(rollout, decisions=(record,))
    v.docstore.put_rollout(rollout)
    _audit(v, "rollout.start", name, by, {**record, "candidate": report.version, "baseline": live.version})
    return rollout


def _candidate_model(v: View, live: CollectionVersion, model: str | None) -> tuple[Embedder, str | None]:
    """The candidate's embedder (warmed up) and URL; a model URL the server cannot open is the caller's error.

    Raises:
        InvalidRequest: ``model`` names an unknown scheme or model, or one whose extra is not installed.
    """
    try:
        embedder, url = v.engines.models.for_reindex(live, model)
        embedder.warm_up()
    except ConfigError as exc:
        if model is None:  # the live version's own model: the server's configuration, not the request
            raise
        raise InvalidRequest(f"model {clip(model)}: {exc}") from exc
    return embedder, url


def step(v: View, name: str, *, by: str | None = None) -> Rollout:
    """Move the rollout to its next share (a shadow becomes a canary at the first step).

    Raises:
        CollectionNotFound: No such collection.
        NotFound: It has no rollout.
        Conflict: The rollout is not active, on its last step (promote it), or changed meanwhile.
    """
    v.ns.require_operator(name, "roll out")
    rollout = _active(v, name)
    synced = _sync(v, name, rollout)
    try:
        moved = stepped(rollout, time.time())
    except ValueError as exc:
        raise Conflict(str(exc)) from exc
    record = _decision("step", moved, by, None, f"{rollout.percent:g} % -> {moved.percent:g} %")
    moved = replace(moved, synced_seq=synced, decisions=(*rollout.decisions, record))
    if not v.docstore.put_rollout(moved, expect=rollout):
        raise Conflict(f"the rollout of collection {clip(name)} changed meanwhile; read it and try again")
    _audit(v, "rollout.step", name, by, record)
    return moved


def promote(v: View, name: str, *, by: str | None = None) -> Rollout:
    """Make the candidate the live version (the writes since its last sync replayed, then swapped).

    Raises:
        CollectionNotFound: No such collection.
        NotFound: It has no rollout.
        Conflict: The rollout is not active, or its baseline is no longer live.
        ReindexRunning: A reindex of it holds the lease.
    """
    v.ns.require_operator(name, "roll out")
    rollout = _active(v, name)
    live = live_version(v, name)
    if live.version != rollout.baseline:
        raise Conflict(f"collection {clip(name)} serves version {live.version}, not the rollout's baseline "
                       f"{rollout.baseline}: abort the rollout")
    candidate = _version(v, name, rollout.candidate)
    owner = new_owner()
    v.space.reindexer.acquire(name, owner)
    try:
        synced = _sync(v, name, rollout)
        embedder = v.engines.models.model_for(candidate)[0]
        embedder.warm_up()
        build = Build(live_config(_config(v, name), live), replace(live, built_from_seq=synced), embedder,
                      candidate.model_name, False, None)
        v.space.reindexer.rollback(build, candidate, lambda: _record_model(v, name, embedder, candidate))
        v.space.monitor.serving(name, candidate.physical_name)
        v.space.bm25.invalidate(name)
    finally:
        v.docstore.release_lease(f"reindex:{name}", owner)
    now = time.time()
    done = replace(rollout, state="live", percent=100.0, updated_at=now, step_started_at=now, synced_seq=synced)
    record = _decision("promote", done, by, None, f"version {candidate.version} is live")
    done = replace(done, decisions=(*rollout.decisions, record))
    v.docstore.put_rollout(done)
    _audit(v, "rollout.promote", name, by, record)
    return done


def abort(
    v: View, name: str, *, by: str | None = None, reason: str = "asked", decision: Decision | None = None,
    wait: bool = False,
) -> Rollout:
    """Roll the rollout back: the live version serves everything; the candidate is dropped.

    ``decision``: the failing gate's (an automatic rollback), kept with its figures. The
    candidate's store collection is dropped :data:`DROP_GRACE_S` later (searches in flight on it
    end first): in a background timer, or before returning when ``wait`` (a process about to exit).

    Raises:
        CollectionNotFound: No such collection.
        NotFound: It has no rollout.
        Conflict: The rollout is not active (or another replica ended it meanwhile).
    """
    v.ns.require_operator(name, "roll out")
    rollout = _active(v, name)
    now = time.time()
    action = "rollback" if decision is not None else "abort"
    done = replace(rollout, state="rolled_back", percent=0.0, updated_at=now)
    record = _decision(action, done, by, decision, reason)
    done = replace(done, decisions=(*rollout.decisions, record))
    if not v.docstore.put_rollout(done, expect=rollout):
        raise Conflict(f"the rollout of collection {clip(name)} changed meanwhile; read it and try again")
    _audit(v, f"rollout.{action}", name, by, record)
    candidate = _version(v, name, rollout.candidate)
    v.docstore.set_version_state(name, rollout.candidate, "failed")
    if wait:
        time.sleep(DROP_GRACE_S)
        _drop(v, candidate.physical_name)
    else:
        timer = threading.Timer(DROP_GRACE_S, _drop, args=(v, candidate.physical_name))
        timer.daemon = True
        timer.start()
    log.warning("collection %r: rollout of version %d rolled back (%s)", name, rollout.candidate, reason)
    return done


def _drop(v: View, physical: str) -> None:
    try:
        v.store.drop_collection(physical)
    except Exception:  # the store was closed meanwhile, or is down: a later reindex drops it
        log.warning("could not drop the aborted candidate %r", physical, exc_info=True)


def _sync(v: View, name: str, rollout: Rollout) -> int:
    """Replay the writes since ``rollout.synced_seq`` into the candidate; returns the seq it holds now."""
    seq = rollout.synced_seq
    if v.docstore.version(name) <= seq:
        return seq
    live = live_version(v, name)
    candidate = _version(v, name, rollout.candidate)
    embedder = v.engines.models.model_for(candidate)[0]
    build = Build(live_config(_config(v, name), live), live, embedder, candidate.model_name, False, None,
                  dict(candidate.chunking))
    report = ReindexReport(version=candidate.version, previous=live.version)
    while changes := v.docstore.change_log_since(name, seq, limit=1000):
        v.space.reindexer.refresh(build, candidate.physical_name, sorted({c.document_id for c in changes}), report)
        seq = changes[-1].seq
    return seq


def _decision(
    action: str, rollout: Rollout, by: str | None, decision: Decision | None, reason: str,
) -> dict[str, Any]:
    out: dict[str, Any] = {"at": time.time(), "action": action, "by": by, "step": rollout.step,
                           "percent": rollout.percent, "reason": reason}
    if decision is not None:
        out.update(passed=decision.passed, failed=list(decision.failed), pending=list(decision.pending),
                   skipped=list(decision.skipped), figures=decision.figures)
    return out


def _audit(v: View, action: str, name: str, by: str | None, detail: dict[str, Any]) -> None:
    try:
        v.docstore.append_audit(AuditEntry(action=action, key_id=by, tenant_id=v.tenant_id, target=name,
                                           detail=detail))
    except QuarryError:
        log.exception("rollout of %r: could not write %s to the audit log", name, action)


def describe(v: View, name: str) -> dict[str, Any] | None:
    """The collection's rollout for ``describe``: the record, and this process's figures of the step."""
    rollout = v.docstore.get_rollout(name)
    if rollout is None:
        return None
    out = rollout.to_json()
    tracker = _tracker(v.space)
    with tracker.lock:
        window = tracker.windows.get(name)
        if window is not None and window.started == rollout.step_started_at:
            cand, live = replace(window.candidate), replace(window.live)
            _populations(window, cand, live)
            out["window"] = {"candidate": cand.summary(), "live": live.summary()}
        out["shadow"] = {"run": tracker.shadowed, "skipped": tracker.skipped}
    return out


@dataclass(frozen=True)
class Snapshot:
    """What the A/B report (:mod:`quarry.services.rollout_report`) reads of a rollout in this process.

    Attributes:
        rollout: The record (state, versions, ramp, decisions with their figures).
        live: The live version's figures of the current step's window (``None``: this process has none),
            with its sampled recall since the step started.
        candidate: The candidate's.
        pairs: The shadowed queries of this rollout (the newest :data:`PAIRS_KEPT`), oldest first.
        shadow_run: Shadow searches run by this process (every rollout of its tenant space).
        shadow_skipped: Shadow searches skipped on a full queue.
    """

    rollout: Rollout
    live: Figures | None
    candidate: Figures | None
    pairs: tuple[Pair, ...]
    shadow_run: int
    shadow_skipped: int


def snapshot(v: View, name: str) -> Snapshot:
    """A copy of the rollout's record and of this process's figures and pairs (see :class:`Snapshot`).

    Raises:
        CollectionNotFound: No such collection.
        NotFound: It never had a rollout.
    """
    rollout = get(v, name)
    tracker = _tracker(v.space)
    with tracker.lock:
        window = tracker.windows.get(name)
        if window is not None and window.started != rollout.step_started_at:
            window = None
        figures = None if window is None else tuple(
            replace(f, latencies_ms=list(f.latencies_ms), overlap=list(f.overlap), recall=list(f.recall))
            for f in (window.live, window.candidate))
        if window is not None and figures is not None:
            _populations(window, figures[1], figures[0])
        pairs = tuple(p for p in tracker.pairs.get(name, ()) if p.candidate == rollout.candidate)
        run, skipped = tracker.shadowed, tracker.skipped
    if figures is None:
        return Snapshot(rollout, None, None, pairs, run, skipped)
    live, cand = figures
    for fig, number in ((live, rollout.baseline), (cand, rollout.candidate)):
        try:
            fig.recall = _recall(v, name, _version(v, name, number), rollout.step_started_at)
        except QuarryError:  # a version gone meanwhile: no recall figures
            fig.recall = []
    return Snapshot(rollout, live, cand, pairs, run, skipped)
