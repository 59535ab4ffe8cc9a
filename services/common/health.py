"""The standard gRPC health service (`grpc.health.v1.Health`) for asyncio servers.

Unlike the stock asyncio servicer, `set` is a plain method (no await), so
`ServiceRuntime.set_serving()` can be called from sync code on the loop thread,
and `enter_graceful_shutdown` ends open Watch streams after they have seen
NOT_SERVING, so a watcher never holds up the server's grace period;
`wait_watchers_ended` lets the runtime cancel the calls left at the end of
the grace only after every watcher has been told.
Call every method from the event loop's thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


class HealthServicer(health_pb2_grpc.HealthServicer):
    """Per-service status; "" is the whole server."""

    def __init__(self) -> None:
        self._status: dict[str, int] = {"": SERVING}
        self._changed = asyncio.Event()
        self._shutting_down = False
        self._num_watchers = 0
        self._watchers_ended = asyncio.Event()  # set once shutting down with no Watch open

    def set(self, service: str, status: int) -> None:
        """Set a service's status and wake its watchers (ignored once shutting down)."""
        if self._shutting_down:
            return
        self._status[service] = status
        self._notify()

    def status(self, service: str = "") -> int | None:
        """The current status of `service`, None if never set."""
        return self._status.get(service)

    def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING for good; Watch streams send it and end."""
        if self._shutting_down:
            return
        for service in self._status:
            self._status[service] = NOT_SERVING
        self._shutting_down = True
        self._notify()
        if self._num_watchers == 0:
            self._watchers_ended.set()

    async def wait_watchers_ended(self) -> None:
        """Return once shutting down and every Watch stream has sent NOT_SERVING and ended."""
        await self._watchers_ended.wait()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context
    ) -> health_pb2.HealthCheckResponse:
        status = self._status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context) -> None:
        self._num_watchers += 1
        # Counted out once the call is done, its OK status sent, not when this returns:
        # calls cancelled between the two would end with an error instead.
        context.add_done_callback(self._watch_done)
        await self._follow(request.service, context)

    def _watch_done(self, _context) -> None:
        self._num_watchers -= 1
        if self._shutting_down and self._num_watchers == 0:
            self._watchers_ended.set()

    async def _follow(self, service: str, context) -> None:
        last = None
        while True:
            # The event, the status and the shutdown flag are read together, before the
            # write: a shutdown that lands while a write is in flight sets `changed`, and
            # the next turn sends its NOT_SERVING. Reading the flag after the write would
            # end the stream with the stale status as its last message.
            changed = self._changed
            status = self._status.get(service, SERVICE_UNKNOWN)
            final = self._shutting_down
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            if final:
                return
            await changed.wait()


_SERVING_STATUS = health_pb2.HealthCheckResponse.SERVING
_RETRY_WATCH_S = 0.2
"""Pause before watching again a server that ended the watch before serving."""
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
"""A server that comes (back) up is seen within about a second, not grpc's default 120 s."""


async def wait_for_serving(address: str, service: str = "", timeout: float = 30.0) -> None:
    """Return once `address` reports `service` SERVING on the health Watch stream.

    The call waits for the server to come up (wait_for_ready), then follows
    status changes as they are pushed: no polling. Raises TimeoutError naming
    the last status seen, or ConnectionError if the server ends the stream
    (it is shutting down) before serving.
    """
    last = "no answer"
    async with grpc.aio.insecure_channel(address, options=RECONNECT_OPTIONS) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        call = stub.Watch(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout, wait_for_ready=True
        )
        try:
            async for response in call:
                if response.status == _SERVING_STATUS:
                    call.cancel()
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(
                    f"{address} service {service!r} not SERVING after {timeout}s (last: {last})"
                ) from None
            raise ConnectionError(
                f"{address} health watch failed: {exc.code().name} {exc.details()}"
            ) from exc
    raise ConnectionError(
        f"{address} ended the health watch before {service!r} was SERVING ({last})"
    )


async def serving_lost(address: str, service: str = "") -> str:
    """Follow `address`'s health Watch stream and return, with the reason, once it reports
    anything but SERVING or the stream breaks (the server stopped or died). Call it after
    `wait_for_serving`; a server that is not up at all returns at once."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=service)
        )
        try:
            async for response in call:
                if response.status != _SERVING_STATUS:
                    call.cancel()
                    name = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
                    return f"{address} reports {service or 'the server'} {name}"
        except grpc.aio.AioRpcError as exc:
            return f"{address} health watch failed: {exc.code().name}"
    return f"{address} ended the health watch"


async def follow_serving(
    address: str,
    service: str,
    on_change: Callable[[bool, str], Awaitable[None] | None],
    timeout_per_wait_s: float = 3600.0,
) -> None:
    """Forever (cancel to stop): wait until `address` serves `service`, call
    `on_change(True, "")`, wait until it no longer does, call `on_change(False, reason)`.
    No polling: both waits follow the health Watch stream."""
    while True:
        try:
            await wait_for_serving(address, service, timeout_per_wait_s)
        except (TimeoutError, ConnectionError):
            await asyncio.sleep(_RETRY_WATCH_S)  # it ended the watch while stopping: retry
            continue
        result = on_change(True, "")
        if result is not None:
            await result
        reason = await serving_lost(address, service)
        result = on_change(False, reason)
        if result is not None:
            await result
