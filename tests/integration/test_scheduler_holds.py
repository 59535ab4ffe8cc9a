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
from radixmesh.v1 import cache_pb2, cache_pb2_grpc, scheduler_pb2
from radixmesh.v1 import inference_pb2 as ipb
from services.scheduler.client import SchedulerClient, _Outbox
from tests.fixtures.tiny_llama import VOCAB
from tests.integration.test_scheduler_service import EXECUTOR_ID, Client, mesh  # noqa: F401

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
        # the hold, capped below position 21: 20 in place, the 21st copied from its page
        assert update.num_cached_tokens == 21
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


async def test_holds_released_together_go_in_one_message_and_all_end(mesh, monkeypatch):  # noqa: F811
    address, cache_address, _, _ = mesh
    sent: list[scheduler_pb2.StreamRequest] = []
    messages = _Outbox.messages  # record what goes on the wire

    async def recorded(outbox):
        async for message in messages(outbox):
            sent.append(message)
            yield message

    monkeypatch.setattr(_Outbox, "messages", recorded)
    async with SchedulerClient(address) as client:
        for i in range(3):
            await run(client, f"branch{i}", tokens(9 + 4 * i, seed=20 + i), GREEDY, hold_id=f"b{i}")
        assert (await pool_stats(cache_address)).num_leases == 3
        for i in range(3):  # a join ends its branches' holds in one turn
            await client.release_hold(f"b{i}")
        await run(client, "after", tokens(6, seed=30), GREEDY)  # the stream keeps order
        stats = await pool_stats(cache_address)
        assert (stats.num_leases, stats.num_locked_pages) == (0, 0)
    releases = [m for m in sent if m.WhichOneof("op") in ("release_hold", "release_holds")]
    assert [list(m.release_holds.hold_ids) for m in releases] == [["b0", "b1", "b2"]]


async def test_closing_the_stream_ends_its_holds(mesh):  # noqa: F811
    address, cache_address, _, _ = mesh
    async with SchedulerClient(address) as client:
        await run(client, "a", tokens(17, seed=4), GREEDY, hold_id="h")
        await run(client, "b", tokens(9, seed=5), GREEDY, hold_id="h2")
        stats = await pool_stats(cache_address)
        # 4 + 2 full pages, and each context's partial last page (19 and 11 computed)
        assert (stats.num_leases, stats.num_locked_pages) == (2, 8)
    async with asyncio.timeout(20):  # the scheduler ends them once it sees the stream close
        while (await pool_stats(cache_address)).num_leases:
            await asyncio.sleep(0.05)
    assert (await pool_stats(cache_address)).num_locked_pages == 0


async def test_scoring_requests_sent_together_finish_in_one_step(mesh):  # noqa: F811
    """A select's choices over a held context, sent back to back on one stream as the
    program runtime sends them (one group that says its size): the scheduler queues them
    concurrently and runs them in one step, every time, however loaded the machine."""
    address, cache_address, _, _ = mesh
    context = tokens(30, seed=6)
    async with grpc.aio.insecure_channel(address) as channel:
        client = Client(channel)
        client.submit("ctx", context, 1, hold_id="select")
        await client.until_finished("ctx")
        for trial in range(3):
            req_ids = [f"choice-{trial}-{i}" for i in range(4)]
            for i, req_id in enumerate(req_ids):
                sampling = ipb.SamplingParams(max_tokens=0, prompt_logprobs_start=30)
                submit = scheduler_pb2.SubmitRequest(
                    req_id=req_id,
                    token_ids=context + tokens(3 + i, seed=10 + i),
                    sampling=sampling,
                    group_id=f"select-{trial}",
                    group_size=len(req_ids),
                )
                client.outbox.put_nowait(scheduler_pb2.StreamRequest(submit=submit))
            seen = len(client.responses)
            updates = await client.until_finished(*req_ids)
            assert all(u[-1].finish_reason == "length" for u in updates.values())
            steps = {
                r.step_id for r in client.responses[seen:] for u in r.updates if u.finish_reason
            }
            assert len(steps) == 1, steps
        client.outbox.put_nowait(None)
    async with asyncio.timeout(20):  # the closed stream's hold ends
        while (await pool_stats(cache_address)).num_leases:
            await asyncio.sleep(0.05)
