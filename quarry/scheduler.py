"""Scheduled and triggered reindexing inside ``quarry serve`` (APScheduler 3).

A :class:`ReindexScheduler` runs in each server process (every worker and replica may run
one) and starts the same reindex jobs as ``POST /v1/collections/{name}/reindex`` (the jobs
table, ``GET /v1/jobs/{id}``), their ``params`` saying who and why: ``trigger`` (``schedule``,
``recall``, ``growth``, ``churn`` or ``drift``), ``reason`` and ``by`` (``host:pid:random``).

==========  ===============================================================================
trigger     fires when (``QUARRY_REINDEX__*``, all off by default)
==========  ===============================================================================
schedule    ``SCHEDULE`` (every collection) or ``SCHEDULES[name]``: an interval or a crontab
recall      ``ON_RECALL``: the recall monitor's trigger fired on samples of the live version
            (any selectivity bucket below the floor; its figures start afresh at a swap)
growth      ``ON_GROWTH``: the planner, for the current vector count, picks another index kind
            or build parameters than the live version's (an index asked for by hand is kept)
churn       ``CHURN_FRACTION``: documents deleted since the live version was built exceed that
            share of the documents stored now plus those deleted
drift       ``ON_DRIFT``: the live version's queries drifted from its reference (the alert
            ``QuarryQueryDrift``'s condition, :meth:`monitoring.drift.QueryDrift.trigger`)
==========  ===============================================================================

A drifted workload is also named as a probable cause in the recall trigger's reason when both
hold. A drift reindex rebuilds the live version with its own model and index plan: it does not
make the model fit the new queries; its record (``trigger`` ``drift``, the figures in ``reason``)
is what tells the operator to re-tune fusion or reindex with another model. The new version's
reference starts from the drifted workload, so the trigger fires once per change of workload.

At most one reindex per collection, across processes: a start takes the collection's reindex
lease first (another holder: skipped), then checks again, under the lease, that the reindex is
still due (a trigger's condition still holds against the now-live version; no scheduled job of
the collection started within half a period, by any process, so replicas firing at the same
time start one); only then is the job created. Only the default tenant's collections are
scheduled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from typing import TYPE_CHECKING

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from indexing.reindex_build import new_owner
from quarry.errors import CollectionNotFound, ReindexRunning
from quarry.schedules import parse_schedule, period_s

if TYPE_CHECKING:
    from indexing.docstore import Job
    from quarry.service import Quarry
    from quarry.settings import ReindexSettings

log = logging.getLogger(__name__)

TRIGGERS = ("schedule", "recall", "growth", "churn", "drift")


# --- the triggers: each returns why a reindex is due, or None ------------------------------------
def growth_reason(service: Quarry, name: str) -> str | None:
    """Why the live index no longer fits the collection's size, or ``None``.

    Compares the planner's choice for the live version's current vector count with the index
    the collection has (kind and build parameters; search parameters change without a
    rebuild). An index asked for by hand (``--index``) is never second-guessed.
    """
    live = service.live_version(name)
    if live.index_plan.get("reason") == "asked for":
        return None
    built = service.get_collection(name).index
    if not built.get("kind"):
        return None
    count = service.store.count(live.physical_name)
    plan = service.reindexer.plan(count, live.dim or service.get_collection(name).dim)
    params = dict(built.get("params") or {})
    if plan.spec.kind == built["kind"] and dict(plan.spec.params) == params:
        return None
    planned = built.get("planned_for_vectors")
    was = f" (planned for {planned:,} vectors)" if isinstance(planned, int) else ""
    return (f"for {count:,} vectors the planner picks {plan.spec.kind} {dict(plan.spec.params)}; "
            f"the live version has {built['kind']} {params}{was}")


def churn_reason(service: Quarry, name: str, fraction: float) -> str | None:
    """Why the deletes since the live version was built call for a rebuild, or ``None``.

    Reads the change log after the version's ``built_from_seq``: a document whose last change
    is a delete counts as deleted; the share is ``deleted / (documents now + deleted)``.
    """
    if fraction <= 0:
        return None
    live = service.live_version(name)
    seq = live.built_from_seq or 0
    last: dict[str, str] = {}
    while changes := service.docstore.change_log_since(name, seq, limit=10_000):
        last.update((c.document_id, c.op) for c in changes)
        seq = changes[-1].seq
    deleted = sum(1 for op in last.values() if op == "delete")
    if not deleted:
        return None
    documents = service.docstore.counts(name)[0]
    share = deleted / (documents + deleted)
    if share <= fraction:
        return None
    return (f"{deleted:,} of {documents + deleted:,} documents deleted since version {live.version} was built "
            f"({share:.1%} > {fraction:.1%}, QUARRY_REINDEX__CHURN_FRACTION)")


def recall_reason(service: Quarry, name: str) -> str | None:
    """The recall monitor's trigger on samples of the live version only, or ``None``.

    The monitor keeps its figures per version (store collection): samples of a replaced version
    never fire a second reindex, and the new version's fire as soon as they are enough.
    """
    live = service.live_version(name)
    fired = service.monitor.trigger(name, live.physical_name, live.swapped_at)
    if not fired.fired:
        return None
    drifted = service.drift.trigger(name, live.physical_name)
    return f"{fired.reason}; probable cause, {drifted.reason}" if drifted.fired else fired.reason


def drift_reason(service: Quarry, name: str) -> str | None:
    """The live version's query drift (the alert ``QuarryQueryDrift``'s condition), or ``None``.

    Read from this process's searches of the live version only (``QueryDrift`` keeps a profile
    per version): a swap starts the new version's reference, so one change fires once.
    """
    live = service.live_version(name)
    drifted = service.drift.trigger(name, live.physical_name)
    return drifted.reason if drifted.fired else None


@dataclass(frozen=True)
class Due:
    """A reindex a trigger asks for: which trigger and why."""

    trigger: str
    reason: str


class ReindexScheduler:
    """Schedules and triggers reindex jobs of one service's collections (module docstring).

    Args:
        service: The service whose collections it reindexes (the default tenant's).
        settings: ``QUARRY_REINDEX__*``; the service's by default.
    """

    def __init__(self, service: Quarry, settings: ReindexSettings | None = None) -> None:
        self._service = service
        self._settings = settings or service.settings.reindex
        self._default = parse_schedule(self._settings.schedule)
        self._own = {name: parse_schedule(text) for name, text in self._settings.schedules.items()}
        self._scheduler = BackgroundScheduler(
            timezone=UTC, job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 60},
        )

    def start(self) -> None:
        """Add the schedule and trigger jobs and start the scheduler's thread."""
        if self._default is not None:
            self._scheduler.add_job(self.run_schedule, self._default, args=[None], id="schedule")
        for name, trigger in self._own.items():
            if trigger is not None:
                self._scheduler.add_job(self.run_schedule, trigger, args=[name], id=f"schedule:{name}")
        if self._settings.triggers_on:
            every = IntervalTrigger(seconds=self._settings.check_interval_s, timezone=UTC)
            self._scheduler.add_job(self.check_triggers, every, id="triggers")
        self._scheduler.start()
        log.info("reindex scheduler started: schedule %r, %d per-collection, triggers %s",
                 self._settings.schedule, len(self._own), self._settings.triggers_on)

    def shutdown(self, wait: bool = False) -> None:
        """Stop the scheduler (a reindex already started runs on in its own thread)."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=wait)

    def next_run(self, name: str) -> float | None:
        """Unix time of ``name``'s next scheduled reindex, or ``None`` (no schedule, not started)."""
        job_id = f"schedule:{name}" if name in self._own else "schedule"
        if name in self._own and self._own[name] is None:
            return None
        job = self._scheduler.get_job(job_id)
        at = getattr(job, "next_run_time", None) if job is not None else None
        return at.timestamp() if at is not None else None

    # --- the jobs ----------------------------------------------------------------------------
    def run_schedule(self, only: str | None) -> list[Job]:
        """A schedule fired: start a reindex of ``only`` (or every collection without its own schedule)."""
        names = [only] if only is not None else [
            n for n in self._service.docstore.list_collections() if n not in self._own
        ]
        text = self._settings.schedules[only] if only is not None else self._settings.schedule
        trigger = self._own[only] if only is not None else self._default
        half = period_s(trigger) / 2 if trigger is not None else 0.0
        started = []
        for name in names:
            due = Due("schedule", f"schedule {text!r}")
            job = self._guarded(name, due, lambda n=name: self._not_scheduled_since(n, half))  # type: ignore[misc]
            if job is not None:
                started.append(job)
        return started

    def check_triggers(self, names: list[str] | None = None) -> list[Job]:
        """Check the triggers of ``names`` (all collections); start one reindex per collection that is due."""
        started = []
        for name in self._service.docstore.list_collections() if names is None else names:
            try:
                due = self.due(name)
            except CollectionNotFound:
                continue
            if due is not None:
                job = self._guarded(name, due, lambda n=name, t=due.trigger: self._still_due(n, t))  # type: ignore[misc]
                if job is not None:
                    started.append(job)
        return started

    def run_due(self, names: list[str] | None = None) -> list[Job]:
        """Once (``quarry reindex --due``, for an external cron): start every reindex due now.

        A collection is due when a trigger fires (recall only where this process sampled
        searches: a server's), or when it has a schedule and no scheduled reindex of it began
        within one period. Returns the jobs started (each runs in a thread of this process).
        """
        started = self.check_triggers(names)
        busy = {j.collection for j in started}
        for name in self._service.docstore.list_collections() if names is None else names:
            trigger = self._own[name] if name in self._own else self._default
            if name in busy or trigger is None:
                continue
            text = self._settings.schedules.get(name, self._settings.schedule)
            period = period_s(trigger)
            due = Due("schedule", f"schedule {text!r}: none in the last {period:g} s (reindex --due)")
            job = self._guarded(name, due, lambda n=name, p=period: self._not_scheduled_since(n, p))  # type: ignore[misc]
            if job is not None:
                started.append(job)
        return started

    def due(self, name: str) -> Due | None:
        """The first trigger that fires for ``name`` (recall, growth, churn, drift), or ``None``."""
        s = self._settings
        checks: list[tuple[str, bool, Callable[[], str | None]]] = [
            ("recall", s.on_recall, lambda: recall_reason(self._service, name)),
            ("growth", s.on_growth, lambda: growth_reason(self._service, name)),
            ("churn", s.churn_fraction > 0, lambda: churn_reason(self._service, name, s.churn_fraction)),
            ("drift", s.on_drift, lambda: drift_reason(self._service, name)),
        ]
        for trigger, on, check in checks:
            reason = check() if on else None
            if reason is not None:
                return Due(trigger, reason)
        return None

    def _still_due(self, name: str, trigger: str) -> bool:
        due = self.due(name)
        return due is not None and due.trigger == trigger

    def _not_scheduled_since(self, name: str, seconds: float) -> bool:
        """No scheduled reindex job of ``name`` was created in the last ``seconds`` (by any process)."""
        since = time.time() - seconds
        return not any(
            j.kind == "reindex" and j.params.get("trigger") == "schedule" and j.created_at >= since
            for j in self._service.docstore.list_jobs(collection=name, limit=50)
        )

    def _guarded(self, name: str, due: Due, still_due: Callable[[], bool]) -> Job | None:
        """Take ``name``'s lease, check ``still_due`` under it, start the job; ``None`` when skipped."""
        service = self._service
        owner = new_owner()
        try:
            service.reindexer.acquire(name, owner)
        except ReindexRunning:
            log.debug("collection %r: %s reindex skipped, one is running", name, due.trigger)
            return None
        try:
            if not still_due():
                service.docstore.release_lease(f"reindex:{name}", owner)
                return None
            job = service.start_reindex(name, owner=owner, trigger=due.trigger, reason=due.reason)
        except CollectionNotFound:
            service.docstore.release_lease(f"reindex:{name}", owner)
            return None
        except Exception:
            service.docstore.release_lease(f"reindex:{name}", owner)
            log.exception("collection %r: could not start the %s reindex", name, due.trigger)
            return None
        log.info("collection %r: %s reindex started as job %s (%s)", name, due.trigger, job.id, due.reason)
        return job
