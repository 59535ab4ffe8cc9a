"""Speculative decoding through the in-process engine (scheduler, cache and executor
cores): outputs equal speculation off, the scheduler's positions follow the verified runs,
and every page comes back."""

from __future__ import annotations

import asyncio
import importlib
import random

import pytest

from radixmesh.sampling import SamplingParams
from services.executor.core.spec import SpeculativeConfig
from services.scheduler.core import SchedulerConfig
from tests.fixtures.tiny_llama import VOCAB


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def cases(n: int, seed: int = 0) -> list[tuple[list[int], SamplingParams]]:
    """Prompts that repeat a motif (drafts get accepted) and random ones, greedy and seeded."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 2:
            prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randint(4, 20))]
        else:
            motif = [rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 8))]
            prompt = motif * rng.randint(2, 4)
        sampling = (
            greedy(rng.randint(8, 30))
            if i % 3
            else SamplingParams(temperature=0.8, seed=i, max_tokens=20, ignore_eos=True)
        )
        out.append((prompt, sampling))
    return out


async def run_all(engine, work):
    streams = [await engine.generate(p, s) for p, s in work]
    return await asyncio.gather(*(s.collect() for s in streams))


async def test_outputs_equal_speculation_off_and_every_page_comes_back(make_engine):
    work = cases(16)
    off = await make_engine()
    expected = [r.token_ids for r in await run_all(off, work)]
    await off.stop()
    for method in ("ngram", "suffix"):
        engine = await make_engine(speculative=SpeculativeConfig(method=method))
        (start,) = engine.cache_stats()
        results = await run_all(engine, work)
        assert [r.token_ids for r in results] == expected, method
        assert [len(r.token_ids) for r in results] == [s.max_tokens for _, s in work]
        usage = [r.speculation for r in results if r.speculation is not None]
        assert usage and sum(u.num_accepted_tokens for u in usage) > 0
        total = engine.executors[0].spec_stats.snapshot()
        assert sum(u.num_draft_tokens for u in usage) == total.num_draft_tokens
        (end,) = engine.cache_stats()
        assert end.num_leases == 0
        assert end.num_free_pages + end.num_cached_pages == start.num_free_pages
        await engine.stop()


@pytest.mark.parametrize("serial_prepare", ["step", "prepare"])
async def test_with_prepares_overlapped_as_on_a_gpu_outputs_equal_speculation_off(
    make_engine, monkeypatch, serial_prepare
):
    # a GPU core's pipeline: prepares on their own thread, a step that verifies drafts (or
    # follows one) prepared by the step thread (default) or the prepare thread
    monkeypatch.setenv("RADIXMESH_SERIAL_PREPARE", serial_prepare)
    work = cases(12, seed=3)
    off = await make_engine(overlap_prepare=True)
    expected = [r.token_ids for r in await run_all(off, work)]
    await off.stop()
    engine = await make_engine(overlap_prepare=True, speculative=SpeculativeConfig(method="ngram"))
    assert engine.ports[0].pipeline.serial_on_step_thread is (serial_prepare == "step")
    (start,) = engine.cache_stats()
    results = await run_all(engine, work)
    assert [r.token_ids for r in results] == expected
    assert engine.executors[0].spec_stats.snapshot().num_accepted_tokens > 0
    assert engine.ports[0].pipeline_counts.serial_steps > 0  # steps that waited on a draft
    (end,) = engine.cache_stats()
    assert end.num_leases == 0
    assert end.num_free_pages + end.num_cached_pages == start.num_free_pages
    await engine.stop()


async def test_preempted_requests_resume_with_the_same_tokens(make_engine):
    work = [([5 + i, 6 + i, 7 + i] * 3 + [40 + i], greedy(24)) for i in range(6)]
    off = await make_engine()
    expected = [r.token_ids for r in await run_all(off, work)]
    await off.stop()
    # 24 pages of 4 tokens: six requests growing to 34 tokens cannot all stay resident
    engine = await make_engine(
        SchedulerConfig(max_num_batched_tokens=64, page_lookahead=1),
        num_pages=24,
        speculative=SpeculativeConfig(method="ngram"),
    )
    results = await run_all(engine, work)
    assert engine.scheduler.num_preemptions > 0
    assert [r.token_ids for r in results] == expected
    assert engine.executors[0].spec_stats.snapshot().num_accepted_tokens > 0
    await engine.stop()


async def test_a_batch_above_the_threshold_plans_no_drafts(make_engine):
    engine = await make_engine(speculative=SpeculativeConfig(method="ngram", max_batch_size=2))
    results = await run_all(engine, [([7, 8, 9] * 4, greedy(12))] * 6)
    assert len({tuple(r.token_ids) for r in results}) == 1
    # six requests admitted together decode together to the end: never two or fewer
    assert engine.executors[0].spec_stats.snapshot().num_drafts == 0
    assert all(r.speculation is None for r in results)
    small = await run_all(engine, [([7, 8, 9] * 4, greedy(12))] * 2)
    assert small[0].token_ids == results[0].token_ids
    assert engine.executors[0].spec_stats.snapshot().num_drafts > 0  # two: on again
    await engine.stop()


async def test_a_copying_request_with_edits_drafts_again_soon_after_each_edit(make_engine):
    """At batch 1 on a GPU-like switch (verification at 2 decode steps), a request that
    copies its prompt but for 2 tokens of each 29 (bench/spec_host.py's stand-in) drafts
    again within a few steps of each edit: its declined steps keep asking for its guesses
    while they are found, and score them, so its rates recover: 22-25 steps for 64 tokens
    after the first request. Asked once in 16 declined steps, as every older sequence once
    was, the same requests took 25-44 (31-34 on average)."""
    spec_host = importlib.import_module("bench.spec_host")
    period, edited, num_out = 29, (7, 21), 64
    text = spec_host.copy_text(VOCAB, period)
    prompt = [text[p % period] for p in range(4 * period)]
    engine = await make_engine(
        overlap_prepare=True, speculative=SpeculativeConfig(method="ngram", max_draft_tokens=4)
    )
    core = engine.executors[0]
    core.model.forward = spec_host.copying_forward(VOCAB, edited, period)
    core.spec_switch = spec_host.FixedRatioSwitch(1, {1: 2.0}, max_gain=5)
    steps = []
    for _ in range(5):  # the executor's rates carry over from one request to the next
        before = core.spec_stats.snapshot().num_accepted_tokens
        (result,) = await run_all(engine, [(prompt, greedy(num_out))])
        assert result.token_ids == [
            spec_host.EDITED_TOKEN if p % period in edited else text[p % period]
            for p in range(len(prompt), len(prompt) + num_out)
        ]
        steps.append(num_out - (core.spec_stats.snapshot().num_accepted_tokens - before))
    assert sum(steps[1:]) / len(steps[1:]) <= 28, steps
