"""A graceful stop on a real port: open health watchers are told before anything is cancelled."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from runtime_fakes import CACHE, start_mesh

from radixmesh.v1 import inference_pb2

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
NUM_WATCHERS = 8


@pytest.mark.parametrize("grace", [0.0, 0.3])
async def test_every_open_watch_sends_not_serving_before_the_grace_cancels_calls(grace):
    mesh = await start_mesh(grace_seconds=grace)
    try:
        mesh.runtime.set_serving()
        mesh.inference.block = True  # held until cancelled: it outlives any grace
        call = mesh.inference_stub.Generate(inference_pb2.GenerateRequest(request_id="g"))
        assert (await call.read()).request_id == "g-0"
        stub = health_pb2_grpc.HealthStub(mesh.channel)
        watches = [
            stub.Watch(health_pb2.HealthCheckRequest(service=service))
            for service in ("", CACHE) * (NUM_WATCHERS // 2)
        ]
        for watch in watches:
            assert (await watch.read()).status == SERVING
        await mesh.runtime.shutdown()
        for watch in watches:
            assert (await watch.read()).status == NOT_SERVING
            assert await watch.read() is grpc.aio.EOF
            assert await watch.code() is grpc.StatusCode.OK
        assert mesh.inference.cancelled.is_set()  # the grace did end, cancelling the stream
        call.cancel()
    finally:
        await mesh.channel.close()
        await mesh.runtime.shutdown()
