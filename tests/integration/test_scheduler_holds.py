"""Scoring and context holds through the scheduler service (cache and executor processes).

Prompt log probabilities cross the executor's step stream and the scheduler's
stream; holds cross the cache's Batch stream (Commit with keep_locked); a
ReleaseHold or a closed stream gives the pages back.
"""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
import torch

from radixmesh.sampling import SamplingParams
from radixmesh.v1 import cache_pb2, cache_pb2_grpc
from services.scheduler.client import SchedulerClient
from tests.fixtures.tiny_llama import VOCAB
from tests.integration.test_scheduler_service import EXECUTOR_ID, mesh  # noqa: F401

GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


async def pool_stats(cache_address: str) -> cache_pb2.PoolStats:
    async with grpc.aio.insecure_channel(cache_address) as channel:
        response = await cache_pb2_grpc.CacheStub(channel).GetStats(
            cache_pb2.GetStatsRequest(executor_id=EXECUTOR_ID)
        )
    return response.pools[0]


async def run(client: SchedulerClient, req_id: str, prompt: list[int], sampling, **kw):
    return [u async for u in client.generate(req_id, prompt, sampling, **kw)]


async def test_scores_over_a_held_context_then_release_returns_the_pages(mesh):  # noqa: F811
    address, cache_address, model, _ = mesh
    context = tokens(22, seed=1)
    async with SchedulerClient(address) as client:
        held = await run(client, "ctx", context, GREEDY, hold_id="program-1")
        assert held[-1].finish_reason == "length"
        stats = await pool_stats(cache_address)
        assert (stats.num_leases, stats.num_locked_pages) == (1, 6)  # 24 computed tokens
        choice = tokens(5, seed=2)
        scoring = SamplingParams(max_tokens=0, temperature=0.0, prompt_logprobs_start=22)
        (update,) = await run(client, "select", context + choice, scoring)
        assert update.finish_reason == "length" and update.token_ids == []
        assert update.num_cached_tokens == 20  # the hold, capped below position 21
        with torch.no_grad():
            logits = model(torch.tensor([context + choice])).logits[0].float()
        expected = torch.log_softmax(logits, -1)[21:26].gather(1, torch.tensor([choice]).T)
        assert [e.token_id for e in update.prompt_logprobs] == choice
        got = [e.logprob for e in update.prompt_logprobs]
        assert got == pytest.approx(expected.squeeze(1).tolist(), abs=2e-4)
        await client.release_hold("program-1")
        await run(client, "after", tokens(6, seed=3), GREEDY)  # the stream keeps order
        stats = await pool_stats(cache_address)
        assert (stats.num_leases, stats.num_locked_pages) == (0, 0)


async def test_closing_the_stream_ends_its_holds(mesh):  # noqa: F811
    address, cache_address, _, _ = mesh
    async with SchedulerClient(address) as client:
        await run(client, "a", tokens(17, seed=4), GREEDY, hold_id="h")
        await run(client, "b", tokens(9, seed=5), GREEDY, hold_id="h2")
        stats = await pool_stats(cache_address)
        assert (stats.num_leases, stats.num_locked_pages) == (2, 6)  # 4 + 2 pages
    async with asyncio.timeout(20):  # the scheduler ends them once it sees the stream close
        while (await pool_stats(cache_address)).num_leases:
            await asyncio.sleep(0.05)
    assert (await pool_stats(cache_address)).num_locked_pages == 0
