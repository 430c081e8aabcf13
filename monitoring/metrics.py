"""The recall monitor's Prometheus series (the default registry, served by ``GET /metrics``).

Counters and the histogram are updated by :class:`monitoring.monitor.RecallMonitor`; the window
gauges are read from every live monitor (:data:`MONITORS`) at scrape time.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np
from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from monitoring.recall import Bucket

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
