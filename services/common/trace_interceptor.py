"""Unary RPCs that arrive with a W3C `traceparent` in their metadata run under a server span.

`ServiceRuntime` installs it on every service; it does nothing while tracing
is off, for streaming RPCs (the step and cache streams carry many requests:
their spans are written by the rooms), or for calls without a traceparent (a
heartbeat is not worth a trace of its own). Clients add the metadata with
`trace_metadata()` (the cache client does, for the gateway's session and
result-cache calls).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import grpc

from services.common import tracing


def trace_metadata() -> tuple[tuple[str, str], ...] | None:
    """gRPC metadata carrying the current span's traceparent (None when off or none)."""
    traceparent = tracing.current_traceparent()
    return ((tracing.TRACEPARENT, traceparent),) if traceparent else None


class TraceInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler
        if not tracing.enabled():
            return handler
        parent = tracing.context_from_traceparent(
            tracing.traceparent_from_metadata(handler_call_details.invocation_metadata)
        )
        if parent is None:
            return handler
        behavior, method = handler.unary_unary, handler_call_details.method

        async def traced(request: Any, context: grpc.aio.ServicerContext) -> Any:
            with tracing.tracer("radixmesh.rpc").start_as_current_span(
                method, context=parent, kind=tracing.SpanKind.SERVER,
                attributes={"rpc.system": "grpc", "rpc.method": method},
            ):  # fmt: skip
                result = behavior(request, context)
                return await result if inspect.isawaitable(result) else result

        return grpc.unary_unary_rpc_method_handler(
            traced,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
