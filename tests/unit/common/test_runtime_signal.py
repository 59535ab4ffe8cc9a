"""SIGTERM / SIGINT to a real service process: graceful stop, hook, exit code 0."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from radixmesh.v1 import inference_pb2, inference_pb2_grpc
from services.common.config import free_port
from services.common.health import wait_for_serving

SCRIPT = Path(__file__).with_name("sigterm_service.py")
REPO = Path(__file__).resolve().parents[3]
INFERENCE = "radixmesh.v1.Inference"
GRACE_SECONDS = 20.0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
async def test_signal_stops_gracefully_after_in_flight_calls(sig):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), str(port), str(GRACE_SECONDS),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    try:
        address = f"127.0.0.1:{port}"
        await wait_for_serving(address, INFERENCE, timeout=60)
        async with grpc.aio.insecure_channel(address) as channel:
            call = inference_pb2_grpc.InferenceStub(channel).Generate(
                inference_pb2.GenerateRequest(request_id="r")
            )
            assert (await call.read()).request_id == "r-before"
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=INFERENCE)
            )
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            signalled_at = loop.time()
            proc.send_signal(sig)
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
            assert (await call.read()).request_id == "r-after"
            assert await call.read() is grpc.aio.EOF
            assert await call.code() is grpc.StatusCode.OK
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=GRACE_SECONDS + 10)
        stopped_after = loop.time() - signalled_at
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, stderr.decode()
    assert "on_shutdown ran num_finished=1" in stdout.decode()
    assert stopped_after < GRACE_SECONDS  # nothing held the server to the end of grace
    lines = [json.loads(line) for line in stderr.decode().splitlines()]
    # the runtime's own lifecycle (gRPC's may add a line of its own: a Watch stream whose
    # client has left by the time the server's last write reaches it)
    events = [
        line["event"] for line in lines
        if line["service"] == "sigterm_test" and line.get("logger") == "services.common.server"
    ]  # fmt: skip
    assert events[events.index("signal_received") :] == [
        "signal_received",
        "shutdown_started",
        "shutdown_finished",
    ]
    assert lines[[line["event"] for line in lines].index("signal_received")]["signal"] == sig.name
