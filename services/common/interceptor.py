"""Map core exceptions to gRPC status codes, on every handler shape, in one place.

`ErrorInterceptor` wraps each handler (unary-unary, unary-stream, stream-unary,
stream-stream). A `radixmesh.errors` exception becomes its status code
with the exception's message; a handler's own `context.abort` and cancellation
pass through unchanged; anything else becomes INTERNAL with a short message and
is logged with its traceback. It also binds the caller's `x-request-id` metadata
to the log context and, given a room, counts calls per method and code:
`radixmesh_<room>_grpc_requests_total{method,code}` and
`radixmesh_<room>_grpc_request_seconds{method}`.

Clients go the other way with `error_from_status` / `error_from_rpc_error`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable
from typing import Any, NoReturn

import grpc

from radixmesh import errors
from services.common.logging import get_logger, set_request_id
from services.common.metrics import counter, histogram

REQUEST_ID_METADATA = "x-request-id"

log = get_logger(__name__)

def status_code_of(exc: BaseException) -> grpc.StatusCode:
    """The status code an exception stands for (INTERNAL for an unexpected one)."""
    if isinstance(exc, errors.RadixmeshError):
        return getattr(grpc.StatusCode, str(exc.code), grpc.StatusCode.INTERNAL)
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        return exc.code()
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    if isinstance(exc, NotImplementedError):
        return grpc.StatusCode.UNIMPLEMENTED
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.INTERNAL


def error_from_status(code: grpc.StatusCode | str, message: str) -> errors.RadixmeshError:
    """The core exception for a remote status (a code with no class keeps its name in `code`)."""
    return errors.error_for_code(code.name if isinstance(code, grpc.StatusCode) else code, message)


def one_line(message: str) -> str:
    """An error message as one line: a multi-line one (a compiler's report, a nested
    status dump) has its lines joined with " | "."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return " | ".join(lines)


def error_from_rpc_error(exc: grpc.RpcError) -> errors.RadixmeshError:
    """`error_from_status` for a failed client call (`grpc.aio.AioRpcError`)."""
    return error_from_status(exc.code(), exc.details() or "")


def _request_id_of(details: grpc.HandlerCallDetails) -> str | None:
    for key, value in details.invocation_metadata or ():
        if key == REQUEST_ID_METADATA:
            return value if isinstance(value, str) else value.decode()
    return None


def _code_of(context: Any) -> grpc.StatusCode:
    code = context.code()
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.OK


_FACTORIES = {
    (False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler),
}


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Exceptions -> status codes for every RPC; optional per-method request metrics."""

    def __init__(self, room: str | None = None) -> None:
        self._requests = self._seconds = None
        self._num_active = 0  # handler bodies running now
        self._idle = asyncio.Event()
        self._idle.set()
        if room is not None:
            self._requests = counter(
                room,
                "grpc_requests_total",
                "gRPC calls served, by method and status code.",
                ("method", "code"),
            )
            self._seconds = histogram(
                room,
                "grpc_request_seconds",
                "Time from call start to status, by method.",
                ("method",),
            )

    async def intercept_service(
        self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        req_id = _request_id_of(handler_call_details)
        attr, factory = _FACTORIES[(handler.request_streaming, handler.response_streaming)]
        behavior = getattr(handler, attr)
        if handler.response_streaming and not inspect.iscoroutinefunction(behavior):
            wrapped = self._wrap_generator(behavior, method, req_id)
        else:
            wrapped = self._wrap_coroutine(behavior, method, req_id)
        return factory(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _wrap_coroutine(self, behavior: Callable, method: str, req_id: str | None) -> Callable:
        """Unary responses, and streaming handlers that write with `context.write`."""

        async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
            set_request_id(req_id)  # each RPC runs in its own task: no reset needed
            start = self._enter()
            code = None
            try:
                result = behavior(request, context)
                return await result if inspect.isawaitable(result) else result
            except (asyncio.CancelledError, GeneratorExit):
                code = grpc.StatusCode.CANCELLED
                raise
            except grpc.aio.BaseError:  # context.abort() in the handler
                raise
            except Exception as exc:
                code = status_code_of(exc)
                await self._abort(exc, code, context, method)
            finally:
                self._exit(method, code or _code_of(context), start)

        return handler

    def _wrap_generator(self, behavior: Callable, method: str, req_id: str | None) -> Callable:
        """Streaming responses produced by an (async) generator: errors may come mid-stream."""

        async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
            set_request_id(req_id)
            start = self._enter()
            code = None
            try:
                responses = behavior(request, context)
                if hasattr(responses, "__aiter__"):
                    async with _closing(responses):
                        async for response in responses:
                            yield response
                else:
                    for response in responses:
                        yield response
            except (asyncio.CancelledError, GeneratorExit):
                code = grpc.StatusCode.CANCELLED
                raise
            except grpc.aio.BaseError:
                raise
            except Exception as exc:
                code = status_code_of(exc)
                await self._abort(exc, code, context, method)
            finally:
                self._exit(method, code or _code_of(context), start)

        return handler

    async def _abort(
        self, exc: Exception, code: grpc.StatusCode, context: Any, method: str
    ) -> NoReturn:
        if isinstance(exc, errors.RadixmeshError | grpc.RpcError | NotImplementedError):
            message = _message_of(exc) or code.name
            log.debug("rpc_failed", method=method, code=code.name, message=message)
        else:
            message = f"internal error ({type(exc).__name__}); see the server log"
            log.error("rpc_internal_error", method=method, exc_info=exc)
        await context.abort(code, one_line(message))
        raise AssertionError("context.abort returned")  # pragma: no cover

    @property
    def num_active(self) -> int:
        """Handlers running now (cancelled ones count until they have unwound)."""
        return self._num_active

    async def wait_idle(self) -> None:
        """Return once no handler is running (the runtime awaits it after server.stop)."""
        await self._idle.wait()

    def _enter(self) -> float:
        self._num_active += 1
        self._idle.clear()
        return time.perf_counter()

    def _exit(self, method: str, code: grpc.StatusCode, start: float) -> None:
        self._num_active -= 1
        if self._num_active == 0:
            self._idle.set()
        if self._requests is None or self._seconds is None:
            return
        self._requests.labels(method, code.name).inc()
        self._seconds.labels(method).observe(time.perf_counter() - start)


def _message_of(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "details", None)):
        return exc.details() or ""
    return str(exc)


def _closing(responses: Any) -> contextlib.AbstractAsyncContextManager:
    if hasattr(responses, "aclose"):
        return contextlib.aclosing(responses)
    return contextlib.nullcontext()
