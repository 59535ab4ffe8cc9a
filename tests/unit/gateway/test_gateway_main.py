"""`python -m gateway.main` as a process: health, both APIs, graceful SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys

import grpc
import openai
import pytest

from radixmesh.v1 import inference_pb2, inference_pb2_grpc
from services.common.config import free_port
from services.common.health import wait_for_serving


async def test_gateway_process_serves_and_stops_on_sigterm(fake_scheduler, model_folder):
    scheduler, scheduler_address = fake_scheduler
    grpc_port, http_port = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.main",
        f"--port={grpc_port}",
        f"--http-port={http_port}",
        f"--model={model_folder}",
        "--model-name=tiny",
        f"--scheduler-address={scheduler_address}",
        "--api-key=sk-1",
        "--rate-limit-per-s=100",
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await wait_for_serving(f"127.0.0.1:{grpc_port}", "radixmesh.v1.Inference", timeout=120)
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{http_port}/v1", api_key="sk-1", max_retries=0
        )
        reply = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content == scheduler.reply_text
        with pytest.raises(openai.AuthenticationError):
            await client.with_options(api_key="sk-2").models.list()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            models = await stub.ListModels(
                inference_pb2.ListModelsRequest(), metadata=[("authorization", "Bearer sk-1")]
            )
            assert [(m.id, m.num_executors) for m in models.models] == [("tiny", 1)]
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ListModels(inference_pb2.ListModelsRequest())
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
