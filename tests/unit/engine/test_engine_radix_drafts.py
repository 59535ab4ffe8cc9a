"""`--speculative radix` through the in-process engine: outputs equal speculation off, and a
request repeating an earlier one's prompt drafts the earlier output from the cache's tree."""

from __future__ import annotations

import asyncio
import random

from radixmesh.sampling import SamplingParams
from services.executor.core.spec import SpeculativeConfig
from services.executor.core.spec.radix import RadixProposer
from tests.fixtures.tiny_llama import VOCAB


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def work(n: int, seed: int = 3) -> list[tuple[list[int], SamplingParams]]:
    """Random prompts, some sent twice (the second time after the first finished)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randint(6, 18))]
        sampling = (
            greedy(rng.randint(10, 30))
            if i % 3
            else SamplingParams(temperature=0.8, seed=i, max_tokens=20, ignore_eos=True)
        )
        out.append((prompt, sampling))
    return out


async def run_rounds(engine, rounds):
    """Each round's requests together, the rounds one after another: token ids per round."""
    outputs = []
    for requests in rounds:
        streams = [await engine.generate(p, s) for p, s in requests]
        outputs.append([r.token_ids for r in await asyncio.gather(*(s.collect() for s in streams))])
    return outputs


async def test_radix_outputs_equal_speculation_off_and_pages_come_back(make_engine):
    first = work(9)
    rounds = [first, first[::2]]  # the second round repeats prompts the tree now holds
    off = await make_engine()
    expected = await run_rounds(off, rounds)
    await off.stop()
    engine = await make_engine(speculative=SpeculativeConfig(method="radix"))
    (start,) = engine.cache_stats()
    assert await run_rounds(engine, rounds) == expected
    (prefetch,) = engine.prefetches
    assert prefetch.num_lookups == len(first) + len(first[::2]) and prefetch.num_failed == 0
    assert prefetch.num_found >= len(first[::2])
    (end,) = engine.cache_stats()
    assert end.num_leases == 0
    assert end.num_free_pages + end.num_cached_pages == start.num_free_pages


async def test_a_repeated_prompt_drafts_the_earlier_output_from_the_tree(make_engine):
    prompt = [17, 93, 41, 8, 77, 120, 5, 64, 33, 250, 12]
    engine = await make_engine(speculative=SpeculativeConfig(method="radix"))
    earlier = await engine.complete(prompt, greedy(40))
    proposer = engine.executors[0].proposer
    assert isinstance(proposer, RadixProposer)
    proposer.recent = type(proposer.recent)(2, 5, 1 << 18)  # only the tree can know it now
    before = proposer.num_tree_drafts
    again = await engine.complete(prompt, greedy(40))
    assert again.token_ids == earlier.token_ids
    assert proposer.num_tree_drafts > before
    usage = again.speculation
    assert usage is not None and usage.num_accepted_tokens > 0
    # 3 tokens a step where prompt lookup alone manages about 1.4 on this model
    assert usage.mean_acceptance_length > 3
