"""OpenTelemetry tracing for every room: off by default, one helper so each room adds a few lines.

    --otlp-endpoint http://collector:4317   (or $RADIXMESH_OTLP_ENDPOINT; empty: off)

    --otlp-sample-rate 0.1                  (or $RADIXMESH_OTLP_SAMPLE_RATE; default 1)

`ServiceRuntime` calls `configure_tracing(name, endpoint, sample_rate)` at start and
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

from radixmesh.errors import InvalidArgument

ENV_ENDPOINT = "RADIXMESH_OTLP_ENDPOINT"
ENV_EXPORT_DELAY = "OTEL_BSP_SCHEDULE_DELAY"
TRACEPARENT = "traceparent"
MAX_LINKS = 4096
"""Links one span may carry: an executor step links to every traced sequence in it (the
SDK's default of 128 would drop links past batch 128)."""
MAX_EVENTS = 1024
"""Events one span may carry: a request's span holds its queue waits, prefill chunks, decode
and cache verbs as events (the SDK's default of 128 would drop a long prompt's last chunks)."""
EXPORT_QUEUE_SPANS = 16384
"""Finished spans the batch processor holds before it drops new ones (the SDK's 2048
overflows in a second at batch 64 with every request traced)."""
EXPORT_BATCH_SPANS = 2048
"""Spans per OTLP export call: one call per second at about that rate, not four."""
EXPORT_DELAY_MS = 5000
"""Longest a finished span waits for its export (a full batch goes sooner); the SDK's own
default, overridden by $OTEL_BSP_SCHEDULE_DELAY (ms). Each export is a gRPC call of a few
milliseconds of CPU whatever its size, so at ten spans a second a call a second was
about as costly as the spans themselves."""
_PROPAGATOR = TraceContextTextMapPropagator()
_STATE: dict[str, Any] = {"provider": None, "service": None}
_TRACERS: dict[tuple[int, str], tuple[Any, trace.Tracer]] = {}
"""(provider, tracer) by (id of the provider, name): the tracers `tracer` made."""
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
    "export_delay_ms",
    "link_to",
    "record_span",
    "recording_span",
    "sampled",
    "shutdown_tracing",
    "traceparent_from_metadata",
    "traceparent_of",
    "tracer",
]


def configure_tracing(service: str, endpoint: str | None, sample_rate: float = 1.0) -> bool:
    """Export this process's spans over OTLP/gRPC to `endpoint`; False (and nothing) when empty.

    `sample_rate`: head sampling of the traces this process starts (by trace id, so every
    service that starts one decides alike); a span continued from a remote parent follows
    the parent's sampled flag (W3C traceparent's `01`), so a trace is recorded whole or not
    at all. An unsampled span is a no-op that still carries the trace id downstream."""
    endpoint = (endpoint or "").strip()
    if not endpoint or _STATE["provider"] is not None:
        return _STATE["provider"] is not None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased

    insecure = not endpoint.startswith("https://")
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=insecure, timeout=5)
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"radixmesh-{service}"}),
        span_limits=SpanLimits(max_links=MAX_LINKS, max_events=MAX_EVENTS),
        sampler=ParentBased(_linked_or_ratio(sample_rate)),
    )
    provider.add_span_processor(
        BatchSpanProcessor(
            exporter,
            max_queue_size=EXPORT_QUEUE_SPANS,
            schedule_delay_millis=export_delay_ms(),
            max_export_batch_size=EXPORT_BATCH_SPANS,
        )
    )
    _STATE.update(provider=provider, service=service)
    return True


def export_delay_ms() -> int:
    """The batch span processor's delay: $OTEL_BSP_SCHEDULE_DELAY, else EXPORT_DELAY_MS."""
    value = os.environ.get(ENV_EXPORT_DELAY, "").strip()
    if not value:
        return EXPORT_DELAY_MS
    try:
        delay = int(value)
    except ValueError:
        delay = 0
    if delay <= 0:
        raise InvalidArgument(f"{ENV_EXPORT_DELAY} must be a positive number of ms, got {value!r}")
    return delay


def _linked_or_ratio(rate: float) -> Any:
    """The sampler of root spans: a span linked to a sampled span is sampled (an
    `executor.step` is recorded when a request it ran is), any other by trace id at `rate`."""
    from opentelemetry.sdk.trace.sampling import Decision, SamplingResult, TraceIdRatioBased

    class LinkedOrRatio(TraceIdRatioBased):
        def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None,
                          links=None, trace_state=None) -> SamplingResult:  # fmt: skip
            if any(link.context.trace_flags.sampled for link in links or ()):
                return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
            return super().should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return f"LinkedOrRatio{{{self.rate}}}"

    return LinkedOrRatio(rate)


def shutdown_tracing() -> None:
    """Flush and stop the exporter (idempotent)."""
    provider, _STATE["provider"] = _STATE["provider"], None
    if provider is not None:
        provider.shutdown()


def enabled() -> bool:
    return _STATE["provider"] is not None


def tracer(name: str) -> trace.Tracer:
    """The configured tracer for `name` (a module), or the no-op tracer while tracing is off.
    One tracer per name and provider (the SDK builds a new one on each `get_tracer`)."""
    provider = _STATE["provider"]
    if provider is None:
        return trace.NoOpTracer()
    key = (id(provider), name)
    found = _TRACERS.get(key)
    if found is None or found[0] is not provider:
        found = _TRACERS[key] = (provider, provider.get_tracer(name))
    return found[1]


def recording_span() -> trace.Span | None:
    """The current span when tracing is on and it records (a sampled trace); else None, so a
    caller formats no event attributes for a span that would drop them."""
    if _STATE["provider"] is None:
        return None
    span = trace.get_current_span()
    return span if span.is_recording() else None


def context_from_traceparent(value: str | None) -> otel_context.Context | None:
    """The remote parent named by a W3C traceparent; None for none or a malformed one."""
    if not value:
        return None
    ctx = _PROPAGATOR.extract({TRACEPARENT: value})
    span = trace.get_current_span(ctx)
    return ctx if span.get_span_context().is_valid else None


def sampled(traceparent: str | None) -> bool:
    """Whether a W3C traceparent's flags say its trace is recorded (the low bit of its last
    field); False for none. A cheap test before parsing: it does not check the rest."""
    if not traceparent or len(traceparent) < 2:
        return False
    try:
        return bool(int(traceparent[-2:], 16) & 1)
    except ValueError:
        return False


def link_to(traceparent: str | None) -> Link | None:
    """A span link to the (remote) span a W3C traceparent names; None for none, a bad one,
    or one whose trace is not sampled (nothing records it, a link would lead nowhere)."""
    if not sampled(traceparent):
        return None
    ctx = context_from_traceparent(traceparent)
    if ctx is None:
        return None
    context = trace.get_current_span(ctx).get_span_context()
    return Link(context) if context.trace_flags.sampled else None


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
