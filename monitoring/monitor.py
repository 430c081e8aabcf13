"""Sample live searches, re-run them exactly in the background, report recall and a trigger.

:meth:`RecallMonitor.offer` is called on the request path with the dense channel's ANN answer;
it draws one random number and, for a ``sample_rate`` share of searches, puts a :class:`Sample`
on a bounded queue without waiting (a full queue drops the sample and counts it). One daemon
thread takes samples off the queue, asks the store for the exact answer with the same filter
(:meth:`stores.base.VectorStore.search_exact`: pgvector without its index, Qdrant ``exact``,
Milvus FLAT / IVF_FLAT probing every list or a scan of the stored vectors), counts the rows the
filter matches, and computes tie-aware recall@k (:func:`monitoring.recall.recall_at_k`) with the
true scores of the ANN's ids. It then sleeps so that it uses at most ``cpu_share`` of one core.

Prometheus (the default registry, served by ``GET /metrics``):

* ``quarry_recall{tenant, collection, selectivity}``: histogram of recall@k per sample;
* ``quarry_recall_samples_total{tenant, collection, selectivity}``: samples measured;
* ``quarry_recall_samples_dropped_total{tenant, collection}``: samples dropped on a full queue;
* ``quarry_recall_sample_errors_total{tenant, collection}``: samples whose exact search failed.

``tenant``: the monitor's tenant (one monitor per tenant view): two tenants' ``docs`` are two series.

``selectivity`` is ``none`` (no filter), ``>=10%``, ``1-10%`` or ``<1%`` of the collection's rows.

The reindex trigger, for a scheduler to poll: :meth:`RecallMonitor.trigger` fires when, in some
bucket, the last ``trigger_window_s`` seconds hold at least ``trigger_min_samples`` samples and
their mean recall is below ``recall_floor``.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from prometheus_client import Counter, Histogram

from monitoring.recall import BUCKETS, Bucket, recall_at_k, selectivity_bucket
from monitoring.recent import RecentQueries
from quarry.settings import MonitorSettings
from stores.base import Metric, ScoredId, VectorStore
from stores.filters import Filter

log = logging.getLogger(__name__)
RECALL = Histogram(
    "quarry_recall", "Tie-aware recall@k of sampled ANN answers against exact search",
    ["tenant", "collection", "selectivity"], buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0),
)
SAMPLES = Counter(
    "quarry_recall_samples", "Sampled searches measured exactly", ["tenant", "collection", "selectivity"]
)
DROPPED = Counter(
    "quarry_recall_samples_dropped", "Sampled searches dropped: the queue was full", ["tenant", "collection"]
)
ERRORS = Counter("quarry_recall_sample_errors", "Sampled searches whose exact search failed", ["tenant", "collection"])


@dataclass(frozen=True)
class Sample:
    """One search to measure.

    Attributes:
        collection: The collection (or alias) searched.
        metric: Its metric (to score the ANN's ids exactly).
        vector: The query vector, ``(dim,) float32``.
        flt: The search's filter.
        k: Recall cut-off: the search's ``top_k``.
        ids: The ANN answer's first ``k`` ids, best first.
        physical: The store collection the ANN searched (a version's, ``indexing.versions``);
            ``None``: ``collection`` itself. The exact re-run reads that one, so it measures the
            index that answered, with vectors of the query's own model.
    """

    collection: str
    metric: Metric
    vector: npt.NDArray[np.float32]
    flt: Filter | None
    k: int
    ids: tuple[str, ...]
    physical: str | None = None


@dataclass(frozen=True)
class Measurement:
    """A sample's outcome: recall@k, its selectivity bucket and the rows the filter matched."""

    collection: str
    bucket: Bucket
    recall: float
    matching: int | None
    total: int


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


class RecallMonitor:
    """Online recall@k of sampled live searches; thread-safe.

    Args:
        store: The vector store (``search_exact``, ``get``, ``count``).
        settings: ``QUARRY_MONITOR__*``.
        recent: Where sampled queries are recorded for later checks (``None``: not recorded).
        clock: Monotonic seconds for the windows (tests step one by hand).
        draw: Uniform ``[0, 1)`` numbers deciding which searches are sampled.
        tenant: The ``tenant`` label of its metrics (the tenant view it measures for).
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
        self.dropped = 0
        self._store = store
        self._clock = clock
        self._draw = draw
        self._queue: queue.Queue[Sample] = queue.Queue(settings.queue_size)
        self._windows: dict[tuple[str, Bucket], deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the request path ---------------------------------------------------------------------

    def offer(
        self, collection: str, metric: Metric, vector: npt.NDArray[np.float32], flt: Filter | None, k: int,
        hits: Sequence[ScoredId],
        physical: str | None = None,
    ) -> bool:
        """Queue this search for measurement with probability ``sample_rate``; never blocks.

        Args:
            collection: The collection searched.
            metric: Its metric.
            vector: The query vector, ``(dim,)``.
            flt: The search's filter.
            k: The recall cut-off (the request's ``top_k``).
            hits: The ANN answer, best first (only the first ``k`` ids are kept).
            physical: The store collection searched when it is not ``collection`` (a version's).

        Returns:
            Whether the search was queued (``False``: not drawn, or dropped on a full queue).
        """
        rate = self.settings.sample_rate
        if rate <= 0.0 or self._draw() >= rate:
            return False
        sample = Sample(collection, metric, vector, flt, k, tuple(h.id for h in hits[:k]), physical)
        try:
            self._queue.put_nowait(sample)
        except queue.Full:
            DROPPED.labels(self.tenant, collection).inc()
            with self._lock:
                self.dropped += 1
            return False
        if self._thread is None:
            self.start()
        return True

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
                sample = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            started = time.perf_counter()
            try:
                self.measure(sample)
            except Exception as exc:  # noqa: BLE001 - the worker outlives any one sample; counted and logged
                ERRORS.labels(self.tenant, sample.collection).inc()
                log.warning("recall sample of %r failed: %s", sample.collection, exc)
            finally:
                self._queue.task_done()
            self._stop.wait((time.perf_counter() - started) * idle)

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
        if record and self.recent is not None:
            self.recent.record(sample.collection, sample.vector, sample.flt, sample.k)
        query = np.asarray(sample.vector, dtype=np.float32)[None, :]
        store_name = sample.physical or sample.collection
        exact = self._store.search_exact(store_name, query, sample.k, sample.flt)[0]
        found = {r.id: r.vector for r in self._store.get(store_name, list(sample.ids))}
        true = [_score(sample.metric, query[0], found[i]) if i in found else float("-inf") for i in sample.ids]
        recall = recall_at_k(
            list(sample.ids), true, [h.id for h in exact], [h.score for h in exact], sample.k,
            self.settings.tolerance,
        )
        total = self._store.count(store_name)
        matching = None if sample.flt is None else self._store.count(store_name, sample.flt)
        bucket = selectivity_bucket(matching, total)
        if record:
            RECALL.labels(self.tenant, sample.collection, bucket).observe(recall)
            SAMPLES.labels(self.tenant, sample.collection, bucket).inc()
            with self._lock:
                window = self._windows.setdefault(
                    (sample.collection, bucket), deque(maxlen=self.settings.window_samples)
                )
                window.append((self._clock(), recall))
        return Measurement(sample.collection, bucket, recall, matching, total)

    # -- reading ------------------------------------------------------------------------------

    def _recent(self, collection: str, bucket: Bucket, seconds: float) -> list[float]:
        since = self._clock() - seconds
        with self._lock:
            window = self._windows.get((collection, bucket), ())
            return [r for at, r in window if at >= since]

    def figures(self, collection: str) -> dict[str, Any]:
        """Recent recall per selectivity bucket (the ``GET .../recall`` body).

        Returns:
            ``{"collection", "window_s", "sample_rate", "dropped", "queued", "buckets": {bucket:
            {"samples", "mean_recall", "p10_recall"}}, "trigger": {...}}``; a bucket without
            samples in the window has ``samples`` 0 and ``null`` figures.
        """
        buckets: dict[str, dict[str, Any]] = {}
        for bucket in BUCKETS:
            values = self._recent(collection, bucket, self.settings.window_s)
            buckets[bucket] = {
                "samples": len(values),
                "mean_recall": float(np.mean(values)) if values else None,
                "p10_recall": float(np.percentile(values, 10)) if values else None,
            }
        trigger = self.trigger(collection)
        return {
            "collection": collection, "window_s": self.settings.window_s, "sample_rate": self.settings.sample_rate,
            "dropped": self.dropped, "queued": self.queued, "buckets": buckets,
            "trigger": {"fired": trigger.fired, "floor": trigger.floor, "window_s": trigger.window_s,
                        "below": trigger.below, "reason": trigger.reason},
        }

    def trigger(self, collection: str) -> RecallTrigger:
        """The reindex trigger a scheduler polls: recall below the floor for a sustained window.

        Fires when some bucket has at least ``trigger_min_samples`` samples in the last
        ``trigger_window_s`` seconds and their mean recall@k is below ``recall_floor``.
        """
        s = self.settings
        below: dict[str, float] = {}
        for bucket in BUCKETS:
            values = self._recent(collection, bucket, s.trigger_window_s)
            if len(values) >= s.trigger_min_samples and float(np.mean(values)) < s.recall_floor:
                below[bucket] = float(np.mean(values))
        if not below:
            return RecallTrigger(False, s.recall_floor, s.trigger_window_s)
        parts = ", ".join(f"{b} {r:.3f}" for b, r in below.items())
        reason = f"mean recall@k below {s.recall_floor:g} over {s.trigger_window_s:g} s ({parts})"
        return RecallTrigger(True, s.recall_floor, s.trigger_window_s, below, reason)

    def forget(self, collection: str) -> None:
        """Drop a collection's windows, metric series and recorded queries (it was dropped)."""
        with self._lock:
            for key in [key for key in self._windows if key[0] == collection]:
                del self._windows[key]
        for metric, labels in [
            *((m, (self.tenant, collection, b)) for m in (RECALL, SAMPLES) for b in BUCKETS),
            (DROPPED, (self.tenant, collection)), (ERRORS, (self.tenant, collection)),
        ]:
            try:
                metric.remove(*labels)
            except KeyError:  # no series with these labels
                continue
        if self.recent is not None:
            self.recent.forget(collection)


def _score(metric: Metric, query: npt.NDArray[np.float32], vector: npt.NDArray[np.float32]) -> float:
    """A stored vector's score as the stores give it: inner product, or ``-`` Euclidean distance."""
    if metric == "l2":
        return -float(np.linalg.norm(query - vector))
    return float(np.dot(query, vector))
