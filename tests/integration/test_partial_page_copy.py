"""A context that ends mid-page, continued through the scheduler service (cache and
executor processes): the cache grants the copy of its partial page with the lease (the
cache's Batch stream), the plan carries it to the executor (the step stream), and the
continuation computes only its own tokens, with the tokens of a full recompute."""

from __future__ import annotations

from radixmesh.sampling import SamplingParams
from services.scheduler.client import SchedulerClient
from tests.integration.test_scheduler_holds import pool_stats, tokens
from tests.integration.test_scheduler_service import _greedy, mesh  # noqa: F401

GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


async def run(client: SchedulerClient, req_id: str, prompt: list[int]):
    return [u async for u in client.generate(req_id, prompt, GREEDY)]


async def test_a_continuation_of_a_context_ending_mid_page_computes_only_its_tokens(
    mesh,  # noqa: F811
):
    address, cache_address, model, _ = mesh
    context = tokens(29, seed=31)  # 29 + 3 outputs: 31 computed, 7 pages and 3 tokens
    async with SchedulerClient(address) as client:
        first = await run(client, "ctx", context)
        assert first[0].num_cached_tokens == 0
        said = [t for u in first for t in u.token_ids]
        before = await pool_stats(cache_address)
        prompt = context + said + tokens(6, seed=32)
        second = await run(client, "next", prompt)
    assert second[0].num_prompt_tokens == len(prompt) == 38
    assert second[0].num_cached_tokens == 31  # 28 in place, 3 copied: 7 tokens computed
    assert [t for u in second for t in u.token_ids] == _greedy(model, prompt, 3)
    after = await pool_stats(cache_address)
    # two lookups: the submit's Match and the Acquire, which agree (31, with the copy)
    assert after.num_prefix_queries - before.num_prefix_queries == 2
    assert after.num_prefix_hit_tokens - before.num_prefix_hit_tokens == 31 + 31
