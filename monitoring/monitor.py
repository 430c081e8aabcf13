"""Sample live searches, re-run them exactly in the background, report recall and a trigger.

:meth:`RecallMonitor.offer` is called on the request path with the dense channel's ANN answer
(searched at the searcher's depth, as it serves) and the store collection of the version that
answered; it draws one random number and, for a ``sample_rate`` share of searches, puts a
:class:`Sample` on a bounded queue without waiting (a full queue drops the sample and counts it).
One daemon thread takes every queued sample at once (up to :data:`MAX_BATCH`), groups them by
store collection and filter, and measures each group with one exact search
(:meth:`stores.base.VectorStore.search_exact`: pgvector without its index, Qdrant ``exact``,
Milvus FLAT / IVF_FLAT probing every list or a scan of the stored vectors), one ``get`` of the
ANN's ids and row counts kept :data:`COUNT_TTL_S` seconds; recall@k is tie-aware
(:func:`monitoring.recall.recall_at_k`). It then sleeps so that its *CPU time* stays within
``cpu_share`` of one core (waiting on a store server costs no CPU, so it does not slow the
sampler down).

Samples and their exact measurement: :mod:`monitoring.exact`; the Prometheus series:
:mod:`monitoring.metrics`.

Figures are kept per version: windows are keyed by the store collection that answered
(``Sample.physical``), so a reindex's swap starts fresh buckets, and :meth:`RecallMonitor.figures`
and :meth:`RecallMonitor.trigger` read the live version's (the one the service names, else the
one of the newest sampled search).

Prometheus (the default registry, served by ``GET /metrics``):

* ``quarry_recall{tenant, collection, selectivity}``: histogram of recall@k per sample (every version);
* ``quarry_recall_window_mean{tenant, collection, selectivity}``, ``quarry_recall_window_samples{...}``:
  the live version's mean recall@k and its sample count over ``trigger_window_s``, read at scrape
  time (what the trigger reads; the alert ``QuarryRecallBelowFloor`` fires per bucket on them);
* ``quarry_recall_samples_total{tenant, collection, selectivity}``: samples measured;
* ``quarry_recall_samples_offered_total{tenant, collection}``: searches drawn for sampling;
* ``quarry_recall_samples_dropped_total{tenant, collection}``: samples dropped on a full queue;
* ``quarry_recall_sample_errors_total{tenant, collection}``: samples whose exact search failed.

``tenant``: the monitor's tenant (one monitor per tenant view): two tenants' ``docs`` are two series.

``selectivity`` is ``none`` (no filter), ``>=10%``, ``1-10%`` or ``<1%`` of the collection's rows.

The reindex trigger, for a scheduler to poll: :meth:`RecallMonitor.trigger` fires when, in any
bucket of the live version, the last ``trigger_window_s`` seconds hold at least
``trigger_min_samples`` samples and their mean recall is below ``recall_floor``.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from monitoring.exact import Measurement, Sample, exact_recalls, filter_key, groups
from monitoring.metrics import DROPPED, ERRORS, MONITORS, OFFERED, RECALL, SAMPLES
from monitoring.recall import BUCKETS, Bucket, selectivity_bucket
from monitoring.recent import RecentQueries
from quarry.settings import MonitorSettings
from stores.base import Metric, ScoredId, VectorStore
from stores.filters import Filter

log = logging.getLogger(__name__)
MAX_BATCH = 64  # samples the worker measures together (one exact search per store collection and filter)
COUNT_TTL_S = 30.0  # row counts (the selectivity bucket's share) are re-read after this many seconds
KEPT_VERSIONS = 2  # store collections per collection whose windows are kept (the live one and the one before)


@dataclass(frozen=True)
class RecallTrigger:
    """Whether measured recall calls for a reindex (see :meth:`RecallMonitor.trigger`).

    Attributes:
        fired: Some bucket's mean recall stayed below ``floor`` over ``window_s``.
        floor: ``MonitorSettings.recall_floor``.
        window_s: ``MonitorSettings.trigger_window_s``.
        below: Bucket -> mean recall in the window, for the buckets below the floor.
        reason: One line for logs and a reindex job's record.
    """

    fired: bool
    floor: float
    window_s: float
    below: dict[str, float] = field(default_factory=dict)
    reason: str = ""


@dataclass
class _Tally:
    """One collection's sampler counts since the process started."""

    offered: int = 0
    measured: int = 0
    dropped: int = 0
    errors: int = 0


class RecallMonitor:
    """Online recall@k of sampled live searches, per version; thread-safe.

    Args:
        store: The vector store (``search_exact``, ``get``, ``count``).
        settings: ``QUARRY_MONITOR__*``.
        recent: Where sampled queries are recorded for later checks (``None``: not recorded).
        clock: Monotonic seconds for the windows (tests step one by hand).
        draw: Uniform ``[0, 1)`` numbers deciding which searches are sampled.
        tenant: The ``tenant`` label of its metrics (the tenant view it measures for).

    Attributes:
        offered: Searches drawn for sampling, every collection.
        measured: Samples measured.
        dropped: Samples dropped on a full queue.
    """

    def __init__(
        self,
        store: VectorStore,
        settings: MonitorSettings,
        *,
        recent: RecentQueries | None = None,
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
        tenant: str = "default",
    ) -> None:
        self.settings = settings
        self.tenant = tenant  # the metrics' tenant label
        self.recent = recent
        self.offered = 0
        self.measured = 0
        self.dropped = 0
        self._store = store
        self._clock = clock
        self._draw = draw
        self._queue: queue.Queue[Sample] = queue.Queue(settings.queue_size)
        # (collection, store collection, bucket) -> (clock time, Unix time, recall) of each sample
        self._windows: dict[tuple[str, str, Bucket], deque[tuple[float, float, float]]] = {}
        self._serving: dict[str, str] = {}  # collection -> store collection of its newest sample (or as told)
        self._versions: dict[str, list[str]] = {}  # collection -> store collections with windows, oldest first
        self._tallies: dict[str, _Tally] = {}
        self._counts: dict[tuple[str, Hashable], tuple[float, int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        MONITORS.add(self)

    # -- the request path ---------------------------------------------------------------------

    def offer(
        self, collection: str, metric: Metric, vector: npt.NDArray[np.float32], flt: Filter | None, k: int,
        hits: Sequence[ScoredId],
        physical: str | None = None,
    ) -> bool:
        """Note which version serves, and queue this search for measurement with probability ``sample_rate``.

        Never blocks. Every search names the store collection that answered it, so the figures
        read (:meth:`live`) follow a swap from the first search after it.

        Args:
            collection: The collection searched.
            metric: Its metric.
            vector: The query vector, ``(dim,)``.
            flt: The search's filter.
            k: The recall cut-off (the request's ``top_k``).
            hits: The ANN answer at the searcher's depth, best first (the first ``k`` ids are kept).
            physical: The store collection searched when it is not ``collection`` (a version's).

        Returns:
            Whether the search was queued (``False``: not drawn, or dropped on a full queue).
        """
        store_name = physical or collection
        if self._serving.get(collection) != store_name:  # the first search since a swap: fresh figures
            with self._lock:
                self._serve(collection, store_name)
        rate = self.settings.sample_rate
        if rate <= 0.0 or self._draw() >= rate:
            return False
        OFFERED.labels(self.tenant, collection).inc()
        sample = Sample(collection, metric, vector, flt, k, tuple(h.id for h in hits[:k]), physical)
        with self._lock:
            self.offered += 1
            self._tally(collection).offered += 1
        try:
            self._queue.put_nowait(sample)
        except queue.Full:
            DROPPED.labels(self.tenant, collection).inc()
            with self._lock:
                self.dropped += 1
                self._tally(collection).dropped += 1
            return False
        if self._thread is None:
            self.start()
        return True

    def _tally(self, collection: str) -> _Tally:
        tally = self._tallies.get(collection)
        if tally is None:
            tally = self._tallies[collection] = _Tally()
        return tally

    def _serve(self, collection: str, physical: str) -> None:
        """Note (under the lock) that ``physical`` serves ``collection``; keep windows of the last versions only."""
        self._serving[collection] = physical
        versions = self._versions.setdefault(collection, [])
        if physical in versions:
            if versions[-1] != physical:
                versions.remove(physical)
                versions.append(physical)
            return
        versions.append(physical)
        for old in versions[:-KEPT_VERSIONS]:
            for key in [key for key in self._windows if key[0] == collection and key[1] == old]:
                del self._windows[key]
        del versions[:-KEPT_VERSIONS]

    def serving(self, collection: str, physical: str) -> None:
        """Tell the monitor that ``physical`` now serves ``collection`` (a swap or a rollback).

        Its figures are read from now on, and start afresh: samples it had before (a rollback
        to a version sampled earlier) are dropped.
        """
        with self._lock:
            for key in [key for key in self._windows if key[0] == collection and key[1] == physical]:
                del self._windows[key]
            self._serve(collection, physical)

    # -- the worker ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread (once; :meth:`offer` starts it on the first sample)."""
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="quarry-recall-monitor", daemon=True)
            self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the worker (queued samples are abandoned)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)

    def drain(self, timeout_s: float = 60.0) -> bool:
        """Wait until every queued sample is measured (tests, benchmarks); ``False`` on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    @property
    def queued(self) -> int:
        """Samples waiting for the worker."""
        return self._queue.qsize()

    def _run(self) -> None:
        idle = 1.0 / self.settings.cpu_share - 1.0
        while not self._stop.is_set():
            try:
                batch = [self._queue.get(timeout=0.2)]
            except queue.Empty:
                continue
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            cpu_started = time.thread_time()
            try:
                self.measure_many(batch)
            finally:
                for _ in batch:
                    self._queue.task_done()
            self._stop.wait((time.thread_time() - cpu_started) * idle)

    # -- measuring ----------------------------------------------------------------------------

    def measure(self, sample: Sample, *, record: bool = True) -> Measurement:
        """Re-run one sample exactly and compute its recall@k.

        Args:
            sample: The search and its ANN answer.
            record: Count it in the metrics, the windows and the recent queries (``False`` for
                an on-demand check).

        Returns:
            The measurement.

        Raises:
            QuarryError: The store failed (``StoreUnavailable``, ``CollectionNotFound``...).
        """
        outcome = self.measure_many([sample], record=record)[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def measure_many(self, samples: Sequence[Sample], *, record: bool = True) -> list[Measurement | Exception]:
        """Re-run samples exactly, one exact search per store collection and filter, and compute recall@k.

        Args:
            samples: The searches and their ANN answers.
            record: Count them in the metrics, the windows and the recent queries (``False`` for
                an on-demand check); a failed group is counted in
                ``quarry_recall_sample_errors_total`` and logged.

        Returns:
            Per sample, in order: its measurement, or the store's error (``QuarryError``) when
            its group's exact search failed.
        """
        if record and self.recent is not None:
            try:
                self.recent.record_many([(s.collection, s.vector, s.flt, s.k) for s in samples])
            except Exception as exc:  # noqa: BLE001 - a full disk must not stop the measuring
                log.warning("recording %d sampled queries failed: %s", len(samples), exc)
        out: list[Measurement | Exception | None] = [None] * len(samples)
        for indexes in groups(samples):
            group = [samples[i] for i in indexes]
            try:
                measured: list[Measurement | Exception] = list(self._measure_group(group))
            except Exception as exc:  # noqa: BLE001 - the worker outlives any one group; counted and logged
                if record:
                    ERRORS.labels(self.tenant, group[0].collection).inc(len(group))
                    with self._lock:
                        self._tally(group[0].collection).errors += len(group)
                    log.warning("recall samples of %r failed: %s", group[0].collection, exc)
                measured = [exc] * len(group)
            for i, m in zip(indexes, measured, strict=True):
                out[i] = m
                if record and isinstance(m, Measurement):
                    self._record(samples[i], m)
        return [m for m in out if m is not None]

    def _measure_group(self, group: Sequence[Sample]) -> list[Measurement]:
        """Measure samples of one store collection and filter: one exact search, one ``get``, cached counts."""
        first = group[0]
        name, flt = first.store_name, first.flt
        recalls = exact_recalls(self._store, group, self.settings.tolerance)
        total = self._count(name, None)
        matching = None if flt is None else self._count(name, flt)
        bucket = selectivity_bucket(matching, total)
        return [Measurement(s.collection, bucket, r, matching, total) for s, r in zip(group, recalls, strict=True)]

    def _count(self, name: str, flt: Filter | None) -> int:
        """Rows of ``name`` (matching ``flt``), re-read every :data:`COUNT_TTL_S` seconds."""
        key = (name, filter_key(flt))
        now = time.monotonic()
        with self._lock:
            cached = self._counts.get(key)
        if cached is not None and now - cached[0] < COUNT_TTL_S:
            return cached[1]
        n = self._store.count(name, flt)
        with self._lock:
            if len(self._counts) > 4096:  # many distinct filters: start over
                self._counts.clear()
            self._counts[key] = (now, n)
        return n

    def _record(self, sample: Sample, m: Measurement) -> None:
        RECALL.labels(self.tenant, sample.collection, m.bucket).observe(m.recall)
        SAMPLES.labels(self.tenant, sample.collection, m.bucket).inc()
        with self._lock:
            self.measured += 1
            self._tally(sample.collection).measured += 1
            versions = self._versions.get(sample.collection, [])
            if sample.store_name not in versions:  # measured after its version's windows were let go
                if sample.collection in self._serving:
                    return
                self._serve(sample.collection, sample.store_name)
            window = self._windows.setdefault(
                (sample.collection, sample.store_name, m.bucket), deque(maxlen=self.settings.window_samples)
            )
            window.append((self._clock(), time.time(), m.recall))

    # -- reading ------------------------------------------------------------------------------

    def live(self, collection: str) -> str:
        """The store collection whose figures are read: as told, else that of the newest sample."""
        with self._lock:
            return self._serving.get(collection, collection)

    def _recent(
        self, collection: str, physical: str, bucket: Bucket, seconds: float, swapped_at: float | None = None
    ) -> list[float]:
        since = self._clock() - seconds
        after = swapped_at if swapped_at is not None else float("-inf")
        with self._lock:
            window = self._windows.get((collection, physical, bucket), ())
            return [r for at, wall, r in window if at >= since and wall >= after]

    def figures(self, collection: str, physical: str | None = None, swapped_at: float | None = None) -> dict[str, Any]:
        """Recent recall of the serving version per selectivity bucket (the ``GET .../recall`` body).

        Args:
            collection: The collection.
            physical: The store collection of its live version (``None``: :meth:`live`).
            swapped_at: When it became live (Unix seconds; ``None``: unknown): samples measured
                before, when an earlier turn of the same version served, are left out.

        Returns:
            ``{"collection", "physical", "window_s", "sample_rate", "offered", "measured",
            "dropped", "errors", "queued", "buckets": {bucket: {"samples", "mean_recall",
            "p10_recall"}}, "trigger": {...}}``; the counts are the collection's since the
            process started (``queued``: every collection's); a bucket without samples of
            that version in the window has ``samples`` 0 and ``null`` figures.
        """
        physical = physical or self.live(collection)
        buckets: dict[str, dict[str, Any]] = {}
        for bucket in BUCKETS:
            values = self._recent(collection, physical, bucket, self.settings.window_s, swapped_at)
            buckets[bucket] = {
                "samples": len(values),
                "mean_recall": float(np.mean(values)) if values else None,
                "p10_recall": float(np.percentile(values, 10)) if values else None,
            }
        trigger = self.trigger(collection, physical, swapped_at)
        with self._lock:
            tally = self._tallies.get(collection, _Tally())
        return {
            "collection": collection, "physical": physical, "window_s": self.settings.window_s,
            "sample_rate": self.settings.sample_rate, "offered": tally.offered, "measured": tally.measured,
            "dropped": tally.dropped, "errors": tally.errors, "queued": self.queued, "buckets": buckets,
            "trigger": {"fired": trigger.fired, "floor": trigger.floor, "window_s": trigger.window_s,
                        "below": trigger.below, "reason": trigger.reason},
        }

    def window(
        self, collection: str, physical: str | None = None, swapped_at: float | None = None
    ) -> dict[Bucket, list[float]]:
        """The serving version's recall values per bucket over ``trigger_window_s`` (what the trigger reads)."""
        physical = physical or self.live(collection)
        window_s = self.settings.trigger_window_s
        return {b: self._recent(collection, physical, b, window_s, swapped_at) for b in BUCKETS}

    def trigger(self, collection: str, physical: str | None = None, swapped_at: float | None = None) -> RecallTrigger:
        """The reindex trigger a scheduler polls: recall below the floor in any bucket, sustained.

        Fires when any bucket of the serving version (``physical``, else :meth:`live`) has at
        least ``trigger_min_samples`` samples in the last ``trigger_window_s`` seconds and their
        mean recall@k is below ``recall_floor``; other buckets' figures do not offset it.
        ``swapped_at``: as in :meth:`figures`.
        """
        s = self.settings
        below: dict[str, float] = {}
        for bucket, values in self.window(collection, physical, swapped_at).items():
            if len(values) >= s.trigger_min_samples and float(np.mean(values)) < s.recall_floor:
                below[bucket] = float(np.mean(values))
        if not below:
            return RecallTrigger(False, s.recall_floor, s.trigger_window_s)
        parts = ", ".join(f"{b} {r:.3f}" for b, r in below.items())
        reason = f"mean recall@k below {s.recall_floor:g} over {s.trigger_window_s:g} s ({parts})"
        return RecallTrigger(True, s.recall_floor, s.trigger_window_s, below, reason)

    def collections(self) -> list[str]:
        """The collections with figures (sampled, or told which version serves)."""
        with self._lock:
            return list(self._serving)

    def forget(self, collection: str) -> None:
        """Drop a collection's windows, metric series and recorded queries (it was dropped)."""
        with self._lock:
            for key in [key for key in self._windows if key[0] == collection]:
                del self._windows[key]
            self._serving.pop(collection, None)
            self._versions.pop(collection, None)
            self._tallies.pop(collection, None)
        for metric, labels in [
            *((m, (self.tenant, collection, b)) for m in (RECALL, SAMPLES) for b in BUCKETS),
            *((m, (self.tenant, collection)) for m in (OFFERED, DROPPED, ERRORS)),
        ]:
            try:
                metric.remove(*labels)
            except KeyError:  # no series with these labels
                continue
        if self.recent is not None:
            self.recent.forget(collection)
