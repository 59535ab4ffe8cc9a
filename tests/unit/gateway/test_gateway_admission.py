"""Admission at both front doors: ListModels behind the API key, keyless callers limited by
the address Envoy forwards, a Redis-backed limiter that loses Redis, and ListModels'
executor counts from the scheduler."""

from __future__ import annotations

import contextlib

import aiohttp
import grpc
import pytest

from gateway.core.auth import Admission, client_address, forwarded_client, peer_host
from gateway.core.models import ExecutorCounts, ModelRegistry
from gateway.core.ratelimit import LocalRateLimiter, RateLimitConfig
from gateway.main import _admission, build_parser
from gateway.openai_http import OpenAIHttpServer, start_http_server
from gateway.server import InferenceServicer
from radixmesh.v1 import inference_pb2, inference_pb2_grpc, scheduler_pb2
from services.common.config import free_port
from services.scheduler.client import SchedulerClient
from tests.fixtures.redis import redis_server_factory  # noqa: F401
from tests.fixtures.runtime import running_runtime

ONE_PER_CLIENT = RateLimitConfig(capacity=1, refill_per_s=0.001)
"""One request per bucket for the length of a test."""


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def gateway(tokenizer, scheduler_address, admission, counts_clock=None):
    """(Inference stub, HTTP base URL) of one gateway in this process."""
    channel = grpc.aio.insecure_channel(scheduler_address)
    upstream = SchedulerClient(channel)
    models = ModelRegistry({"tiny": tokenizer})
    counts = ExecutorCounts(upstream.executors_per_model, 1.0, counts_clock or ManualClock())
    servicer = InferenceServicer(models, upstream, admission, executor_counts=counts)
    http_port = free_port()
    runner = await start_http_server(
        OpenAIHttpServer(models, upstream, admission).build_app(), "127.0.0.1", http_port
    )

    def register(server):
        inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)

    try:
        async with running_runtime(register, ["radixmesh.v1.Inference"]) as runtime:
            client = grpc.aio.insecure_channel(runtime.address)
            try:
                yield inference_pb2_grpc.InferenceStub(client), f"http://127.0.0.1:{http_port}"
            finally:
                await client.close()
    finally:
        await runner.cleanup()
        await upstream.close()
        await channel.close()


async def grpc_code(call) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def http_get(url: str, **headers: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        return response.status, await response.json()


# --- the client address -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("forwarded", "peer", "expected"),
    [
        ("", "ipv4:127.0.0.1:51234", "127.0.0.1"),
        ("", "ipv6:[::1]:51234", "::1"),
        ("", "unix:/tmp/gateway.sock", "unix:/tmp/gateway.sock"),
        ("", "10.0.0.9", "10.0.0.9"),  # aiohttp's request.remote: a bare host
        ("203.0.113.7", "ipv4:127.0.0.1:51234", "203.0.113.7"),
        # A client-written entry first, then the one Envoy appended: only the last counts.
        ("198.51.100.1, 203.0.113.7", "ipv4:127.0.0.1:1", "203.0.113.7"),
        ("2001:db8::5", "ipv4:127.0.0.1:1", "2001:db8::5"),
    ],
)
def test_client_address_prefers_the_hop_envoy_appended(forwarded, peer, expected):
    assert client_address(forwarded, peer) == expected


def test_forwarded_client_and_peer_host_pieces():
    assert forwarded_client(" , ") == ""
    assert peer_host("ipv4:192.0.2.1:443") == "192.0.2.1"


# --- ListModels needs the API key ------------------------------------------------------------


async def test_list_models_requires_the_api_key(tokenizer, fake_scheduler):
    _, address = fake_scheduler
    async with gateway(tokenizer, address, Admission(frozenset({"sk-1"}))) as (stub, base):
        request = inference_pb2.ListModelsRequest()
        assert await grpc_code(stub.ListModels(request)) == grpc.StatusCode.UNAUTHENTICATED
        wrong = [("authorization", "Bearer sk-2")]
        assert (
            await grpc_code(stub.ListModels(request, metadata=wrong))
            == grpc.StatusCode.UNAUTHENTICATED
        )
        reply = await stub.ListModels(request, metadata=[("authorization", "Bearer sk-1")])
        assert [m.id for m in reply.models] == ["tiny"]
        status, body = await http_get(f"{base}/v1/models")
        assert status == 401 and body["error"]["code"] == "unauthenticated"


async def test_list_models_takes_a_rate_limit_token(tokenizer, fake_scheduler):
    _, address = fake_scheduler
    admission = Admission(limiter=LocalRateLimiter(ONE_PER_CLIENT))
    async with gateway(tokenizer, address, admission) as (stub, _):
        request = inference_pb2.ListModelsRequest()
        assert await grpc_code(stub.ListModels(request)) == grpc.StatusCode.OK
        assert await grpc_code(stub.ListModels(request)) == grpc.StatusCode.RESOURCE_EXHAUSTED


# --- keyless callers are limited by the forwarded client address ---------------------------


async def test_grpc_keyless_buckets_follow_x_forwarded_for(tokenizer, fake_scheduler):
    _, address = fake_scheduler
    admission = Admission(limiter=LocalRateLimiter(ONE_PER_CLIENT))
    async with gateway(tokenizer, address, admission) as (stub, _):
        request = inference_pb2.TokenizeRequest(prompt="hi")

        def tokenize(forwarded: str):
            return grpc_code(stub.Tokenize(request, metadata=[("x-forwarded-for", forwarded)]))

        # One connection (as Envoy keeps), two clients: a bucket each.
        assert await tokenize("198.51.100.1") == grpc.StatusCode.OK
        assert await tokenize("198.51.100.2") == grpc.StatusCode.OK
        # A spoofed first entry does not give a client a new bucket.
        assert await tokenize("192.0.2.50, 198.51.100.1") == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_grpc_keyless_without_envoy_is_one_bucket_per_host_not_per_connection(
    tokenizer, fake_scheduler
):
    _, address = fake_scheduler
    admission = Admission(limiter=LocalRateLimiter(ONE_PER_CLIENT))
    async with gateway(tokenizer, address, admission) as (stub, _):
        request = inference_pb2.TokenizeRequest(prompt="hi")
        assert await grpc_code(stub.Tokenize(request)) == grpc.StatusCode.OK
    # A new connection from the same host shares the bucket (a fresh server and channel,
    # the same limiter).
    async with gateway(tokenizer, address, admission) as (other_stub, _):
        code = await grpc_code(other_stub.Tokenize(request))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_http_keyless_buckets_follow_x_forwarded_for(tokenizer, fake_scheduler):
    _, address = fake_scheduler
    admission = Admission(limiter=LocalRateLimiter(ONE_PER_CLIENT))
    async with gateway(tokenizer, address, admission) as (_, base):
        url = f"{base}/v1/models"
        assert (await http_get(url, **{"X-Forwarded-For": "198.51.100.1"}))[0] == 200
        assert (await http_get(url, **{"X-Forwarded-For": "198.51.100.2"}))[0] == 200
        status, body = await http_get(url, **{"X-Forwarded-For": "10.1.1.1, 198.51.100.2"})
        assert status == 429 and "rate limit" in body["error"]["message"]
        assert (await http_get(url))[0] == 200  # no header: the peer (127.0.0.1) has its own
        assert (await http_get(url))[0] == 429


# --- Redis-backed buckets when Redis dies --------------------------------------------------


async def test_redis_down_answers_unavailable_and_503_not_internal(
    tokenizer,
    fake_scheduler,
    redis_server_factory,  # noqa: F811
):
    _, address = fake_scheduler
    redis = redis_server_factory()
    args = build_parser().parse_args(
        [
            *("--model=unused", "--scheduler-address=unused", "--api-key=sk-1"),
            *(f"--redis-url={redis.url}", "--rate-limit-per-s=100"),
        ]
    )
    admission, client = _admission(args)
    auth = [("authorization", "Bearer sk-1")]
    try:
        async with gateway(tokenizer, address, admission) as (stub, base):
            request = inference_pb2.TokenizeRequest(prompt="hi")
            assert await grpc_code(stub.Tokenize(request, metadata=auth)) == grpc.StatusCode.OK
            assert (await http_get(f"{base}/v1/models", Authorization="Bearer sk-1"))[0] == 200
            redis.kill()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Tokenize(request, metadata=auth)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "rate limiter: Redis is unreachable" in info.value.details()
            status, body = await http_get(f"{base}/v1/models", Authorization="Bearer sk-1")
            assert status == 503
            assert body["error"]["code"] == "unavailable"
            assert "Redis is unreachable" in body["error"]["message"]
    finally:
        await client.aclose()


# --- ListModels' num_executors ---------------------------------------------------------------


def executor(executor_id: str, model: str = "tiny", healthy: bool = True):
    return scheduler_pb2.ExecutorLoad(executor_id=executor_id, model=model, healthy=healthy)


async def test_list_models_counts_healthy_executors_cached_for_a_second(tokenizer, fake_scheduler):
    scheduler, address = fake_scheduler
    clock = ManualClock()
    async with gateway(tokenizer, address, Admission(), counts_clock=clock) as (stub, _):

        async def num_executors() -> int:
            reply = await stub.ListModels(inference_pb2.ListModelsRequest())
            return reply.models[0].num_executors

        assert await num_executors() == 1
        scheduler.executors = [
            executor("e0"),
            executor("e1"),
            executor("e2", healthy=False),
            executor("e3", model="other"),
        ]
        clock.now += 0.5
        assert await num_executors() == 1  # still the cached answer
        assert scheduler.num_get_load == 1
        clock.now += 0.5
        assert await num_executors() == 2
        assert scheduler.num_get_load == 2


async def test_executor_counts_read_zero_when_the_scheduler_fails():
    calls = []

    async def fetch():
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("scheduler down")
        return {"tiny": 3}

    clock = ManualClock()
    counts = ExecutorCounts(fetch, ttl_s=1.0, clock=clock)
    assert await counts.get() == {}
    clock.now += 1.0
    assert await counts.get() == {"tiny": 3}
