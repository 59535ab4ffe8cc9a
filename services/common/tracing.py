"""OpenTelemetry tracing for every room: off by default, one helper so each room adds a few lines.

    --otlp-endpoint http://collector:4317   (or $RADIXMESH_OTLP_ENDPOINT; empty: off)

`ServiceRuntime` calls `configure_tracing(name, endpoint)` at start and
`shutdown_tracing()` on shutdown (which flushes what is queued). Until then,
or with tracing off, `tracer()` returns OpenTelemetry's no-op tracer, so a
traced code path costs a function call when nobody listens.

Context travels as W3C `traceparent` strings: clients send the header (gRPC
metadata or HTTP, both passed by Envoy), the gateway continues it and puts its
own span's `traceparent` on each SubmitRequest, the scheduler continues that.
Phases whose times a core already records (queue wait, prefill chunks,
decode) are written afterwards with explicit start and end times
(`record_span`), so the hot path keeps plain timestamps and no span objects.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

ENV_ENDPOINT = "RADIXMESH_OTLP_ENDPOINT"
TRACEPARENT = "traceparent"
MAX_LINKS = 4096
"""Links one span may carry: an executor step links to every traced sequence in it (the
SDK's default of 128 would drop links past batch 128)."""
_PROPAGATOR = TraceContextTextMapPropagator()
_STATE: dict[str, Any] = {"provider": None, "service": None}
"""The process's tracer provider once configured (one per process, like the registry)."""

__all__ = [
    "ENV_ENDPOINT",
    "TRACEPARENT",
    "Link",
    "SpanKind",
    "configure_tracing",
    "context_from_traceparent",
    "current_traceparent",
    "enabled",
    "endpoint_from_env",
    "epoch_ns",
    "link_to",
    "record_span",
    "shutdown_tracing",
    "traceparent_from_metadata",
    "traceparent_of",
    "tracer",
]


def configure_tracing(service: str, endpoint: str | None) -> bool:
    """Export this process's spans over OTLP/gRPC to `endpoint`; False (and nothing) when empty."""
    endpoint = (endpoint or "").strip()
    if not endpoint or _STATE["provider"] is not None:
        return _STATE["provider"] is not None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    insecure = not endpoint.startswith("https://")
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=insecure, timeout=5)
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"radixmesh-{service}"}),
        span_limits=SpanLimits(max_links=MAX_LINKS),
    )
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    _STATE.update(provider=provider, service=service)
    return True


def shutdown_tracing() -> None:
    """Flush and stop the exporter (idempotent)."""
    provider, _STATE["provider"] = _STATE["provider"], None
    if provider is not None:
        provider.shutdown()


def enabled() -> bool:
    return _STATE["provider"] is not None


def tracer(name: str) -> trace.Tracer:
    """The configured tracer for `name` (a module), or the no-op tracer while tracing is off."""
    provider = _STATE["provider"]
    if provider is None:
        return trace.NoOpTracer()
    return provider.get_tracer(name)


def context_from_traceparent(value: str | None) -> otel_context.Context | None:
    """The remote parent named by a W3C traceparent; None for none or a malformed one."""
    if not value:
        return None
    ctx = _PROPAGATOR.extract({TRACEPARENT: value})
    span = trace.get_current_span(ctx)
    return ctx if span.get_span_context().is_valid else None


def link_to(traceparent: str | None) -> Link | None:
    """A span link to the (remote) span a W3C traceparent names; None for none or a bad one."""
    ctx = context_from_traceparent(traceparent)
    return None if ctx is None else Link(trace.get_current_span(ctx).get_span_context())


def traceparent_of(span: trace.Span) -> str:
    """`00-<trace id>-<span id>-<flags>` of a span ("" for a no-op span)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get(TRACEPARENT, "")


def traceparent_from_metadata(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The `traceparent` of gRPC invocation metadata (or any key/value pairs)."""
    for key, value in metadata or ():
        if key.lower() == TRACEPARENT:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


_OFFSET_NS = time.time_ns() - time.monotonic_ns()


def epoch_ns(monotonic_s: float) -> int:
    """A time.monotonic() reading as Unix nanoseconds (what spans carry)."""
    return int(monotonic_s * 1e9) + _OFFSET_NS


def record_span(
    tracer_: trace.Tracer,
    name: str,
    start_s: float,
    end_s: float,
    parent: otel_context.Context | trace.Span | None = None,
    attributes: Mapping[str, Any] | None = None,
    events: Sequence[tuple[str, float, Mapping[str, Any]]] = (),
    kind: SpanKind = SpanKind.INTERNAL,
    links: Sequence[Link] = (),
) -> trace.Span:
    """A finished span over [start_s, end_s] (time.monotonic seconds), with timed events."""
    ctx = trace.set_span_in_context(parent) if isinstance(parent, trace.Span) else parent
    span = tracer_.start_span(
        name,
        context=ctx,
        kind=kind,
        attributes=dict(attributes or {}),
        links=list(links),
        start_time=epoch_ns(start_s),
    )
    for event, at_s, attrs in events:
        span.add_event(event, dict(attrs), timestamp=epoch_ns(at_s))
    span.end(end_time=epoch_ns(max(end_s, start_s)))
    return span


def endpoint_from_env() -> str:
    return os.environ.get(ENV_ENDPOINT, "")


def current_traceparent() -> str:
    """The traceparent of the span current in this context ("" when off or none)."""
    if _STATE["provider"] is None:
        return ""
    span = trace.get_current_span()
    return traceparent_of(span) if span.get_span_context().is_valid else ""
