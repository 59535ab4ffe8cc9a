"""`radixmesh serve --redis-url ... --result-cache`: results, sessions and rate-limit buckets
live in a real redis-server, where every gateway replica would share them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid

import grpc
import openai
import pytest
import redis
from e2e_mesh import start_serve, stop_serve

from radixmesh.v1 import inference_pb2 as pb
from radixmesh.v1 import inference_pb2_grpc
from tests.fixtures.redis import redis_server  # noqa: F401

KEY = "sk-redis"
LIMITED_KEY = "sk-redis-limited"
"""Used only by the rate-limit test, so draining its bucket leaves KEY's alone."""
BURST = 10


@pytest.fixture(scope="module")
def redis_serve(redis_server, tmp_path_factory):  # noqa: F811
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    mesh = start_serve(
        tmp_path_factory.mktemp("serve-redis"),
        *("--redis-url", redis_server.url, "--result-cache"),
        *("--api-key", KEY, "--api-key", LIMITED_KEY),
        *("--rate-limit-per-s", "0.5", "--rate-limit-burst", str(BURST)),
    )
    yield mesh, client
    stop_serve(mesh)
    client.close()


def _complete(mesh, **fields):
    client = openai.OpenAI(base_url=f"{mesh.http}/v1", api_key=KEY, max_retries=0)
    return client.completions.create(**{"model": "", "max_tokens": 6, "temperature": 0, **fields})


def test_a_repeated_greedy_request_comes_from_the_result_cache_in_redis(redis_serve):
    mesh, client = redis_serve
    prompt = f"A story about {uuid.uuid4().hex[:6]}"
    first = _complete(mesh, prompt=prompt)
    again = _complete(mesh, prompt=prompt)
    assert again.choices[0].text == first.choices[0].text
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens
    assert client.keys("radixmesh:result:*")
    sampled = _complete(mesh, prompt=prompt, temperature=0.8)  # not deterministic: runs
    assert sampled.usage.prompt_tokens_details.cached_tokens < sampled.usage.prompt_tokens


async def test_a_session_lives_in_redis(redis_serve):
    mesh, client = redis_serve
    session_id = f"e2e-{uuid.uuid4().hex}"
    auth = (("authorization", f"Bearer {KEY}"),)
    sampling = pb.SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    async with grpc.aio.insecure_channel(mesh.grpc_target) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = pb.GenerateRequest(prompt="Hello there", sampling=sampling, session_id=session_id)
        first = [r async for r in stub.Generate(request, metadata=auth)]
    stored = client.get(f"radixmesh:session:{session_id}")
    assert stored is not None
    num_prompt = first[-1].complete.usage.prompt_tokens
    assert len(stored) // 4 == num_prompt + first[-1].complete.usage.completion_tokens


async def test_rate_limit_answers_429_then_resource_exhausted_from_redis(redis_serve):
    """The limited key's bucket holds BURST requests; the next ones are refused, on HTTP and
    on gRPC alike, and the bucket is in Redis."""
    mesh, client = redis_serve
    statuses, message = [], ""
    for _ in range(BURST + 10):
        request = urllib.request.Request(
            f"{mesh.http}/v1/models", headers={"Authorization": f"Bearer {LIMITED_KEY}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                statuses.append(response.status)
        except urllib.error.HTTPError as exc:
            statuses.append(exc.code)
            message = json.loads(exc.read())["error"]["message"]
            break
    assert statuses[-1] == 429, statuses
    assert BURST <= statuses.count(200) <= BURST + 2, statuses  # refill: 1 token per 2 s
    assert "rate limit" in message
    assert client.keys("radixmesh:ratelimit:*")
    codes, details = [], ""
    async with grpc.aio.insecure_channel(mesh.grpc_target) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for _ in range(3):  # a token may have refilled meanwhile
            try:
                await stub.Tokenize(
                    pb.TokenizeRequest(prompt="hi"),
                    metadata=[("authorization", f"Bearer {LIMITED_KEY}")],
                )
                codes.append(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as exc:
                codes.append(exc.code())
                details = exc.details()
                break
    assert codes[-1] == grpc.StatusCode.RESOURCE_EXHAUSTED, codes
    assert "rate limit" in details
