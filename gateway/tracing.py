"""The gateway's spans: one trace per request, continued from the client's traceparent.

    with request_trace("gateway.Generate", traceparent, request_id) as trace:
        with phase("gateway.validate"): ...
        with phase("gateway.prepare"): ...   # gateway.template, gateway.tokenize inside
        with phase("gateway.stream"): ...    # the scheduler request's spans hang below

`request_trace` makes the request's span current for the rest of the call (the
tasks the gateway starts for it inherit it), so the scheduler client puts its
traceparent on the SubmitRequest. With tracing off both are no-ops.
"""

from __future__ import annotations

import contextlib
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
