"""Helpers for tests and for `radixmesh serve`: free ports, waiting on health, a test server.

port = free_port()
await wait_for_serving(f"127.0.0.1:{port}", "radixmesh.v1.Cache", timeout=10)

async with running_runtime(register, ["radixmesh.v1.Cache"]) as runtime:
    channel = grpc.aio.insecure_channel(runtime.address)
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.config import ServerConfig
from services.common.server import ServiceRuntime

_SERVING = health_pb2.HealthCheckResponse.SERVING


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks; another process may take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


async def wait_for_serving(address: str, service: str = "", timeout: float = 30.0) -> None:
    """Return once `address` reports `service` SERVING on the health Watch stream.

    The call waits for the server to come up (wait_for_ready), then follows
    status changes as they are pushed: no polling. Raises TimeoutError naming
    the last status seen, or ConnectionError if the server ends the stream
    (it is shutting down) before serving.
    """
    last = "no answer"
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        call = stub.Watch(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout, wait_for_ready=True
        )
        try:
            async for response in call:
                if response.status == _SERVING:
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


@contextlib.asynccontextmanager
async def running_runtime(
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    config: ServerConfig | None = None,
) -> AsyncIterator[ServiceRuntime]:
    """A started, SERVING runtime on a free loopback port; shut down on exit."""
    runtime = ServiceRuntime(config or ServerConfig(name="test", grace_seconds=1.0))
    await runtime.start(register, service_names)
    try:
        runtime.set_serving()
        yield runtime
    finally:
        await runtime.shutdown()
