"""The scheduler's side of jump-forward: with an executor that states max_forced_tokens,
constrained decodes may verify that many draft tokens at any batch size, unconstrained
ones none, and drafts only take the budget the step's decodes leave over."""

from __future__ import annotations

import dataclasses

from sched_fakes import greedy as g
from sched_fakes import make_rig, reference

from radixmesh.sampling import Constraint, ConstraintKind
from services.scheduler.core import SchedulerConfig

REGEX = Constraint(ConstraintKind.REGEX, "[0-9]+")
BUDGET = 24


async def test_constrained_decodes_get_draft_tokens_and_every_decode_keeps_its_token():
    rig = make_rig(SchedulerConfig(max_num_batched_tokens=BUDGET, max_num_seqs=32), num_pages=512)
    (ex,) = rig.scheduler._executors.values()
    ex.info = dataclasses.replace(ex.info, max_forced_tokens=8)  # as GetInfo would state it
    constrained = {f"c{i}" for i in range(12)}
    prompts = {rid: [3 + i, 4 + i] for i, rid in enumerate([*sorted(constrained), "u0", "u1", "u2"])}
    await rig.scheduler.start()
    for rid, prompt in prompts.items():
        await rig.scheduler.submit(
            rid, prompt, g(10), constraint=REGEX if rid in constrained else None
        )
    await rig.sink.wait(*prompts)
    await rig.scheduler.stop()
    for rid, prompt in prompts.items():
        assert rig.sink.tokens[rid] == reference(prompt, 10), rid  # the toy ignores drafts
    full = 0
    for plan in rig.toy.plans:
        decodes = [r for r in plan.running_seqs if r.num_scheduled_tokens == 1]
        scheduled = sum(r.num_scheduled_tokens + r.num_draft_tokens for r in plan.running_seqs)
        scheduled += sum(n.num_scheduled_tokens for n in plan.new_seqs)
        assert scheduled <= BUDGET
        assert all(r.num_draft_tokens >= 0 for r in plan.running_seqs)  # a uint32 on the wire
        assert all(r.num_draft_tokens == 0 for r in plan.running_seqs if r.req_id not in constrained)
        if len(decodes) == len(prompts):  # every request decoding: none left out for drafts
            full += 1
            assert any(r.num_draft_tokens for r in decodes)
            assert sum(r.num_draft_tokens for r in decodes) == BUDGET - len(decodes)
    assert full > 0


async def test_without_max_forced_tokens_no_draft_is_planned():
    rig = make_rig(SchedulerConfig(max_num_batched_tokens=BUDGET, max_num_seqs=8))
    await rig.scheduler.start()
    await rig.scheduler.submit("c", [5, 6], g(6), constraint=REGEX)
    await rig.sink.wait("c")
    await rig.scheduler.stop()
    assert all(r.num_draft_tokens == 0 for p in rig.toy.plans for r in p.running_seqs)
