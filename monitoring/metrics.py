"""The recall monitor's and the query drift's Prometheus series (the default registry, ``GET /metrics``).

Counters and the histogram are updated by :class:`monitoring.monitor.RecallMonitor`; the window
gauges are read from every live monitor (:data:`MONITORS`) at scrape time, the drift gauges from
every :class:`monitoring.drift.QueryDrift` (:data:`DRIFTS`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from monitoring.recall import Bucket

if TYPE_CHECKING:
    from monitoring.drift import DriftFigures

RECALL = Histogram(
    "quarry_recall", "Tie-aware recall@k of sampled ANN answers against exact search",
    ["tenant", "collection", "selectivity"], buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0),
)
SAMPLES = Counter(
    "quarry_recall_samples", "Sampled searches measured exactly", ["tenant", "collection", "selectivity"]
)
OFFERED = Counter("quarry_recall_samples_offered", "Searches drawn for a recall sample", ["tenant", "collection"])
DROPPED = Counter(
    "quarry_recall_samples_dropped", "Sampled searches dropped: the queue was full", ["tenant", "collection"]
)
ERRORS = Counter("quarry_recall_sample_errors", "Sampled searches whose exact search failed", ["tenant", "collection"])


class WindowSource(Protocol):
    """What the window gauges read of a monitor: its tenant, collections and live windows."""

    tenant: str

    def collections(self) -> list[str]:
        """The collections with figures."""
        ...

    def window(self, collection: str) -> Mapping[Bucket, Sequence[float]]:
        """Bucket -> recall@k values of the live version over ``trigger_window_s``."""
        ...


MONITORS: weakref.WeakSet[WindowSource] = weakref.WeakSet()


class _Windows(Collector):
    """``quarry_recall_window_mean`` / ``_samples``: every monitor's serving versions, read at each scrape.

    Per ``(tenant, collection, selectivity)``, over ``trigger_window_s``: the figures the trigger
    reads. Two monitors of one tenant with a same-named collection give one series, the lower mean;
    two tenants' same-named collections are two series.
    """

    def collect(self) -> Iterable[GaugeMetricFamily]:
        rows: dict[tuple[str, str, str], tuple[float, int]] = {}
        for monitor in list(MONITORS):
            for collection in monitor.collections():
                for bucket, values in monitor.window(collection).items():
                    if not values:
                        continue
                    mean, n = float(np.mean(values)), len(values)
                    key = (monitor.tenant, collection, bucket)
                    seen = rows.get(key)
                    if seen is None or mean < seen[0]:
                        rows[key] = (mean, n)
        means, counts = self.describe()
        for labels, (mean, n) in sorted(rows.items()):
            means.add_metric(list(labels), mean)
            counts.add_metric(list(labels), n)
        yield means
        yield counts

    def describe(self) -> list[GaugeMetricFamily]:
        labels = ["tenant", "collection", "selectivity"]
        return [
            GaugeMetricFamily("quarry_recall_window_mean",
                              "Mean recall@k of the live version's samples over QUARRY_MONITOR__TRIGGER_WINDOW_S",
                              labels=labels),
            GaugeMetricFamily("quarry_recall_window_samples",
                              "Samples of the live version over QUARRY_MONITOR__TRIGGER_WINDOW_S", labels=labels),
        ]


REGISTRY.register(_Windows())


class DriftSource(Protocol):
    """What the drift gauges read of a :class:`monitoring.drift.QueryDrift`."""

    tenant: str

    def collections(self) -> list[str]:
        """The collections with a profile."""
        ...

    def figures(self, collection: str) -> DriftFigures | None:
        """The serving version's drift figures."""
        ...


DRIFTS: weakref.WeakSet[DriftSource] = weakref.WeakSet()


class _Drifts(Collector):
    """``quarry_query_drift`` / ``_queries``: every tracker's serving versions, read at each scrape.

    Per ``(tenant, collection, signal)``; a signal's drift is exported once its reference is
    complete, its window count always. Two trackers of one tenant with a same-named collection
    (two service handles in one process) give one series, the larger drift.
    """

    def collect(self) -> Iterable[GaugeMetricFamily]:
        drifts: dict[tuple[str, str, str], float] = {}
        counts: dict[tuple[str, str, str], int] = {}
        for source in list(DRIFTS):
            for collection in source.collections():
                figures = source.figures(collection)
                if figures is None:
                    continue
                for signal, n in figures.queries.items():
                    key = (source.tenant, collection, signal)
                    counts[key] = max(n, counts.get(key, 0))
                    value = figures.value(signal)
                    if value is not None and value >= drifts.get(key, value):
                        drifts[key] = value
        family, queries = self.describe()
        for labels, value in sorted(drifts.items()):
            family.add_metric(list(labels), value)
        for labels, n in sorted(counts.items()):
            queries.add_metric(list(labels), n)
        yield family
        yield queries

    def describe(self) -> list[GaugeMetricFamily]:
        labels = ["tenant", "collection", "signal"]
        return [
            GaugeMetricFamily(
                "quarry_query_drift",
                "Query drift against the collection's reference queries: centroid (cosine distance of the query "
                "centroids over the reference spread) or oov (change of the out-of-vocabulary term share)",
                labels=labels,
            ),
            GaugeMetricFamily("quarry_query_drift_queries", "Queries in the current drift window", labels=labels),
        ]


REGISTRY.register(_Drifts())
