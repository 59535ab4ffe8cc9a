"""Keyless callers behind the real Envoy: the gateway limits each client address, not Envoy.

Clients bind distinct loopback addresses (127.0.0.2, 127.0.0.3, ...) so Envoy sees
different clients; the gateway's limiter holds one request per address.
"""

from __future__ import annotations

import aiohttp
import grpc
import pytest

from gateway.core.auth import Admission
from gateway.core.models import ModelRegistry
from gateway.core.ratelimit import LocalRateLimiter, RateLimitConfig
from gateway.core.tokenizer import Tokenizer
from gateway.envoy import GatewayAddress
from gateway.openai_http import OpenAIHttpServer, start_http_server
from gateway.server import InferenceServicer
from radixmesh.v1 import inference_pb2, inference_pb2_grpc
from services.common.config import free_port
from services.scheduler.client import SchedulerClient
from tests.fixtures.envoy import start_envoy
from tests.fixtures.gateway_fakes import make_model_folder, running_fake_scheduler
from tests.fixtures.runtime import running_runtime

GATEWAY_LIMIT = "rate limit exceeded for this API key"
"""The gateway's own refusal (Envoy's listener-wide one says something else)."""


@pytest.fixture
async def edge(tmp_path):
    """The public base URL of Envoy in front of one in-process gateway (fake scheduler)."""
    tokenizer = Tokenizer.from_folder(make_model_folder(tmp_path / "model"))
    async with running_fake_scheduler(tokenizer) as (_, scheduler_address):
        channel = grpc.aio.insecure_channel(scheduler_address)
        upstream = SchedulerClient(channel)
        models = ModelRegistry({"tiny": tokenizer})
        limiter = LocalRateLimiter(RateLimitConfig(capacity=1, refill_per_s=0.001))
        admission = Admission(limiter=limiter)
        servicer = InferenceServicer(models, upstream, admission)
        http_port = free_port()
        http_app = OpenAIHttpServer(models, upstream, admission).build_app()
        runner = await start_http_server(http_app, "127.0.0.1", http_port)
        async with running_runtime(
            lambda s: inference_pb2_grpc.add_InferenceServicer_to_server(servicer, s),
            ["radixmesh.v1.Inference"],
        ) as gateway_runtime:
            address = GatewayAddress("127.0.0.1", gateway_runtime.port, http_port)
            envoy = start_envoy(tmp_path, address, keep_access_log=False, access_log=False)
            try:
                yield envoy.public_port
            finally:
                envoy.stop()
        await runner.cleanup()
        await upstream.close()
        await channel.close()


async def get_from(source: str, url: str, **headers: str) -> tuple[int, str]:
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(url, headers=headers) as response,
    ):
        return response.status, await response.text()


async def test_each_client_address_gets_its_own_bucket_through_envoy(edge):
    base = f"http://127.0.0.1:{edge}"
    # OpenAI HTTP route: one bucket per client, and a client-written x-forwarded-for
    # entry does not buy a fresh one.
    assert (await get_from("127.0.0.2", f"{base}/v1/models"))[0] == 200
    assert (await get_from("127.0.0.3", f"{base}/v1/models"))[0] == 200
    status, body = await get_from(
        "127.0.0.2", f"{base}/v1/models", **{"X-Forwarded-For": "9.9.9.9"}
    )
    assert status == 429 and GATEWAY_LIMIT in body
    # JSON transcoding (gRPC ListModels upstream) keys by the same forwarded address.
    assert (await get_from("127.0.0.4", f"{base}/v1/list_models"))[0] == 200
    status, body = await get_from("127.0.0.4", f"{base}/v1/list_models")
    assert status == 429 and GATEWAY_LIMIT in body
    # Native gRPC (the client comes from 127.0.0.1): Envoy's appended hop decides.
    async with grpc.aio.insecure_channel(f"127.0.0.1:{edge}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = inference_pb2.TokenizeRequest(prompt="hi")
        await stub.Tokenize(request, metadata=[("x-forwarded-for", "9.9.9.9")])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{edge}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Tokenize(request, metadata=[("x-forwarded-for", "9.9.9.8")])
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert GATEWAY_LIMIT in info.value.details()
