"""The running batch's decode fast path builds the plans the general path builds."""

from __future__ import annotations

import functools
import random

import pytest
from sched_fakes import greedy, make_rig, reference

from radixmesh.sampling import Priority, SamplingParams
from services.scheduler.core import SchedulerConfig, running
from services.scheduler.core import scheduler as scheduler_module

CASES = [
    # (seed, config, pool pages, ExecutorInfo fields)
    (0, dict(max_num_batched_tokens=24, max_num_seqs=8, page_lookahead=0), 24, {}),
    (1, dict(max_num_batched_tokens=64, max_num_seqs=8, page_lookahead=1), 16, {}),
    (2, dict(max_num_batched_tokens=8, max_num_seqs=3, page_lookahead=3), 20, {}),
    (
        3,
        dict(max_num_batched_tokens=32, max_num_seqs=8, page_lookahead=0),
        24,
        dict(max_draft_tokens=2, max_speculative_batch_size=4),
    ),
    (4, dict(max_num_batched_tokens=64, max_num_seqs=16, decode_steps_per_plan=3), 32, {}),
]


async def _run(case, fast: bool, monkeypatch) -> tuple[list, dict, int]:
    """Plans (page ids included), tokens and _make_room calls of one mixed run."""
    seed, config, num_pages, info = case
    monkeypatch.setattr(
        scheduler_module,
        "schedule_running",
        functools.partial(running.schedule_running, fast=fast),
    )
    calls = 0
    make_room = running._make_room

    async def counted(*args, **kwargs):
        nonlocal calls
        calls += 1
        return await make_room(*args, **kwargs)

    monkeypatch.setattr(running, "_make_room", counted)
    rng = random.Random(seed)
    rig = make_rig(SchedulerConfig(**config), num_pages=num_pages, executor_info=info)
    await rig.scheduler.start()
    cases = {}
    for wave in range(3):  # waves arrive while earlier ones decode: prefills among decodes
        for i in range(6):
            req_id = f"w{wave}r{i}"
            prompt = [rng.randrange(1, 100) for _ in range(rng.randint(1, 30))]
            cases[req_id] = (prompt, rng.randint(1, 24))
            priority = rng.choice([Priority.INTERACTIVE, Priority.BATCH])
            await rig.scheduler.submit(req_id, prompt, greedy(cases[req_id][1]), priority=priority)
        for _ in range(rng.randint(2, 5)):
            if len(rig.sink.finished) < len(cases):
                await rig.sink.next_batch()
    await rig.sink.wait(*cases)
    await rig.scheduler.stop()
    for req_id, (prompt, n) in cases.items():
        end = rig.sink.finished[req_id]
        if end.error is None:
            assert rig.sink.tokens[req_id] == reference(prompt, n), req_id
    assert rig.toy.corruptions == []
    return rig.toy.plans, dict(rig.sink.tokens), calls


@pytest.mark.parametrize("case", CASES, ids=[f"seed{c[0]}" for c in CASES])
async def test_the_fast_path_builds_the_general_paths_plans(case, monkeypatch):
    general_plans, general_tokens, general_calls = await _run(case, False, monkeypatch)
    fast_plans, fast_tokens, fast_calls = await _run(case, True, monkeypatch)
    assert len(fast_plans) == len(general_plans) > 10
    for general, fast in zip(general_plans, fast_plans, strict=True):
        assert fast == general  # step ids, new and running sequences, page ids, drafts
    assert fast_tokens == general_tokens
    # the fast path skipped the page work of most sequences; the general one did all of it
    num_running = sum(len(p.running_seqs) for p in general_plans)
    assert general_calls >= num_running
    assert fast_calls < general_calls / 2



async def test_the_step_decodes_exactly_what_wants_decode_names():
    from sched_fakes import ToyExecutor, ToyExecutorPort

    from services.scheduler.core.budget import StepBudget
    from services.scheduler.core.executor_state import ExecutorState
    from services.scheduler.core.request import Request

    toy = ToyExecutor(num_pages=1024, page_size=4, max_model_len=40)
    ex = ExecutorState.create(ToyExecutorPort("e", toy), SchedulerConfig(max_num_seqs=64))
    rng = random.Random(5)
    for i in range(48):
        prompt = list(range(1, rng.randint(2, 12)))
        max_tokens = rng.choice([None, 1, 3, 8, 40])
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        req = Request(f"r{i}", prompt, sampling, float(i))
        # decoding (not prefilling): every prompt token computed, some outputs sampled
        req.output_token_ids = [7] * rng.randint(0, 30)
        req.num_admitted_tokens = len(prompt)
        req.num_computed_tokens = len(prompt) + max(0, len(req.output_token_ids) - 1)
        req.on_executor = rng.random() < 0.8
        req.page_table = list(range(i * 16, i * 16 + 12))  # covers 48 > max_model_len
        ex.running[req.req_id] = req
    expected = [r.req_id for r in ex.running.values() if running.wants_decode(r, 40)]
    assert 5 < len(expected) < 40  # both kinds present
    budget = StepBudget(num_tokens=1024, num_seqs=64)
    leases = None  # every page table covers its step: no page work asked for
    seqs = await running.schedule_running(ex, leases, budget)  # type: ignore[arg-type]
    assert sorted(s.req_id for s in seqs) == sorted(expected)
    assert all(s.num_scheduled_tokens == 1 and s.appended_page_ids == [] for s in seqs)
