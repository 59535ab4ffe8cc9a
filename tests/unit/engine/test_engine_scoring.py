"""Scoring prompts and holding contexts through the in-process engine (real cores)."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
import transformers

from radixmesh.errors import InvalidArgument
from radixmesh.sampling import SamplingParams
from services.scheduler.core import SchedulerConfig
from tests.fixtures.tiny_llama import VOCAB

PAGE_SIZE = 4


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def score(start: int, max_tokens: int = 0, **fields) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens, temperature=0.0, prompt_logprobs_start=start, **fields
    )


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def hf(tiny_llama):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()


def reference(hf, prompt: list[int], start: int) -> list[float]:
    """log_softmax of a full forward: the log probability of each prompt token >= start."""
    with torch.no_grad():
        logprobs = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    return [logprobs[p - 1, prompt[p]].item() for p in range(start, len(prompt))]


def pool(engine):
    (stats,) = engine.cache_stats()
    return stats


# -- prompt log probabilities ----------------------------------------------------------


@pytest.mark.parametrize(("start", "num_cached"), [(1, 0), (6, 5), (13, 12), (20, 17)])
async def test_prompt_logprobs_equal_a_full_forward_partly_cached_or_not(
    make_engine, hf, start, num_cached
):
    """A 24-token prompt whose first 17 tokens are cached: the cache serves at most
    start - 1 tokens (whole pages in place, the tokens after them copied from the page
    that holds them: the 5th of the first edge's second page, the 17th of the partial
    page), and every scored position equals transformers'."""
    engine = await make_engine()
    prompt = tokens(24, seed=start)
    await engine.complete(prompt[:17], greedy(1))  # caches 16 tokens (4 pages)
    result = await engine.complete(prompt, score(start, max_tokens=2))
    assert result.num_cached_tokens == num_cached
    assert [e.token_id for e in result.prompt_logprobs] == prompt[start:]
    got = [e.logprob for e in result.prompt_logprobs]
    assert got == pytest.approx(reference(hf, prompt, start), abs=2e-4)
    assert len(result.token_ids) == 2  # scoring does not change generation


async def test_prompt_logprobs_across_prefill_chunks_and_top_alternatives(make_engine, hf):
    engine = await make_engine(SchedulerConfig(max_num_batched_tokens=8))
    prompt = tokens(30, seed=5)
    result = await engine.complete(prompt, score(3, top_logprobs=2))
    assert [e.token_id for e in result.prompt_logprobs] == prompt[3:]
    got = [e.logprob for e in result.prompt_logprobs]
    assert got == pytest.approx(reference(hf, prompt, 3), abs=2e-4)
    assert all(len(e.top) == 2 and e.top[0][1] >= e.logprob - 1e-5 for e in result.prompt_logprobs)


async def test_max_tokens_0_scores_without_sampling(make_engine):
    engine = await make_engine()
    result = await engine.complete(tokens(9, seed=1), score(4))
    assert result.token_ids == [] and result.finish_reason == "length"
    assert len(result.prompt_logprobs) == 5
    assert pool(engine).num_leased_pages == 0  # the lease ended (committed)


async def test_bad_scoring_requests_name_the_field(make_engine):
    engine = await make_engine()
    with pytest.raises(InvalidArgument, match="prompt_logprobs_start"):
        await engine.complete(tokens(4, seed=2), score(5))
    with pytest.raises(InvalidArgument, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(InvalidArgument, match="prompt_logprobs_start"):
        SamplingParams(prompt_logprobs_start=0)


async def test_scoring_choices_over_one_held_context_runs_in_one_step(make_engine, hf):
    """A select: N choices over a cached context, submitted together, score in one step."""
    engine = await make_engine()
    context = tokens(18, seed=3)
    await engine.complete(context, greedy(1), hold_id="ctx")
    core = engine.executors[0]
    prepare, plans = core.prepare, []
    core.prepare = lambda plan: plans.append(plan) or prepare(plan)
    choices = [tokens(n, seed=20 + n) for n in (1, 2, 4, 7)]
    streams = await asyncio.gather(
        *(engine.generate(context + c, score(len(context))) for c in choices)
    )
    results = [await s.collect() for s in streams]
    scheduled = [p for p in plans if p.new_seqs or p.running_seqs]
    assert len(scheduled) == 1 and len(scheduled[0].new_seqs) == len(choices)
    for choice, result in zip(choices, results, strict=True):
        # the held context below 17: its 4 pages in place, the 17th token copied
        assert result.num_cached_tokens == 17
        expected = reference(hf, context + choice, len(context))
        assert [e.logprob for e in result.prompt_logprobs] == pytest.approx(expected, abs=2e-4)


# -- holds -------------------------------------------------------------------------------


async def test_a_held_context_is_a_cache_hit_and_release_returns_its_pages(make_engine):
    engine = await make_engine()
    context = tokens(21, seed=4)
    first = await engine.complete(context, greedy(4), hold_id="h")
    held = context + first.token_ids  # 25 tokens, 24 computed: 6 full pages
    stats = pool(engine)
    assert (stats.num_leases, stats.num_locked_pages, stats.num_leased_pages) == (1, 6, 0)
    (load,) = engine.scheduler.executor_loads()
    assert load.kv_usage == pytest.approx(6 / stats.num_pages)  # held pages count as used
    follow = await engine.complete(held + tokens(3, seed=5), greedy(2))
    assert follow.num_cached_tokens == 24
    assert pool(engine).num_locked_pages == 6  # the hold outlives the request using it
    assert await engine.release_hold("h")
    stats = pool(engine)
    assert (stats.num_leases, stats.num_locked_pages, stats.num_leased_pages) == (0, 0, 0)
    assert not await engine.release_hold("h")


async def test_a_replaced_hold_frees_the_old_lock(make_engine):
    engine = await make_engine()
    await engine.complete(tokens(12, seed=6), greedy(1), hold_id="h")  # 3 pages
    assert pool(engine).num_locked_pages == 3
    await engine.complete(tokens(20, seed=7), greedy(1), hold_id="h")  # 5 pages
    stats = pool(engine)
    assert (stats.num_leases, stats.num_locked_pages) == (1, 5)
    await engine.release_hold("h")
    assert pool(engine).num_locked_pages == 0


async def test_a_request_whose_hold_is_released_while_it_runs_holds_nothing(make_engine):
    engine = await make_engine()
    stream = await engine.generate(tokens(10, seed=8), greedy(30), hold_id="h")
    assert not await engine.release_hold("h")  # no hold yet; the running request lets it go
    await stream.collect()
    stats = pool(engine)
    assert (stats.num_leases, stats.num_locked_pages) == (0, 0)


async def test_held_pages_survive_page_pressure_that_evicts_and_preempts_others(make_engine):
    """A 24-page pool: a 10-page hold stays whole while requests that need the rest of
    the pool (and more) evict every other cached prefix and preempt each other."""
    engine = await make_engine(
        SchedulerConfig(page_lookahead=0), num_pages=24, max_num_seqs=8
    )
    context = tokens(41, seed=9)
    await engine.complete(context, greedy(1), hold_id="ctx")  # 41 computed: 10 pages
    assert pool(engine).num_locked_pages == 11  # and the 41st token's partial page
    await engine.complete(tokens(30, seed=10), greedy(1))  # cached, evictable
    before = engine.scheduler.num_preemptions
    others = [tokens(20, seed=11 + i) for i in range(4)]
    results = await asyncio.gather(*(engine.complete(p, greedy(16)) for p in others))
    assert all(len(r.token_ids) == 16 for r in results)
    stats = pool(engine)
    assert stats.num_evicted_pages > 0 and engine.scheduler.num_preemptions > before
    assert stats.num_locked_pages == 11
    again = await engine.complete([*context, 5], greedy(1))
    assert again.num_cached_tokens == 41  # the held context was never evicted (40 + 1 copied)
    await engine.release_hold("ctx")
    stats = pool(engine)
    assert (stats.num_leases, stats.num_locked_pages, stats.num_leased_pages) == (0, 0, 0)


async def test_an_aborted_request_makes_no_hold(make_engine):
    engine = await make_engine()
    stream = await engine.generate(tokens(8, seed=12), greedy(200), hold_id="h")
    async for update in stream:
        if update.token_ids:
            stream.abort()
    assert pool(engine).num_leases == 0
