"""OpenTelemetry traces: a span per request, per search and per query stage, one per LLM call.

Off by default (``QUARRY_TRACING__ENABLED``; the ``otel`` extra installs the SDK and the OTLP
exporter). When on, :func:`configure` installs a tracer whose OTLP/HTTP exporter reads the
standard variables (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``,
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``...); ``OTEL_SDK_DISABLED=true`` still turns
it off. While :data:`TRACER` is ``None`` nothing here runs: no per-request cost.

Spans (names and attributes of OpenTelemetry's GenAI semantic conventions where they apply):

* ``POST /v1/collections/{name}/search`` (server, :class:`~quarry.api.observe.ObserveMiddleware`;
  a ``traceparent`` header continues the caller's trace), with ``http.*`` and ``quarry.request_id``;
* ``retrieval {collection}`` (``gen_ai.operation.name=retrieval``, ``gen_ai.data_source.id``), with
  a child per stage: ``embed``, ``bm25``, ``ann``, ``fusion``, ``rerank``, ``hydrate``;
* ``chat {model}`` (client; ``gen_ai.operation.name=chat``, ``gen_ai.request.*``,
  ``gen_ai.response.finish_reasons``, ``gen_ai.usage.*``).

Query text, document text and prompts are never put in a span.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

    from quarry.settings import TracingSettings



class SearchResult(Protocol):
    """What a search span reads of a search's answer (:class:`retrieval.results.SearchResult`)."""

    @property
    def hits(self) -> Sequence[Any]: ...  # noqa: D102
    @property
    def degraded(self) -> Sequence[str]: ...  # noqa: D102
    @property
    def stage_times(self) -> Mapping[str, tuple[float, float]]: ...  # noqa: D102


class GenerationParams(Protocol):
    """What an LLM span reads of a call's parameters (:class:`generation.base.GenerationParams`)."""

    @property
    def max_tokens(self) -> int: ...  # noqa: D102
    @property
    def temperature(self) -> float: ...  # noqa: D102
    @property
    def seed(self) -> int | None: ...  # noqa: D102


class Usage(Protocol):
    """What an LLM span reads of a call's token counts (:class:`generation.base.Usage`)."""

    @property
    def prompt_tokens(self) -> int | None: ...  # noqa: D102
    @property
    def completion_tokens(self) -> int | None: ...  # noqa: D102


TRACER: Tracer | None = None
"""The tracer of Quarry's spans, or ``None`` while tracing is off."""
_PROVIDER: TracerProvider | None = None


def configure(settings: TracingSettings, exporter: SpanExporter | None = None) -> bool:
    """Turn tracing on if ``settings`` ask for it (once per process; later calls do nothing).

    Args:
        settings: ``QUARRY_TRACING__*``.
        exporter: Where spans go (default: OTLP over HTTP, from the ``OTEL_*`` variables); spans
            are batched, or handed over one by one to an exporter passed here (tests).

    Returns:
        Whether this call turned tracing on (the caller then calls :func:`shutdown`).

    Raises:
        ConfigError: Tracing is asked for and the ``otel`` extra is not installed.
    """
    global TRACER, _PROVIDER
    if not settings.enabled or TRACER is not None:
        return False
    try:
        from opentelemetry.sdk.resources import OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError as exc:
        from quarry.errors import ConfigError

        raise ConfigError("QUARRY_TRACING__ENABLED needs the otel extra: pip install 'quarry[otel]'") from exc
    # service.name "quarry" unless OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES) names another
    resource = Resource.create({"service.name": "quarry"}).merge(OTELResourceDetector().detect())
    provider = TracerProvider(resource=resource)
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    _PROVIDER, TRACER = provider, provider.get_tracer("quarry")
    return True


def shutdown() -> None:
    """Export the spans still queued and turn tracing off."""
    global TRACER, _PROVIDER
    if _PROVIDER is not None:
        _PROVIDER.shutdown()
    TRACER, _PROVIDER = None, None


def _ns(perf_s: float, offset_ns: int) -> int:
    return int(perf_s * 1e9) + offset_ns


def search_spans(collection: str, mode: str, result: SearchResult) -> None:
    """Record a finished search as a ``retrieval`` span with a child span per stage.

    The spans are written after the fact from :attr:`SearchResult.stage_times`
    (``time.perf_counter()`` seconds, turned into wall-clock nanoseconds here), so the query path
    holds no span open across its awaits; their parent is the current span (the request's).
    """
    tracer = TRACER
    if tracer is None or not result.stage_times:
        return
    from opentelemetry import trace

    offset_ns = time.time_ns() - time.perf_counter_ns()
    now = time.perf_counter()
    start = min(s for s, _ in result.stage_times.values())
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "retrieval", "gen_ai.data_source.id": collection, "quarry.mode": mode,
        "quarry.hits": len(result.hits), "quarry.degraded": bool(result.degraded),
    }
    parent = tracer.start_span(f"retrieval {collection}", start_time=_ns(start, offset_ns), attributes=attributes)
    context = trace.set_span_in_context(parent)
    for stage, (begin, end) in result.stage_times.items():
        span = tracer.start_span(stage, context=context, start_time=_ns(begin, offset_ns))
        span.end(end_time=_ns(end, offset_ns))
    parent.end(end_time=_ns(now, offset_ns))


def llm_span(model: str | None, params: GenerationParams, *, stream: bool = True) -> Span | None:
    """Start the span of one LLM call (``chat {model}``), or ``None`` while tracing is off."""
    tracer = TRACER
    if tracer is None:
        return None
    from opentelemetry.trace import SpanKind

    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
        "gen_ai.request.max_tokens": params.max_tokens, "gen_ai.request.temperature": params.temperature,
        "gen_ai.request.stream": stream,
    }
    if model:
        attributes["gen_ai.request.model"] = model
    if params.seed is not None:
        attributes["gen_ai.request.seed"] = params.seed
    return tracer.start_span(f"chat {model or ''}".strip(), kind=SpanKind.CLIENT, attributes=attributes)


def end_llm_span(
    span: Span | None, *, ttft_s: float | None, usage: Usage | None, finish: str | None, error: Exception | None
) -> None:
    """End an LLM call's span with what the call returned (or how it failed)."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    if ttft_s is not None:
        span.set_attribute("gen_ai.response.time_to_first_chunk", ttft_s)
    if finish:
        span.set_attribute("gen_ai.response.finish_reasons", [finish])
    if usage is not None and usage.prompt_tokens is not None:
        span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
    if usage is not None and usage.completion_tokens is not None:
        span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
    if error is not None:
        span.set_attribute("error.type", type(error).__name__)
        span.set_status(Status(StatusCode.ERROR))
    span.end()
