"""Prometheus metrics of the service: every name Quarry exports, in one place.

Conventions (Prometheus', as TEI and vLLM follow them): base units (seconds), ``_seconds`` and
``_total`` suffixes, one metric with a ``stage`` label rather than a metric per stage, and label
values from bounded sets only: route templates, stage names, tenant ids and collection names
(bounded by the service), modes, reasons, priorities; never query text, document ids or keys.
A collection's series carry its ``tenant`` beside its ``collection``: two tenants' ``docs`` are two
series. ``GET /metrics`` needs a key with the ``metrics`` or ``admin`` scope once keys exist; a
key of a tenant other than the operator's (``default``) sees its own tenant's series and those
without a tenant (:class:`TenantView`), never another tenant's collection names.

* ``quarry_requests_total{route,status}``, ``quarry_request_seconds{route}``: every HTTP request
  (:class:`~quarry.api.observe.ObserveMiddleware`); ``quarry_requests_in_flight``.
* ``quarry_stage_seconds{stage,tenant,collection,mode}``: ``embed``, ``bm25``, ``ann``, ``fusion``,
  ``rerank``, ``hydrate`` of each search (:class:`SearchTelemetry`), ``llm_ttft`` and
  ``llm_total`` of each answer's generation (:func:`observe_llm`).
* ``quarry_degraded_answers_total{reason}``: ``dense_skipped`` (a hybrid search answered from BM25
  alone), ``llm_failed`` (an answer without the LLM's text); the access layer adds ``shed``.
* ``quarry_rate_limited_total``, ``quarry_shed_total{priority}``, ``quarry_auth_failures_total{reason}``:
  defined here, counted by the access layer (API keys, limits, shedding) once it exists.
* ``quarry_token_limited_total``: answer requests refused (429) by a key's LLM token quota
  before the LLM was asked (:class:`quarry.api.quotas.TokenQuota`).
* ``quarry_shed_requests_held``: shed requests held before their 503 (:mod:`quarry.api.pacing`).
* ``quarry_batcher_queue_depth{batcher}``: items waiting in each dynamic batcher (``embed``,
  ``ann``, ``ann-filtered``), read at scrape time (:func:`quarry.microbatch.queue_depths`).
* ``quarry_sla_seconds{route}``: the latency objectives (``QUARRY_METRICS__*_SLA_S``) that the
  alert rules compare the P99 with (``deploy/prometheus/alerts.yml``).

Alert rules and the Grafana dashboard (``deploy/``) use only these names
(``tests/core/test_observability.py`` checks it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, Metric
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from quarry import tracing
from quarry.microbatch import queue_depths

if TYPE_CHECKING:
    from quarry.settings import MetricsSettings
    from quarry.tracing import SearchResult

# 100 µs (BM25 over a small collection, fusion) to 2 min (an LLM's whole answer).
STAGE_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0,
)
STAGES = ("embed", "bm25", "ann", "fusion", "rerank", "hydrate", "llm_ttft", "llm_total")
SEARCH_ROUTE = "/v1/collections/{name}/search"
ANSWER_ROUTE = "/v1/collections/{name}/answer"

REQUESTS = Counter("quarry_requests_total", "HTTP requests", ["route", "status"])
LATENCY = Histogram("quarry_request_seconds", "HTTP request latency (seconds)", ["route"], buckets=STAGE_BUCKETS)
STAGE_SECONDS = Histogram(
    "quarry_stage_seconds", "Time of one query stage (seconds)", ["stage", "tenant", "collection", "mode"],
    buckets=STAGE_BUCKETS,
)
DEGRADED = Counter("quarry_degraded_answers_total", "Searches and answers served degraded, by reason", ["reason"])
RATE_LIMITED = Counter("quarry_rate_limited_total", "Requests refused by a rate limit (429)")
TOKEN_LIMITED = Counter(
    "quarry_token_limited_total", "Answer requests refused by a key's LLM token quota (429), before the LLM was asked"
)
CHAT_REWRITES = Counter(
    "quarry_chat_rewrites_total", "Chat follow-ups rewritten before retrieval, by method and outcome",
    ["method", "outcome"],
)
FEEDBACK = Counter(
    "quarry_feedback_total", "Client feedback on served requests (POST .../feedback), by signal and the serving "
    "version's role in a gray release (none: no rollout)", ["tenant", "collection", "signal", "role"],
)
SHED = Counter("quarry_shed_total", "Requests shed under load, by the key's priority", ["priority"])
AUTH_FAILURES = Counter("quarry_auth_failures_total", "Requests refused by authentication or authorisation", ["reason"])
SLA = Gauge("quarry_sla_seconds", "Latency objective of a route (QUARRY_METRICS__*_SLA_S)", ["route"])


class InFlight:
    """Requests being served now (a counter the middleware moves; read at scrape time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self, n: int) -> None:
        """Add ``n`` (1 when a request starts, -1 when it ends)."""
        with self._lock:
            self.count += n


IN_FLIGHT = InFlight()
Gauge("quarry_requests_in_flight", "HTTP requests being served").set_function(lambda: IN_FLIGHT.count)
SHED_HELD = InFlight()  # shed requests held before their 503 (quarry.api.pacing), not in IN_FLIGHT
Gauge("quarry_shed_requests_held", "Shed requests held before their 503 (Retry-After pacing)").set_function(
    lambda: SHED_HELD.count
)


class _QueueDepths(Collector):
    """``quarry_batcher_queue_depth{batcher}``: read from the live batchers at each scrape."""

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "quarry_batcher_queue_depth", "Items waiting for a dynamic batcher's next call", labels=["batcher"]
        )
        for name, depth in sorted(queue_depths().items()):
            family.add_metric([name], depth)
        yield family

    def describe(self) -> Iterable[GaugeMetricFamily]:
        yield GaugeMetricFamily("quarry_batcher_queue_depth", "Items waiting for a dynamic batcher's next call")


REGISTRY.register(_QueueDepths())


def set_slas(settings: MetricsSettings) -> None:
    """Export the latency objectives the alert rules compare with."""
    SLA.labels(SEARCH_ROUTE).set(settings.search_sla_s)
    SLA.labels(ANSWER_ROUTE).set(settings.answer_sla_s)


class SearchTelemetry:
    """What a finished search reports: its stages' histograms, its degradation, its spans.

    Called by :class:`~retrieval.search.Searcher` once per search with its
    :attr:`~retrieval.results.SearchResult.stage_times`; the labelled histogram children are kept
    per ``(stage, collection, mode)`` so that a search costs one dictionary lookup per stage.

    Args:
        metrics: Observe the histograms and counters (``QUARRY_METRICS__ENABLED``).
        tenant: The ``tenant`` label of the searches it reports (one telemetry per tenant view).
    """

    def __init__(self, *, metrics: bool = True, tenant: str = "default") -> None:
        self.metrics = metrics
        self.tenant = tenant
        self._children: dict[tuple[str, str, str], Histogram] = {}

    def for_tenant(self, tenant: str) -> SearchTelemetry:
        """The telemetry of tenant ``tenant``'s searches (its series carry ``tenant``)."""
        return SearchTelemetry(metrics=self.metrics, tenant=tenant)

    def __call__(self, collection: str, mode: str, result: SearchResult) -> None:
        """Report ``result`` (a search of ``collection`` in ``mode``)."""
        if self.metrics:
            self.observe(collection, mode, result.stage_times)
            if result.degraded:
                DEGRADED.labels("dense_skipped").inc()
        if tracing.TRACER is not None:
            tracing.search_spans(collection, mode, result)

    def observe(self, collection: str, mode: str, stage_times: Mapping[str, tuple[float, float]]) -> None:
        """Observe each stage's duration (``(start, end)`` in seconds of one clock)."""
        for stage, (start, end) in stage_times.items():
            key = (stage, collection, mode)
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = STAGE_SECONDS.labels(stage, self.tenant, collection, mode)
            child.observe(end - start)


def observe_llm(tenant: str, collection: str, mode: str, ttft_s: float | None, total_s: float) -> None:
    """Observe an answer's generation: time to its first text token and to its end, in seconds."""
    if ttft_s is not None:
        STAGE_SECONDS.labels("llm_ttft", tenant, collection, mode).observe(ttft_s)
    STAGE_SECONDS.labels("llm_total", tenant, collection, mode).observe(total_s)


class TenantView:
    """The registry as one tenant may read it: every series but those of another tenant.

    A sample whose ``tenant`` label names another tenant is left out (a family left empty too);
    the process' own series (requests per route, queue depths) carry no tenant and stay.
    """

    def __init__(self, tenant: str, registry: CollectorRegistry = REGISTRY) -> None:
        self.tenant = tenant
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        """The registry's families, each with the samples this tenant may see."""
        for family in self.registry.collect():
            samples = [s for s in family.samples if s.labels.get("tenant", self.tenant) == self.tenant]
            if not samples:
                continue
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = samples
            yield kept
