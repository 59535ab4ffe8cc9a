"""GatewayMemory: result cache and sessions against a real cache service on loopback."""

from __future__ import annotations

import pytest

from gateway.core.generate import collect
from gateway.core.memory import GatewayMemory
from gateway.core.openai import parse_completion_request
from gateway.core.prepare import PreparedRequest, prepare_request
from radixmesh.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from radixmesh.result_key import result_key
from radixmesh.updates import RequestUpdate
from radixmesh.v1 import cache_pb2_grpc
from services.cache.client import CacheClient
from services.cache.core import CacheConfig, CacheCore
from services.cache.server import SERVICE_NAME, CacheServicer
from services.cache.store import InProcessStore, StoreConfig
from tests.fixtures.runtime import running_runtime

REPLY = "the quick brown fox"


class CountingUpstream:
    """Answers every submit with REPLY's tokens in one update (or `error`), counting submits."""

    def __init__(self, tokenizer, finish: str = "length", error=None) -> None:
        self.reply_ids = tokenizer._hf.encode(REPLY, add_special_tokens=False)
        self.finish = finish
        self.error = error
        self.submitted: list[PreparedRequest] = []

    async def generate(self, req_id, token_ids, sampling, **options):
        request = PreparedRequest(req_id, prompt_token_ids=tuple(token_ids), sampling=sampling, **options)
        self.submitted.append(request)
        if self.error is not None:
            yield RequestUpdate(req_id, error=self.error)
            return
        yield RequestUpdate(
            req_id,
            token_ids=list(self.reply_ids),
            finish_reason=self.finish,
            num_prompt_tokens=len(request.prompt_token_ids),
            num_cached_tokens=0,
        )

    async def abort(self, req_id):
        pass


@pytest.fixture
async def cache_client():
    servicer = CacheServicer(CacheCore(CacheConfig()), InProcessStore(StoreConfig()))

    def register(server):
        cache_pb2_grpc.add_CacheServicer_to_server(servicer, server)

    async with running_runtime(register, [SERVICE_NAME]) as runtime:
        client = CacheClient(runtime.address)
        yield client
        await client.close()


def _key(prepared: PreparedRequest) -> str:
    return result_key("tiny", prepared.prompt_token_ids, prepared.sampling, prepared.constraint)


async def _run(memory, tokenizer, upstream, session_id="", **fields):
    request = parse_completion_request({"prompt": "hello", "max_tokens": 20, **fields})
    history = await memory.history(session_id)
    prepared = prepare_request(request, tokenizer, "req", history=history)
    merged = await collect(memory.generate(prepared, tokenizer, upstream, session_id), 1)
    return prepared, merged[0]


async def test_a_repeated_greedy_request_is_answered_from_the_result_cache(tokenizer, cache_client):
    memory = GatewayMemory(cache_client, _key, cache_results=True)
    upstream = CountingUpstream(tokenizer)
    _, first = await _run(memory, tokenizer, upstream, temperature=0)
    _, again = await _run(memory, tokenizer, upstream, temperature=0)
    assert len(upstream.submitted) == 1
    assert again.delta.text == first.delta.text == REPLY
    assert again.delta.token_ids == first.delta.token_ids
    assert again.delta.finish_reason == "length"
    assert again.usage.cached_tokens == again.usage.prompt_tokens == first.usage.prompt_tokens
    assert first.usage.cached_tokens == 0


@pytest.mark.parametrize(
    ("fields", "cache_results"),
    [
        ({"temperature": 0.7}, True),  # sampled without a seed: not deterministic
        ({"temperature": 0, "logprobs": 2}, True),  # logprobs are not stored
        ({"temperature": 0}, False),  # the result cache is off
    ],
)
async def test_requests_that_must_run_again_do(tokenizer, cache_client, fields, cache_results):
    memory = GatewayMemory(cache_client, _key, cache_results=cache_results)
    upstream = CountingUpstream(tokenizer)
    for _ in range(2):
        await _run(memory, tokenizer, upstream, **fields)
    assert len(upstream.submitted) == 2


async def test_a_seeded_request_is_cached_per_seed(tokenizer, cache_client):
    memory = GatewayMemory(cache_client, _key, cache_results=True)
    upstream = CountingUpstream(tokenizer)
    for seed in (1, 1, 2):
        await _run(memory, tokenizer, upstream, temperature=0.7, seed=seed)
    assert [p.sampling.seed for p in upstream.submitted] == [1, 2]


async def test_a_session_appends_each_finished_turn(tokenizer, cache_client):
    memory = GatewayMemory(cache_client)
    upstream = CountingUpstream(tokenizer)
    first, first_out = await _run(memory, tokenizer, upstream, session_id="s1")
    stored = await cache_client.get_session("s1")
    assert stored == [*first.prompt_token_ids, *first_out.delta.token_ids]
    second, _ = await _run(memory, tokenizer, upstream, session_id="s1", prompt=" again")
    new_ids = tokenizer.encode_prompt(" again")
    assert list(second.prompt_token_ids) == [*stored, *new_ids]
    assert upstream.submitted[1].prompt_token_ids == second.prompt_token_ids
    assert await memory.history("s2") == ()


async def test_a_failed_turn_leaves_the_session_as_it_was(tokenizer, cache_client):
    memory = GatewayMemory(cache_client)
    await _run(memory, tokenizer, CountingUpstream(tokenizer), session_id="s1")
    before = await cache_client.get_session("s1")
    failing = CountingUpstream(tokenizer, error=ResourceExhausted("queue full"))
    with pytest.raises(ResourceExhausted):
        await _run(memory, tokenizer, failing, session_id="s1")
    aborted = CountingUpstream(tokenizer, finish="abort")
    await _run(memory, tokenizer, aborted, session_id="s1")
    assert await cache_client.get_session("s1") == before


async def test_sessions_need_a_store_and_one_choice(tokenizer, cache_client):
    with pytest.raises(FailedPrecondition, match="session_id"):
        await GatewayMemory().history("s1")
    with pytest.raises(InvalidArgument, match="n: must be 1"):
        await _run(GatewayMemory(cache_client), tokenizer, CountingUpstream(tokenizer), "s1", n=2)
    with pytest.raises(InvalidArgument, match="session_id"):
        await GatewayMemory(cache_client).history("bad\nid")
