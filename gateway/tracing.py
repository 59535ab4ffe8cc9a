"""The gateway's spans: one span per request, continued from the client's traceparent.

    with request_trace("gateway.Generate", traceparent, request_id) as trace:
        with timed_event("gateway.validate"): ...
        with timed_event("gateway.prepare"): ...  # gateway.template, gateway.tokenize inside
        with timed_event("gateway.stream"): ...   # the scheduler request's spans hang below

`request_trace` makes the request's span current for the rest of the call (the
tasks the gateway starts for it inherit it), so the scheduler client puts its
traceparent on the SubmitRequest. The request's phases are events of that one span
(`timed_event`: the phase's start as the event's time, its length as
`radixmesh.duration_ms`), not spans of their own: a span costs the SDK a few hundred
microseconds of CPU to create, queue and export, an event a few. `phase` makes a child
span, for what has children of its own (a program's statements). With tracing off, or a
request whose trace is not sampled, all three are no-ops.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from services.common import tracing

_NAME = "radixmesh.gateway"


@contextlib.contextmanager
def request_trace(name: str, traceparent: str | None, request_id: str) -> Iterator[Any]:
    """The request's server span, current until the block ends (None while tracing is off)."""
    if not tracing.enabled():
        yield None
        return
    span = tracing.tracer(_NAME).start_span(
        name,
        context=tracing.context_from_traceparent(traceparent),
        kind=tracing.SpanKind.SERVER,
        attributes={"radixmesh.request_id": request_id},
    )
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield span
    except BaseException as exc:
        span.record_exception(exc)
        span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
        raise
    finally:
        otel_context.detach(token)
        span.end()


@contextlib.contextmanager
def phase(name: str, **attributes: Any) -> Iterator[Any]:
    """A child span of the current one, attributes as `radixmesh.<key>` (a no-op while off)."""
    if not tracing.enabled():
        yield None
        return
    attrs = {f"radixmesh.{k}": v for k, v in attributes.items()}
    with tracing.tracer(_NAME).start_as_current_span(name, attributes=attrs) as span:
        yield span


@contextlib.contextmanager
def timed_event(name: str, **attributes: Any) -> Iterator[None]:
    """A phase of the request as an event of the current span: at the phase's start, with
    its length in `radixmesh.duration_ms` and attributes as `radixmesh.<key>` (a no-op
    while tracing is off or the current span records nothing)."""
    if not tracing.enabled():
        yield None
        return
    span = trace.get_current_span()
    if not span.is_recording():
        yield None
        return
    start = time.monotonic()
    try:
        yield None
    finally:
        attrs: dict[str, Any] = {f"radixmesh.{k}": v for k, v in attributes.items()}
        attrs["radixmesh.duration_ms"] = round((time.monotonic() - start) * 1e3, 3)
        span.add_event(name, attrs, timestamp=tracing.epoch_ns(start))
