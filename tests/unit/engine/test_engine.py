"""The in-process engine with the real cache and executor cores on a tiny model."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest
import torch

from radixmesh.errors import (
    DeadlineExceeded,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from radixmesh.sampling import Priority, SamplingParams
from services.scheduler.core import SchedulerConfig
from tests.fixtures.tiny_llama import VOCAB


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def mixed_prompts(n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens) pairs of mixed lengths; some share a prefix."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, VOCAB) for _ in range(12)]
    out = []
    for i in range(n):
        own = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 30))]
        out.append(((shared + own) if i % 3 == 0 else own, rng.randint(1, 8)))
    return out


async def alone(make_engine, cases) -> list[list[int]]:
    """Each request on its own, one after the other, in a fresh engine."""
    engine = await make_engine()
    results = [(await engine.complete(p, greedy(n))).token_ids for p, n in cases]
    await engine.stop()
    return results


async def test_concurrent_greedy_requests_give_the_tokens_each_gives_alone(make_engine, tiny_llama):
    cases = mixed_prompts(64)
    expected = await alone(make_engine, cases)
    engine = await make_engine(SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=64))
    streams = [await engine.generate(p, greedy(n)) for p, n in cases]
    results = await asyncio.gather(*(s.collect() for s in streams))
    assert [r.token_ids for r in results] == expected
    assert [len(r.token_ids) for r in results] == [n for _, n in cases]
    # and alone equals Hugging Face greedy decoding, for a few of them
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    for (prompt, n), tokens in list(zip(cases, expected, strict=True))[:4]:
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(n):  # argmax with EOS kept, as ignore_eos asks
                ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
        assert ids[len(prompt) :] == tokens
    await engine.stop()


async def test_chunked_prefill_gives_the_same_tokens_as_one_chunk(make_engine):
    prompt = [random.Random(1).randrange(3, VOCAB) for _ in range(70)]
    whole = await make_engine(SchedulerConfig(max_num_batched_tokens=128))
    expected = (await whole.complete(prompt, greedy(6))).token_ids
    await whole.stop()
    chunked = await make_engine(SchedulerConfig(max_num_batched_tokens=16))
    assert (await chunked.complete(prompt, greedy(6))).token_ids == expected
    await chunked.stop()


async def test_preempted_requests_resume_with_the_same_tokens(make_engine):
    cases = [([5 + i] * 9 + [40 + i], 24) for i in range(6)]
    expected = await alone(make_engine, cases)
    # 20 pages of 4 tokens: six requests growing to 34 tokens cannot all stay resident
    engine = await make_engine(
        SchedulerConfig(max_num_batched_tokens=64, page_lookahead=1), num_pages=20
    )
    streams = [await engine.generate(p, greedy(n)) for p, n in cases]
    results = await asyncio.gather(*(s.collect() for s in streams))
    assert engine.scheduler.num_preemptions > 0
    assert [r.token_ids for r in results] == expected
    await engine.stop()


async def test_a_repeated_prompt_reuses_the_cached_prefix(make_engine):
    engine = await make_engine()
    prompt = list(range(10, 40))
    first = await engine.complete(prompt, greedy(4))
    second = await engine.complete(prompt, greedy(4))
    # 7 pages in place and the 29th token copied from the 8th page: all but the last
    assert (first.num_cached_tokens, second.num_cached_tokens) == (0, 29)
    assert second.token_ids == first.token_ids
    (stats,) = engine.cache_stats()
    assert stats.num_prefix_hit_tokens >= 28
    await engine.stop()


async def test_abort_ends_every_lease_and_keeps_what_was_computed(make_engine):
    """An abort (a client gone, a stop string the edge matched) frees the request's pages
    but keeps the KV it computed as a cached prefix, as a normal finish does: the prompt's
    full pages (4 tokens each) are cached, a queued request that computed nothing leaves
    nothing, and the same prompt again starts from the cache."""
    engine = await make_engine()
    (start,) = engine.cache_stats()
    prompt = list(range(3, 50))
    stream = await engine.generate(prompt, greedy(300))
    queued = await engine.generate(list(range(5, 30)), greedy(300), priority=Priority.SHEDDABLE)
    first = await anext(stream)
    assert first.num_prompt_tokens == 47 and len(first.token_ids) == 1
    assert stream.abort() and queued.abort()
    rest = [u async for u in stream]
    assert rest[-1].finish_reason == "abort"
    assert (await queued.collect()).finish_reason == "abort"
    (end,) = engine.cache_stats()
    assert end.num_leases == 0
    assert end.num_free_pages + end.num_cached_pages == start.num_free_pages
    assert end.num_cached_pages >= 47 // 4  # the prompt's full pages, at least
    assert not engine.abort(stream.req_id)
    again = await engine.complete(prompt, greedy(1))
    # every full page of the prompt in place, the 2 tokens after them copied: all but the last
    assert again.num_cached_tokens == 46
    await engine.stop()


async def test_errors_reach_the_caller(make_engine):
    engine = await make_engine(SchedulerConfig(max_queue_len=1), max_model_len=64)
    with pytest.raises(InvalidArgument, match="vocabulary"):
        await engine.generate([1, VOCAB], greedy(1))
    with pytest.raises(InvalidArgument, match="limit is 63"):
        await engine.generate([3] * 64, greedy(1))
    with pytest.raises(InvalidArgument, match="timeout_s"):
        await engine.generate([3], greedy(1), timeout_s=0)
    await engine.stop()


async def test_a_pool_smaller_than_the_context_bounds_the_sequences_it_serves(make_engine):
    """16 pages of 4 hold 64 tokens, less than the model's context: the executor serves
    sequences of 64 tokens at most. A longer prompt, or a prompt and max_tokens past it,
    is refused at submit; an output without max_tokens ends at it with "length", where it
    used to stream until the pool ran out and then fail."""
    engine = await make_engine(num_pages=16)
    assert engine.executors[0].info.max_model_len == 64
    with pytest.raises(InvalidArgument, match="limit is 63"):
        await engine.generate([3] * 64, greedy(1))
    with pytest.raises(InvalidArgument, match=r"max_tokens \(55\) plus the prompt's 10 tokens"):
        await engine.generate([3] * 10, greedy(55))
    done = await engine.complete([3] * 10, SamplingParams(temperature=0.0, ignore_eos=True))
    assert (len(done.token_ids), done.finish_reason) == (54, "length")
    (stats,) = engine.cache_stats()
    assert stats.num_leases == 0
    await engine.stop()


async def test_a_max_model_len_the_pool_cannot_hold_is_refused_at_start(make_engine):
    with pytest.raises(
        InvalidArgument, match=r"max_model_len \(128\) exceeds what the KV pool holds: 64 tokens"
    ):
        await make_engine(num_pages=16, max_model_len=128)


async def test_a_request_past_its_deadline_ends_with_deadline_exceeded(make_engine):
    engine = await make_engine()
    slow = await engine.generate([3] * 10, greedy(400), timeout_s=0.05)
    with pytest.raises(DeadlineExceeded, match="deadline"):
        await slow.collect()
    (stats,) = engine.cache_stats()
    assert stats.num_leases == 0
    await engine.stop()


async def test_a_full_queue_answers_resource_exhausted(make_engine):
    engine = await make_engine(SchedulerConfig(max_queue_len=1, max_num_seqs=1))
    running = await engine.generate([3, 4], greedy(200))
    await anext(running)  # admitted: the queue is empty again
    queued = await engine.generate([5, 6], greedy(1))
    with pytest.raises(ResourceExhausted, match="queue full"):
        await engine.generate([7, 8], greedy(1))
    running.abort()
    assert len((await queued.collect()).token_ids) == 1
    await engine.stop()


def record_threads(core) -> dict[str, set[str]]:
    """Wrap the core's prepare and execute to record the threads they run on."""
    threads: dict[str, set[str]] = {"prepare": set(), "execute": set()}
    for name in threads:
        verb = getattr(core, name)

        def recorded(arg, verb=verb, name=name):
            threads[name].add(threading.current_thread().name)
            return verb(arg)

        setattr(core, name, recorded)
    return threads


@pytest.mark.parametrize("num_pages", [256, 20])  # 20: requests are preempted and resumed
async def test_plans_prepared_ahead_on_their_own_thread_give_the_same_tokens(
    make_engine, num_pages
):
    cases = (
        mixed_prompts(24, seed=3)
        if num_pages == 256
        else [([5 + i] * 9 + [40 + i], 24) for i in range(6)]
    )
    expected = await alone(make_engine, cases)
    engine = await make_engine(
        SchedulerConfig(max_num_batched_tokens=64, page_lookahead=1),
        overlap_prepare=True,
        num_pages=num_pages,
    )
    threads = record_threads(engine.executors[0])
    streams = [await engine.generate(p, greedy(n)) for p, n in cases]
    results = await asyncio.gather(*(s.collect() for s in streams))
    assert [r.token_ids for r in results] == expected
    if num_pages == 20:
        assert engine.scheduler.num_preemptions > 0
    (prepare_thread,) = threads["prepare"]
    (execute_thread,) = threads["execute"]
    assert prepare_thread.endswith("-prepare_0") and prepare_thread != execute_thread
    await engine.stop()


async def test_on_cpu_plans_are_prepared_on_the_step_thread_by_default(make_engine):
    engine = await make_engine()
    threads = record_threads(engine.executors[0])
    assert len((await engine.complete([3, 4, 5], greedy(4))).token_ids) == 4
    assert threads["prepare"] == threads["execute"]  # core.step on the step thread
    assert len(threads["execute"]) == 1
    await engine.stop()


async def test_a_failed_prepare_ends_every_request_and_runs_no_later_step(make_engine):
    engine = await make_engine(overlap_prepare=True)
    core = engine.executors[0]
    prepare, calls = core.prepare, []

    def failing(plan):
        calls.append(plan.step_id)
        if len(calls) == 3:
            raise RuntimeError("device lost")
        return prepare(plan)

    core.prepare = failing
    streams = [await engine.generate([3 + i] * 5, greedy(50)) for i in range(4)]
    for stream in streams:
        with pytest.raises(Unavailable, match="device lost"):
            await stream.collect()
    assert len(calls) == 3  # the plan after the failed one never reached the core
    await engine.stop()
