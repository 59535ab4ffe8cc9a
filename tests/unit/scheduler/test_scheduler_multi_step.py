"""Multi-step decode plans in the scheduler core, over the toy executor (which checks that
every KV write lands in the sequence's own pages): when a plan gets k steps, its pages,
and the plans that stay one step."""

from __future__ import annotations

import random

import pytest
from sched_fakes import greedy as g
from sched_fakes import make_rig, reference

from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from services.executor.core.spec.switch import PROBE_EVERY, SpecSwitch
from services.scheduler.core import SchedulerConfig
from services.scheduler.core.draft_offers import offers_drafts


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 100) for _ in range(rng.randint(1, 30))] for _ in range(n)]


def _assert_pool_clean(rig) -> None:
    s = rig.stats()
    assert (s.num_leases, s.num_leased_pages) == (0, 0)
    assert s.num_free_pages + s.num_cached_pages == s.num_pages
    assert rig.toy.corruptions == []


async def _run(rig, prompts, lengths) -> None:
    await rig.scheduler.start()
    for i, (p, n) in enumerate(zip(prompts, lengths, strict=True)):
        await rig.scheduler.submit(f"r{i}", p, g(n))
    await rig.sink.wait(*(f"r{i}" for i in range(len(prompts))))
    await rig.scheduler.stop()


@pytest.mark.parametrize("round_trip", [0, 4])  # 4: the pipeline deepens to its ceiling
@pytest.mark.parametrize("num_pages", [512, 40])  # 40: pages run short, some requests preempted
async def test_multi_step_plans_give_exact_tokens_in_their_own_pages(num_pages, round_trip):
    config = SchedulerConfig(
        max_num_batched_tokens=64,
        max_num_seqs=16,
        decode_steps_per_plan=8,
        max_steps_in_flight=4 if round_trip else 2,
    )
    rig = make_rig(config, num_pages=num_pages)
    rig.port.round_trip_steps = round_trip
    prompts = _prompts(12, seed=num_pages)
    lengths = [1 + (i * 5) % 23 for i in range(12)]
    await _run(rig, prompts, lengths)
    for i, p in enumerate(prompts):
        assert rig.sink.tokens[f"r{i}"] == reference(p, lengths[i]), f"r{i}"
    assert max(plan.num_steps for plan in rig.toy.plans) == 8
    assert rig.toy.num_substeps_run > 0
    # deep: requests whose last steps are in flight do not keep the others to one step a plan
    assert max(rig.port.steps_left_at_plans) >= (3 if round_trip else 1)
    _assert_pool_clean(rig)


async def test_a_plan_takes_only_the_steps_its_longest_sequence_has_left():
    rig = make_rig(SchedulerConfig(decode_steps_per_plan=16))
    await _run(rig, [[5, 6, 7], [8, 9]], [4, 6])
    # after the prefill step: one plan of 5 steps (the longer request's 5 decodes)
    assert [plan.num_steps for plan in rig.toy.plans] == [1, 5]
    assert rig.sink.tokens["r1"] == reference([8, 9], 6)
    _assert_pool_clean(rig)


async def test_plans_stay_one_step_while_a_request_waits():
    rig = make_rig(SchedulerConfig(max_num_seqs=1, decode_steps_per_plan=8))
    await _run(rig, [[5, 6, 7], [8, 9]], [10, 10])
    plans = rig.toy.plans
    admits = [i for i, p in enumerate(plans) if p.new_seqs]
    assert len(admits) == 2
    # r1 waited until r0 finished: every plan before its admission was one step
    assert all(p.num_steps == 1 for p in plans[: admits[1]])
    assert max(p.num_steps for p in plans[admits[1] :]) == 8
    assert rig.sink.tokens["r1"] == reference([8, 9], 10)


async def test_speculative_batches_and_jump_forward_rows_stay_one_step():
    speculates = {"max_draft_tokens": 2, "max_speculative_batch_size": 4}
    rig = make_rig(SchedulerConfig(decode_steps_per_plan=8), executor_info=speculates)
    await _run(rig, [[5, 6, 7], [8, 9]], [12, 12])
    assert {plan.num_steps for plan in rig.toy.plans} == {1}  # 2 decodes: drafts may run
    rig = make_rig(SchedulerConfig(decode_steps_per_plan=8), executor_info={"max_forced_tokens": 4})
    await rig.scheduler.start()
    regex = Constraint(ConstraintKind.REGEX, "[a-z]+")
    await rig.scheduler.submit("c", [5, 6, 7], g(12), constraint=regex)
    await rig.sink.wait("c")
    await rig.scheduler.stop()
    assert {plan.num_steps for plan in rig.toy.plans} == {1}  # its grammar may force tokens
    assert len(rig.sink.tokens["c"]) == 12


def declining_executor(rig) -> SpecSwitch:
    """The toy executor reports undrafted_steps as a speculating executor whose switch
    declines every step does (a real SpecSwitch: a step offered no drafts, or a later step
    of a plan, counts toward the probe; a step offered drafts is declined or probes)."""
    switch = SpecSwitch(4, cost_ratios={1: 100.0, 4: 100.0})
    switch.gain = 1.0

    def undrafted(plan, substep, result) -> int:
        num_decodes = len(plan.running_seqs)
        offered = not substep and any(r.num_draft_tokens for r in plan.running_seqs)
        num_seqs = num_decodes + len(plan.new_seqs)
        if not num_seqs:
            return 0
        if plan.new_seqs:  # a prefill step answers for its sequences' decodes too
            return switch.steps_to_probe(num_seqs)
        if offered:
            switch.allows(num_decodes)
        else:
            switch.note_undrafted(num_decodes)
        return switch.steps_to_probe(num_decodes)

    rig.toy.undrafted = undrafted
    return switch


async def test_decodes_a_declining_switch_would_not_draft_run_several_steps_a_plan():
    speculates = {"max_draft_tokens": 2, "max_speculative_batch_size": 4}
    rig = make_rig(SchedulerConfig(decode_steps_per_plan=8), executor_info=speculates)
    switch = declining_executor(rig)
    prompts, length = [[5, 6, 7], [8, 9]], 240
    await _run(rig, prompts, [length, length])
    for i, p in enumerate(prompts):
        assert rig.sink.tokens[f"r{i}"] == reference(p, length)
    plans = [p for p in rig.toy.plans if p.running_seqs and not p.new_seqs]
    offered = [p for p in plans if any(r.num_draft_tokens for r in p.running_seqs)]
    assert max(p.num_steps for p in plans) == 8  # the declined batch runs 8 steps a plan
    assert all(p.num_steps == 1 for p in offered)  # drafts only in plans of one step
    # one plan offering drafts per PROBE_EVERY steps, each of them the probe (the steps
    # planned while it ran are offered none), and the one planned while the prefill ran,
    # before the executor had answered anything
    assert switch.num_probes >= (length - 2 * PROBE_EVERY) // PROBE_EVERY
    assert len(offered) == switch.num_probes + 1
    assert offered[0].step_id == 2
    _assert_pool_clean(rig)


@pytest.mark.parametrize("declines", [True, False])
async def test_a_speculating_pipeline_deepens_only_where_its_plans_offer_no_drafts(declines):
    """Plans arrive late (a round trip of two steps). While the executor's switch declines,
    its plans offer no drafts and the pipeline deepens as without speculation; a plan that
    offers drafts goes out with at most one step in flight before it (its prepare waits for
    the step before anyway, and the switch's answers must keep up with the offers). A switch
    that drafts every step keeps the pipeline at 2 throughout."""
    speculates = {"max_draft_tokens": 2, "max_speculative_batch_size": 4}
    config = SchedulerConfig(decode_steps_per_plan=4)
    rig = make_rig(config, num_pages=512, executor_info=speculates)
    rig.port.round_trip_steps = 2
    if declines:
        declining_executor(rig)
    prompts, length = [[5, 6, 7], [8, 9]], 300
    await _run(rig, prompts, [length, length])
    for i, p in enumerate(prompts):
        assert rig.sink.tokens[f"r{i}"] == reference(p, length)
    plans = [p for p in rig.toy.plans if not p.abort_req_ids]
    left = rig.port.steps_left_at_plans
    offered = [n for plan, n in zip(plans, left, strict=True) if offers_drafts(plan)]
    assert offered and max(offered) <= 1, offered
    if declines:
        assert max(left) >= 2  # declined stretches: deeper than a plan offering drafts goes
        assert len(offered) < len(plans) // 4
    else:
        assert max(left) == 1 and len(offered) == len(plans) - 1  # all but the prefill
    _assert_pool_clean(rig)


@pytest.mark.parametrize("round_trip", [0, 2])  # 2: plans come late, the pipeline deepens
@pytest.mark.parametrize(("num_pages", "length"), [(512, 200), (40, 70)])  # 40: pages run short
async def test_plans_made_while_a_probe_runs_leave_room_for_the_drafts_it_keeps(
    num_pages, length, round_trip
):
    """A declined batch's probe keeps every draft token (a perfect proposer): the plans
    made while it runs (several steps each, no drafts offered) start wherever its
    verification left each sequence, so their pages cover the drafts kept as well. The toy
    asserts every KV write lands in the sequence's own pages; the tokens stay exact."""
    speculates = {"max_draft_tokens": 4, "max_speculative_batch_size": 4}
    rig = make_rig(SchedulerConfig(decode_steps_per_plan=8), num_pages=num_pages, executor_info=speculates)
    switch = declining_executor(rig)
    rig.toy.keeps_drafts = True
    rig.port.round_trip_steps = round_trip
    prompts = [[5, 6, 7], [8, 9], [3], [4, 4]][: 4 if num_pages > 100 else 2]
    await _run(rig, prompts, [length] * len(prompts))
    for i, p in enumerate(prompts):
        assert rig.sink.tokens[f"r{i}"] == reference(p, length)
    assert switch.num_probes >= 1
    plans = rig.toy.plans
    probes = [i for i, p in enumerate(plans) if any(r.num_draft_tokens for r in p.running_seqs)]
    after = [plans[i + 1] for i in probes if i + 1 < len(plans)]
    assert any(p.num_steps > 1 for p in after)  # planned while a probe ran: several steps
    if round_trip:  # the declined stretches ran deeper than the cap on offering plans
        assert max(rig.port.steps_left_at_plans) >= 2
    _assert_pool_clean(rig)


async def test_an_abort_while_a_plan_runs_goes_out_in_a_plan_of_its_own():
    rig = make_rig(SchedulerConfig(decode_steps_per_plan=32))
    await rig.scheduler.start()
    await rig.scheduler.submit("a", [5, 6, 7], g(100))
    await rig.scheduler.submit("b", [8, 9], g(100))
    await rig.sink.wait_tokens("a", 4)
    assert rig.scheduler.abort("a")
    await rig.sink.wait("a", "b")
    await rig.scheduler.stop()
    assert rig.sink.finished["a"].finish_reason == "abort"
    (abort,) = [p for p in rig.toy.plans if p.abort_req_ids]
    assert (abort.abort_req_ids, abort.running_seqs, abort.new_seqs) == (["a"], [], [])
    assert rig.sink.tokens["b"] == reference([8, 9], 100)
    _assert_pool_clean(rig)


@pytest.mark.parametrize(
    ("ceiling", "speculates", "most_left"),
    [(4, False, 2), (2, False, 1), (4, True, 2), (None, False, 2)],
)
async def test_plans_that_arrive_late_deepen_the_pipeline_up_to_its_ceiling(
    ceiling, speculates, most_left
):
    """With a round trip of two steps, plans sent with one step left (the floor, 2 in
    flight) arrive late; the scheduler then keeps 3 in flight (2 left at each plan), so
    they arrive in time, and no further (the ceiling allows 4). A ceiling of 2 keeps 2. A
    speculating executor past its batch cap is offered no drafts: it deepens alike."""
    info = {"max_draft_tokens": 2, "max_speculative_batch_size": 1} if speculates else {}
    config = SchedulerConfig(decode_steps_per_plan=4)  # None: the default ceiling, 4
    if ceiling is not None:
        config = SchedulerConfig(decode_steps_per_plan=4, max_steps_in_flight=ceiling)
    rig = make_rig(config, executor_info=info)  # two sequences: past the speculative cap
    rig.port.round_trip_steps = 2
    prompts = [[5, 6, 7], [8, 9]]
    await _run(rig, prompts, [60, 60])
    for i, p in enumerate(prompts):
        assert rig.sink.tokens[f"r{i}"] == reference(p, 60)
    assert max(plan.num_steps for plan in rig.toy.plans) == 4
    left = rig.port.steps_left_at_plans
    assert max(left) == most_left, left
    (load,) = rig.scheduler.executor_loads()
    assert load.steps_in_flight_target == most_left + 1
    _assert_pool_clean(rig)


async def test_plans_in_time_keep_the_pipeline_at_two():
    rig = make_rig(SchedulerConfig(decode_steps_per_plan=4, max_steps_in_flight=4))
    rig.port.round_trip_steps = 1  # shorter than a step: plans with one step left are in time
    await _run(rig, [[5, 6, 7], [8, 9]], [60, 60])
    assert max(rig.port.steps_left_at_plans) == 1
    assert rig.scheduler.executor_loads()[0].steps_in_flight_target == 2


@pytest.mark.parametrize("n", [0, 66])
def test_max_steps_in_flight_out_of_range_is_refused(n):
    with pytest.raises(InvalidArgument, match="max_steps_in_flight must be in"):
        SchedulerConfig(max_steps_in_flight=n)


@pytest.mark.parametrize("k", [0, 65])
def test_decode_steps_per_plan_out_of_range_is_refused(k):
    with pytest.raises(InvalidArgument, match="decode_steps_per_plan"):
        SchedulerConfig(decode_steps_per_plan=k)


async def test_a_stop_inside_a_plan_commits_no_kv_past_the_last_token_fed():
    """The plan advanced the request's planned position by all its steps; the commit takes
    only the tokens whose KV a step computed (the stop token itself was never fed back)."""
    prompt = next(p for p in _prompts(300, seed=7) if 0 in reference(p, 40)[3:])
    expected = reference(prompt, 40, ignore_eos=False)  # ends at the toy's EOS (0)
    rig = make_rig(SchedulerConfig(decode_steps_per_plan=32), page_size=1)
    await rig.scheduler.start()
    await rig.scheduler.submit("e", prompt, SamplingParams(max_tokens=40, temperature=0.0))
    await rig.sink.wait("e")
    await rig.scheduler.stop()
    assert rig.sink.tokens["e"] == expected
    assert max(plan.num_steps for plan in rig.toy.plans) > len(expected) - 1  # ended inside
    (cached,) = rig.cache.match(prompt + expected + [7, 7, 7]).values()
    assert cached == len(prompt) + len(expected) - 1  # pages of one token: exact
    _assert_pool_clean(rig)
