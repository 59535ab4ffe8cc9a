"""gzip on a gRPC call's responses when its client asks, by compressing its own request.

A client that sends its request with `grpc-encoding: gzip` gets its responses
gzip-compressed too; every other call is answered uncompressed, so the streams
of clients that never asked pay nothing. gRPC's server library strips
`grpc-encoding` before a handler sees the metadata, so Envoy copies it into
`x-radixmesh-grpc-encoding` on the gRPC routes (gateway/envoy/envoy.yaml.j2);
a client that talks to a gateway directly sends that key itself. The per-call
choice is `context.set_compression`, made before the first response message.
A server-wide default (`grpc.aio.server(compression=...)`) would gzip every
call of every client whose library accepts gzip, which all of them do.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

ENCODING_METADATA = "x-radixmesh-grpc-encoding"
"""Metadata key holding the client's own request encoding (copied by Envoy)."""

_FACTORIES = {
    (False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler),
}


def asks_for_gzip(metadata: Any) -> bool:
    """Whether the call's metadata says its client sent gzip (so it reads gzip too)."""
    for key, value in metadata or ():
        if key == ENCODING_METADATA:
            text = value if isinstance(value, str) else bytes(value).decode("latin-1")
            if "gzip" in (part.strip().lower() for part in text.split(",")):
                return True
    return False


class ResponseCompressionInterceptor(grpc.aio.ServerInterceptor):
    """Sets gzip on the responses of every call whose client asks (see the module doc)."""

    async def intercept_service(
        self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or not asks_for_gzip(handler_call_details.invocation_metadata):
            return handler
        attr, factory = _FACTORIES[(handler.request_streaming, handler.response_streaming)]
        behavior = getattr(handler, attr)
        if not handler.response_streaming:
            wrapped: Callable = _gzip_unary(behavior)
        elif inspect.iscoroutinefunction(behavior):
            wrapped = _gzip_writer(behavior)
        else:
            wrapped = _gzip_generator(behavior)
        return factory(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _gzip_unary(behavior: Callable) -> Callable:
    """A unary reply: the aio server applies a call's compression only to a message sent
    after initial metadata it sent itself, so the metadata goes first, once the reply is
    made (an error before that still ends the call with its status)."""

    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        context.set_compression(grpc.Compression.Gzip)
        result = behavior(request, context)
        result = await result if inspect.isawaitable(result) else result
        await context.send_initial_metadata(())
        return result

    return handler


def _gzip_writer(behavior: Callable) -> Callable:
    """A streaming handler that writes with `context.write`."""

    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        context.set_compression(grpc.Compression.Gzip)
        return await behavior(request, context)

    return handler


def _gzip_generator(behavior: Callable) -> Callable:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        context.set_compression(grpc.Compression.Gzip)
        responses = behavior(request, context)
        if hasattr(responses, "__aiter__"):
            try:
                async for response in responses:
                    yield response
            finally:
                if hasattr(responses, "aclose"):
                    await responses.aclose()
        else:
            for response in responses:
                yield response

    return handler
