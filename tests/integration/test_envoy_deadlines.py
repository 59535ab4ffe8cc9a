"""Deadlines and shutdown of streams that have started: Envoy -> `python -m gateway.main` ->
a scheduler that streams one token per step until it is aborted.

- A gRPC deadline that passes mid-stream reaches the client as DEADLINE_EXCEEDED, through
  Envoy as well as straight to the gateway (Envoy does not enforce it: it could only reset
  a stream whose headers are out, which the client sees as INTERNAL), and the request is
  aborted at the scheduler.
- A gateway shutting down ends the streams still running at the end of its grace with
  UNAVAILABLE `the gateway is shutting down`, on gRPC and on HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest

from gateway.core.tokenizer import Tokenizer
from gateway.envoy import GatewayAddress
from radixmesh import wire
from radixmesh.v1 import inference_pb2, inference_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from services.common.config import free_port
from services.common.health import wait_for_serving
from tests.fixtures.envoy import EdgeEnvoy, start_envoy
from tests.fixtures.gateway_fakes import make_model_folder
from tests.fixtures.runtime import running_runtime

STEP_S = 0.05
"""The endless scheduler's pace: one token per running request per step."""
MAX_TOKENS = 56
"""Within the tiny model's 64 positions: a stream of about 2.8 s at STEP_S."""
NUM_DEADLINE_CALLS = 6


class EndlessScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Streams one token per step to every request until it is aborted (it ignores the
    request's own deadline, so that only the gateway's abort can end it)."""

    def __init__(self, token_id: int) -> None:
        self.token_id = token_id
        self.submitted: asyncio.Queue[str] = asyncio.Queue()
        self.aborted: asyncio.Queue[str] = asyncio.Queue()
        self.first_token: asyncio.Queue[str] = asyncio.Queue()
        """req_ids whose first token went out."""

    async def GetLoad(self, request, context):
        executor = scheduler_pb2.ExecutorLoad(executor_id="e0", model="tiny", healthy=True)
        return scheduler_pb2.GetLoadResponse(executors=[executor])

    async def Stream(self, request_iterator, context):
        running: set[str] = set()
        wake = asyncio.Event()

        async def read() -> None:
            async for message in request_iterator:
                op = message.WhichOneof("op")
                if op in ("submit", "submit_batch"):
                    for submit in wire.submits_of(message):
                        running.add(submit.req_id)
                        self.submitted.put_nowait(submit.req_id)
                elif op == "abort" and message.abort.req_id in running:
                    running.discard(message.abort.req_id)
                    self.aborted.put_nowait(message.abort.req_id)
                wake.set()

        reader = asyncio.create_task(read())
        first: set[str] = set()
        try:
            step = 0
            while True:
                if not running:
                    wake.clear()
                    await wake.wait()
                    continue
                step += 1
                updates = [
                    scheduler_pb2.TokenUpdate(req_id=r, token_ids=[self.token_id]) for r in running
                ]
                yield scheduler_pb2.StreamResponse(step_id=step, updates=updates)
                for req_id in running - first:
                    first.add(req_id)
                    self.first_token.put_nowait(req_id)
                await asyncio.sleep(STEP_S)  # the pace of generation
        finally:
            reader.cancel()


@contextlib.asynccontextmanager
async def running_edge(
    tmp_path: Path, *, grace_s: float = 5.0, envoy: bool = True
) -> AsyncIterator[tuple[EndlessScheduler, asyncio.subprocess.Process, int, int, EdgeEnvoy | None]]:
    """(scheduler, gateway process, gRPC port, HTTP port, Envoy or None), all started."""
    folder = make_model_folder(tmp_path / "tiny")
    tokenizer = Tokenizer.from_folder(folder)
    token_id = tokenizer._hf.encode("the", add_special_tokens=False)[0]
    scheduler = EndlessScheduler(token_id)

    def register(server) -> None:
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler, server)

    async with running_runtime(register, ["radixmesh.v1.Scheduler"]) as runtime:
        grpc_port, http_port = free_port(), free_port()
        gateway = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.main", f"--port={grpc_port}", f"--http-port={http_port}",
            f"--model={folder}", "--model-name=tiny", f"--scheduler-address={runtime.address}",
            f"--grace-seconds={grace_s}", stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        edge: EdgeEnvoy | None = None
        try:
            await wait_for_serving(f"127.0.0.1:{grpc_port}", "", timeout=120)
            if envoy:
                address = GatewayAddress("127.0.0.1", grpc_port, http_port)
                edge = await asyncio.to_thread(start_envoy, tmp_path, address, keep_access_log=False)
            yield scheduler, gateway, grpc_port, http_port, edge
        finally:
            if edge is not None:
                assert edge.stop() == 0
            if gateway.returncode is None:
                gateway.kill()
                await gateway.wait()


async def generate_until_error(port: int, timeout_s: float | None) -> tuple[int, grpc.aio.AioRpcError]:
    """A long Generate stream to `port`: (chunks received, the error that ended it)."""
    request = inference_pb2.GenerateRequest(
        prompt="hi", sampling=inference_pb2.SamplingParams(max_tokens=MAX_TOKENS)
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        num_chunks = 0
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for response in stub.Generate(request, timeout=timeout_s):
                num_chunks += response.HasField("chunk")
        return num_chunks, info.value


@pytest.mark.parametrize("through_envoy", [True, False], ids=["envoy", "gateway"])
async def test_a_deadline_mid_stream_is_deadline_exceeded_and_aborts_upstream(
    tmp_path, through_envoy
):
    async with running_edge(tmp_path, envoy=through_envoy) as (scheduler, _, grpc_port, _, edge):
        port = edge.public_port if edge is not None else grpc_port
        for _ in range(NUM_DEADLINE_CALLS):
            num_chunks, error = await generate_until_error(port, timeout_s=0.5)
            assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error.details()
            assert "Deadline Exceeded" in error.details()  # the client's own words (gRPC core)
            assert num_chunks > 0  # the deadline passed mid-stream, after the headers
            req_id = await asyncio.wait_for(scheduler.submitted.get(), 10)
            assert await asyncio.wait_for(scheduler.aborted.get(), 10) == req_id
        assert scheduler.submitted.empty() and scheduler.aborted.empty()


async def sse_events(port: int) -> list[str]:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as response,
    ):
        assert response.status == 200
        return [
            line.decode().strip()[5:].strip()
            async for line in response.content
            if line.startswith(b"data:")
        ]


@pytest.mark.parametrize("through_envoy", [True, False], ids=["envoy", "gateway"])
async def test_a_shutdown_ends_running_streams_with_unavailable_shutting_down(
    tmp_path, through_envoy
):
    async with running_edge(tmp_path, grace_s=2.0, envoy=through_envoy) as (
        scheduler, gateway, grpc_port, http_port, edge,
    ):  # fmt: skip
        grpc_call = asyncio.create_task(
            generate_until_error(edge.public_port if edge else grpc_port, timeout_s=60)
        )
        http_call = asyncio.create_task(sse_events(edge.public_port if edge else http_port))
        for _ in range(2):  # both streams are running
            await asyncio.wait_for(scheduler.first_token.get(), 30)
        gateway.send_signal(signal.SIGTERM)
        num_chunks, error = await asyncio.wait_for(grpc_call, 30)
        assert num_chunks > 0
        assert (error.code(), error.details()) == (
            grpc.StatusCode.UNAVAILABLE,
            "the gateway is shutting down",
        )
        events = await asyncio.wait_for(http_call, 30)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"] == {
            "message": "the gateway is shutting down",
            "type": "server_error",
            "param": None,
            "code": "unavailable",
        }
        assert await asyncio.wait_for(gateway.wait(), 30) == 0
