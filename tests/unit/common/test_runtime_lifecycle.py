"""Health, reflection, binding and shutdown of a ServiceRuntime on a real port."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from runtime_fakes import CACHE, INFERENCE, start_mesh

from radixmesh.errors import InvalidArgument
from radixmesh.v1 import cache_pb2, inference_pb2
from services.common.config import ServerConfig, free_port
from services.common.health import wait_for_serving
from services.common.server import ServiceRuntime

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def check(channel: grpc.aio.Channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return (await stub.Check(health_pb2.HealthCheckRequest(service=service))).status


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "Cache-Service"),
        ("name", ""),
        ("host", ""),
        ("port", -1),
        ("port", 70000),
        ("port", True),
        ("metrics_port", 65536),
        ("grace_seconds", -1.0),
        ("grace_seconds", float("nan")),
        ("max_message_mb", 0),
        ("max_message_mb", 4096),
    ],
)
def test_server_config_rejects_bad_fields_by_name(field, value):
    with pytest.raises(InvalidArgument, match=f"^{field}:"):
        ServerConfig(**{"name": "cache", field: value})


def test_server_config_defaults():
    config = ServerConfig(name="cache")
    assert (config.host, config.port, config.metrics_port) == ("127.0.0.1", 0, None)
    assert (config.grace_seconds, config.max_message_bytes) == (5.0, 64 * 1024 * 1024)


async def test_health_not_serving_until_ready_then_serving(mesh):
    for service in ("", CACHE, INFERENCE):
        assert await check(mesh.channel, service) == NOT_SERVING
    mesh.runtime.set_serving()
    for service in ("", CACHE, INFERENCE):
        assert await check(mesh.channel, service) == SERVING
    mesh.runtime.set_serving(False)
    assert await check(mesh.channel, CACHE) == NOT_SERVING


async def test_health_check_of_unknown_service_is_not_found(mesh):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await check(mesh.channel, "radixmesh.v1.Nope")
    assert caught.value.code() is grpc.StatusCode.NOT_FOUND


async def test_watch_follows_changes_and_ends_at_shutdown(mesh):
    stub = health_pb2_grpc.HealthStub(mesh.channel)
    watch = stub.Watch(health_pb2.HealthCheckRequest(service=CACHE))
    assert (await watch.read()).status == NOT_SERVING
    mesh.runtime.set_serving()
    assert (await watch.read()).status == SERVING
    shutdown = asyncio.ensure_future(mesh.runtime.shutdown())
    assert (await watch.read()).status == NOT_SERVING
    assert await watch.read() is grpc.aio.EOF
    assert await watch.code() is grpc.StatusCode.OK
    await shutdown


async def test_set_serving_after_shutdown_is_ignored(mesh):
    mesh.runtime.set_serving()
    await mesh.runtime.shutdown()
    mesh.runtime.set_serving()
    assert mesh.runtime.health.status(CACHE) == NOT_SERVING
    assert mesh.runtime.stopping


async def test_reflection_lists_services_and_their_files(mesh):
    stub = reflection_pb2_grpc.ServerReflectionStub(mesh.channel)
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=CACHE),
    ]
    responses = [r async for r in stub.ServerReflectionInfo(iter(requests))]
    names = {s.name for s in responses[0].list_services_response.service}
    assert {CACHE, INFERENCE, "grpc.health.v1.Health"} <= names
    files = responses[1].file_descriptor_response.file_descriptor_proto
    assert any(b"radixmesh/v1/cache.proto" in f for f in files)


async def test_wait_for_serving_started_before_the_server_returns_once_serving():
    port = free_port()
    waiter = asyncio.ensure_future(wait_for_serving(f"127.0.0.1:{port}", CACHE, timeout=20))
    mesh = await start_mesh(port=port)
    try:
        done, _ = await asyncio.wait({waiter}, timeout=0.3)
        assert not done  # NOT_SERVING so far
        mesh.runtime.set_serving()
        await asyncio.wait_for(waiter, timeout=10)
    finally:
        await mesh.channel.close()
        await mesh.runtime.shutdown()


async def test_wait_for_serving_times_out_naming_the_status(mesh):
    # The timeout must outlast connecting and the first message (NOT_SERVING), which a
    # loaded machine can take past 0.3 s: then the last status seen is "no answer".
    with pytest.raises(TimeoutError, match=r"not SERVING after 2\.0s \(last: NOT_SERVING\)"):
        await wait_for_serving(mesh.runtime.address, CACHE, timeout=2.0)


async def test_wait_for_serving_fails_when_the_server_shuts_down(mesh):
    waiter = asyncio.ensure_future(wait_for_serving(mesh.runtime.address, CACHE, timeout=20))
    stub = health_pb2_grpc.HealthStub(mesh.channel)
    watch = stub.Watch(health_pb2.HealthCheckRequest(service=CACHE))
    assert (await watch.read()).status == NOT_SERVING
    await mesh.runtime.shutdown()
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(waiter, timeout=10)


async def test_a_taken_port_is_an_error_naming_the_port(mesh):
    other = ServiceRuntime(ServerConfig(name="common_test", port=mesh.runtime.port))
    with pytest.raises(OSError, match="port"):
        await other.start(lambda server: None, [CACHE])


async def test_address_and_ports_after_start(mesh):
    assert mesh.runtime.address == f"127.0.0.1:{mesh.runtime.port}"
    assert mesh.runtime.port > 0
    assert mesh.runtime.metrics_port is None


async def test_port_before_start_is_an_error():
    with pytest.raises(RuntimeError, match="after start"):
        _ = ServiceRuntime(ServerConfig(name="cache")).port


async def test_shutdown_refuses_new_calls_and_cancels_streams_past_grace(mesh):
    mesh.runtime.set_serving()
    mesh.inference.block = True
    call = mesh.inference_stub.Generate(inference_pb2.GenerateRequest(request_id="g"))
    assert (await call.read()).request_id == "g-0"
    hook_ran = asyncio.Event()

    async def on_shutdown():
        assert mesh.inference.closed.is_set()  # the server stopped before the hook
        hook_ran.set()

    watch = health_pb2_grpc.HealthStub(mesh.channel).Watch(health_pb2.HealthCheckRequest())
    assert (await watch.read()).status == SERVING
    shutdown = asyncio.ensure_future(mesh.runtime.shutdown(on_shutdown))
    # NOT_SERVING is pushed in the same loop step that stops the server taking calls.
    assert (await watch.read()).status == NOT_SERVING
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await mesh.cache_stub.Match(cache_pb2.MatchRequest(), wait_for_ready=False)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    # The blocked stream outlives the 1 s grace and is cancelled; then the hook runs.
    await asyncio.wait_for(shutdown, timeout=10)
    assert mesh.inference.cancelled.is_set()
    assert hook_ran.is_set()


async def test_shutdown_waits_only_as_long_as_in_flight_calls(mesh):
    mesh.runtime.set_serving()
    loop = asyncio.get_running_loop()
    start = loop.time()
    await mesh.runtime.shutdown()
    assert loop.time() - start < mesh.runtime.config.grace_seconds


async def test_shutdown_twice_runs_the_hook_once(mesh):
    calls = []

    async def on_shutdown():
        calls.append(1)

    await asyncio.gather(mesh.runtime.shutdown(on_shutdown), mesh.runtime.shutdown(on_shutdown))
    await mesh.runtime.shutdown(on_shutdown)
    assert calls == [1]


async def test_serve_until_signal_returns_after_request_shutdown(mesh):
    hook_ran = asyncio.Event()

    async def on_shutdown():
        hook_ran.set()

    serving = asyncio.ensure_future(mesh.runtime.serve_until_signal(on_shutdown))
    mesh.runtime.set_serving()
    assert await check(mesh.channel, "") == SERVING
    assert not serving.done()
    mesh.runtime.request_shutdown()
    await asyncio.wait_for(serving, timeout=10)
    assert hook_ran.is_set()
