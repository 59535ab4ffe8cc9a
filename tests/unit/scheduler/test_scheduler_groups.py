"""Program groups (services/scheduler/core/groups.py) and speculative work, over the toy
executor, whose page slots record every KV write: a page read before it was written, or
written by a request other than the one the tree says, shows up as a corruption.

- a fork's branches start in one step and compute the pages they share once;
- a group's members are not preempted for an unrelated request of their class;
- speculative work ranks last, never ages past other classes, is preempted first;
- a held context survives page pressure; a cancelled speculative prefill leaves
  nothing behind."""

from __future__ import annotations

import asyncio
import re

import pytest

from radixmesh.sampling import Priority
from services.scheduler.core import SchedulerConfig
from services.scheduler.core.queue import WaitQueue
from services.scheduler.core.request import Request
from tests.unit.scheduler.sched_fakes import MessageCache, greedy, make_rig, reference

PAGE = 4
PROMPT = list(range(3, 21))  # 18 tokens: 4 full pages shareable (the last token is computed)


def new_seq_plans(rig, req_ids) -> dict[str, list[int]]:
    """Per request: the step ids of the plans that sent it as a new sequence."""
    out: dict[str, list[int]] = {r: [] for r in req_ids}
    for plan in rig.toy.plans:
        for seq in plan.new_seqs:
            if seq.req_id in out:
                out[seq.req_id].append(plan.step_id)
    return out


def scheduled_prefill_tokens(rig, req_ids) -> int:
    """Tokens of the requests' prompts the executor computed (new sequences and prefill chunks)."""
    total = 0
    for plan in rig.toy.plans:
        total += sum(s.num_scheduled_tokens for s in plan.new_seqs if s.req_id in req_ids)
    return total


async def run_fork(group: bool, num_branches: int = 3):
    config = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16)
    rig = make_rig(config, num_pages=64, page_size=PAGE)
    await rig.scheduler.start()
    ids = [f"b{i}" for i in range(num_branches)]
    for req_id in ids:
        await rig.scheduler.submit(
            req_id, PROMPT, greedy(3), group_id="prog/fork" if group else ""
        )
    await rig.sink.wait(*ids)
    await rig.scheduler.stop()
    return rig, ids


async def test_a_forks_branches_start_in_one_step_and_compute_their_shared_pages_once():
    rig, ids = await run_fork(group=True)
    starts = new_seq_plans(rig, ids)
    assert len({s for steps in starts.values() for s in steps}) == 1, starts  # one step
    assert all(len(steps) == 1 for steps in starts.values()), starts  # none preempted
    # the first computes the whole prompt; the others only what follows its 4 pages and
    # the 17th token, copied from the first's partial page in the same step (the 18th
    # they compute: its logits are theirs)
    num_shared = 4 * PAGE + 1
    expected = len(PROMPT) + (len(ids) - 1) * (len(PROMPT) - num_shared)
    assert scheduled_prefill_tokens(rig, ids) == expected
    cached = sorted(rig.sink.first[r].num_cached_tokens for r in ids)
    assert cached == [0] + [num_shared] * (len(ids) - 1)
    assert rig.toy.num_copied_tokens == len(ids) - 1
    # the others read the leader's pages within the same forward: same page ids, no mix-up
    plan = next(p for p in rig.toy.plans if p.new_seqs)
    tables = [s.page_ids[:4] for s in plan.new_seqs]
    assert all(t == tables[0] for t in tables), tables
    assert rig.toy.corruptions == []
    for req_id in ids:
        assert rig.sink.tokens[req_id] == reference(PROMPT, 3)
    assert rig.stats().num_leases == 0


async def test_the_leaders_of_a_steps_groups_publish_their_pages_in_one_cache_message():
    # three forks start in one step: each leader's commit (its shared pages into the tree)
    # and extend (its pages after them lent again) go out together, in order, not as six
    # messages awaited one after another while the step is planned
    caches: list[MessageCache] = []

    def port(core):
        caches.append(MessageCache(core))
        return caches[0]

    config = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16)
    rig = make_rig(config, num_pages=64, page_size=PAGE, cache_port=port)
    await rig.scheduler.start()
    prompts = {f"f{g}": [20 * (g + 1) + t for t in PROMPT] for g in range(3)}
    ids = [f"{fork}-b{i}" for fork in prompts for i in range(3)]
    await asyncio.gather(
        *(
            rig.scheduler.submit(req_id, prompts[req_id[:2]], greedy(3), group_id=req_id[:2])
            for req_id in ids
        )
    )
    await rig.sink.wait(*ids)
    await rig.scheduler.stop()
    starts = new_seq_plans(rig, ids)
    assert len({s for steps in starts.values() for s in steps}) == 1, starts
    published = [m for m in caches[0].messages if "extend" in m and "commit" in m]
    assert published == [["commit", "extend"] * 3], caches[0].messages
    assert rig.toy.corruptions == []
    for req_id in ids:
        assert rig.sink.tokens[req_id] == reference(prompts[req_id[:2]], 3)


async def test_ungrouped_requests_sharing_uncached_pages_still_wait_a_step_for_them():
    rig, ids = await run_fork(group=False)
    starts = new_seq_plans(rig, ids)
    leader = min(ids, key=lambda r: starts[r][0])
    assert all(starts[r][0] > starts[leader][0] for r in ids if r != leader), starts
    assert rig.toy.corruptions == []
    for req_id in ids:
        assert rig.sink.tokens[req_id] == reference(PROMPT, 3)


async def test_a_group_member_is_not_preempted_for_an_unrelated_request_of_its_class():
    # three requests that grow past the pool together: pages run short while they decode
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, page_lookahead=0)
    rig = make_rig(config, num_pages=14, page_size=PAGE)
    await rig.scheduler.start()
    prompts = {"alone": [50, 51, 52, 53, 54], "g0": [60, 61, 62, 63, 64], "g1": [70, 71, 72, 73, 74]}
    # the unrelated request arrives first: by arrival alone a later group member would go
    await rig.scheduler.submit("alone", prompts["alone"], greedy(16))
    for req_id in ("g0", "g1"):
        await rig.scheduler.submit(req_id, prompts[req_id], greedy(16), group_id="prog/fork")
    await rig.sink.wait(*prompts)
    await rig.scheduler.stop()
    starts = new_seq_plans(rig, prompts)
    assert rig.scheduler.num_preemptions > 0
    assert len(starts["alone"]) > 1, starts  # it yielded
    assert len(starts["g0"]) == len(starts["g1"]) == 1, starts  # the group never did
    assert rig.toy.corruptions == []
    for req_id, prompt in prompts.items():
        assert rig.sink.tokens[req_id] == reference(prompt, 16)


async def test_without_a_group_the_latest_arrival_is_preempted():
    """The same pressure with no group: the rule above is what protects the members."""
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, page_lookahead=0)
    rig = make_rig(config, num_pages=14, page_size=PAGE)
    await rig.scheduler.start()
    prompts = {"alone": [50, 51, 52, 53, 54], "g0": [60, 61, 62, 63, 64], "g1": [70, 71, 72, 73, 74]}
    for req_id, prompt in prompts.items():
        await rig.scheduler.submit(req_id, prompt, greedy(16))
    await rig.sink.wait(*prompts)
    await rig.scheduler.stop()
    starts = new_seq_plans(rig, prompts)
    assert len(starts["alone"]) == 1, starts
    assert len(starts["g1"]) > 1, starts


def test_speculative_work_ranks_after_every_class_and_does_not_age():
    queue = WaitQueue(SchedulerConfig(aging_rate=0.1))
    old_guess = Request("guess", [1, 2], greedy(1), arrival_time=0.0, priority=Priority.SPECULATIVE)
    fresh_shed = Request("shed", [1, 2], greedy(1), arrival_time=999.0, priority=Priority.SHEDDABLE)
    queue.push(old_guess)
    queue.push(fresh_shed)
    assert [r.req_id for r in queue.ranked()] == ["shed", "guess"]
    assert queue.rank(old_guess, 1000.0) == queue.rank(old_guess, 0.0)  # no aging


async def test_a_waiting_request_of_any_other_class_preempts_running_speculative_work():
    # one seat: the speculative prefill runs, then a sheddable request (one class above it,
    # below the priority gap of 2) arrives and takes the seat at once
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1)
    rig = make_rig(config, num_pages=64, page_size=PAGE)
    rig.port.gate = asyncio.Event()
    await rig.scheduler.start()
    await rig.scheduler.submit("guess", [5, 6, 7], greedy(40), priority=Priority.SPECULATIVE)
    rig.port.gate.set()
    await rig.sink.wait_tokens("guess", 2)
    await rig.scheduler.submit("real", [8, 9, 10], greedy(3), priority=Priority.SHEDDABLE)
    await rig.sink.wait("real", "guess")
    await rig.scheduler.stop()
    assert rig.sink.order.index("guess") < rig.sink.order.index("real")
    real_done = rig.sink.finished["real"]
    assert list(rig.sink.finished).index("real") < list(rig.sink.finished).index("guess")
    assert real_done.error is None
    assert rig.scheduler.num_preemptions >= 1
    assert rig.sink.tokens["guess"] == reference([5, 6, 7], 40)


async def test_a_held_context_survives_page_pressure_while_other_requests_are_preempted():
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, page_lookahead=0)
    rig = make_rig(config, num_pages=16, page_size=PAGE)
    await rig.scheduler.start()
    context = list(range(30, 47))  # 17 tokens + 1 output: 4 full pages held, and the tail
    await rig.scheduler.submit("ctx", context, greedy(1), hold_id="prog/ctx")
    await rig.sink.wait("ctx")
    held = rig.scheduler.holds.get("prog/ctx")
    assert rig.stats().num_locked_pages == 5  # the 17th token's partial page too
    assert held is not None and held.num_pages == 5  # counted as the cache locks them
    assert rig.scheduler.holds.num_pages(rig.port.info.executor_id) == 5
    (load,) = rig.scheduler.executor_loads()
    assert load.kv_usage == 5 / 16
    # 12 pages left for three requests that grow to 6 pages each: they preempt each other
    others = {f"o{i}": [80 + i, 81, 82, 83, 84] for i in range(3)}
    for req_id, prompt in others.items():
        await rig.scheduler.submit(req_id, prompt, greedy(18))
    await rig.sink.wait(*others)
    assert rig.scheduler.num_preemptions > 0
    assert rig.stats().num_locked_pages == 5  # never evicted, never unlocked
    tail = rig.sink.tokens["ctx"]
    assert rig.cache.match(context + tail)[rig.port.info.executor_id] == 17  # 16 + 1 copied
    # a later request over the held context finds it cached, and its tokens are right
    await rig.scheduler.submit("next", context + tail + [99], greedy(2))
    await rig.sink.wait("next")
    assert rig.sink.first["next"].num_cached_tokens == 17  # 16 in place, 1 copied
    assert rig.sink.tokens["next"] == reference(context + tail + [99], 2)
    assert await rig.scheduler.release_hold("prog/ctx")
    assert rig.stats().num_locked_pages == 0 and rig.stats().num_leases == 0
    assert rig.toy.corruptions == []
    await rig.scheduler.stop()


@pytest.mark.parametrize("cancel", ["abort_while_queued", "abort_while_running", "release"])
async def test_a_cancelled_speculative_prefill_leaves_no_pages_behind(cancel):
    config = SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=4)
    rig = make_rig(config, num_pages=32, page_size=PAGE)
    base = rig.stats()
    rig.port.gate = asyncio.Event()
    await rig.scheduler.start()
    prompt = list(range(5, 30))  # 25 tokens: four prefill chunks of 8
    sampling = greedy(1)
    if cancel == "abort_while_queued":
        await rig.scheduler.submit("busy", list(range(40, 60)), greedy(4))  # takes the budget
    await rig.scheduler.submit(
        "guess", prompt, sampling, priority=Priority.SPECULATIVE, hold_id="prog/guess"
    )
    if cancel == "release":
        rig.port.gate.set()
        await rig.sink.wait("guess")
        assert rig.scheduler.holds.get("prog/guess") is not None
        assert rig.stats().num_locked_pages > 0
        assert await rig.scheduler.release_hold("prog/guess")
    else:
        if cancel == "abort_while_running":
            rig.port.gate.set()
            await rig.port.step_done.wait()  # its first chunk ran: it holds a lease
            assert rig.stats().num_leases >= 1
        assert rig.scheduler.abort("guess")
        rig.port.gate.set()
        await rig.sink.wait("guess")
        assert rig.sink.finished["guess"].finish_reason == "abort"
        assert rig.scheduler.holds.get("prog/guess") is None
    if cancel == "abort_while_queued":
        await rig.sink.wait("busy")
    await rig.scheduler.stop()
    after = rig.stats()
    assert after.num_leases == 0 and after.num_leased_pages == 0 and after.num_locked_pages == 0
    assert len(rig.scheduler.holds) == 0
    assert after.num_free_pages + after.num_cached_pages == base.num_free_pages
    assert rig.toy.corruptions == []


def test_the_contract_carries_group_id_and_the_speculative_class():
    from radixmesh.v1 import inference_pb2 as ipb
    from radixmesh.v1 import scheduler_pb2
    from services.scheduler.convert import submission_from_proto

    msg = scheduler_pb2.SubmitRequest(
        req_id="a", token_ids=[1, 2], group_id="run-1/fork/0", priority=ipb.PRIORITY_SPECULATIVE
    )
    sub = submission_from_proto(msg)
    assert sub.group_id == "run-1/fork/0" and sub.priority is Priority.SPECULATIVE
    assert submission_from_proto(scheduler_pb2.SubmitRequest(req_id="b", token_ids=[1])).group_id == ""


async def test_a_groups_members_are_routed_to_the_executor_of_the_first():
    rig = make_rig(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16), num_executors=2)
    rig.ports[0].gate = asyncio.Event()
    rig.ports[1].gate = asyncio.Event()
    await rig.scheduler.start()
    reqs = []
    for i in range(6):  # distinct prompts: by load alone they would spread over both
        reqs.append(
            await rig.scheduler.submit(f"m{i}", [10 + i, 20 + i, 30 + i], greedy(2), group_id="g")
        )
    assert len({r.executor_id for r in reqs}) == 1
    rig.ports[0].gate.set()
    rig.ports[1].gate.set()
    await rig.sink.wait(*(r.req_id for r in reqs))
    await rig.scheduler.stop()


async def let_loop_run(times: int = 50) -> None:
    """Give the step loop its turns (it plans at once when nothing holds it back)."""
    for _ in range(times):
        await asyncio.sleep(0)


async def submit_apart(rig, gaps_s: list[float], group_id: str = "prog/select") -> list[str]:
    """Members of one group submitted one by one, the rig's clock moved on by each gap
    before the next, the step loop let run in between (as members reach a scheduler)."""
    ids = [f"m{i}" for i in range(len(gaps_s) + 1)]
    for i, req_id in enumerate(ids):
        if i:
            rig.clock[0] += gaps_s[i - 1]
        await rig.scheduler.submit(req_id, PROMPT, greedy(2), group_id=group_id)
        await let_loop_run()
    return ids


async def test_an_idle_executor_waits_for_a_group_still_arriving_and_starts_it_in_one_step():
    from services.scheduler.core.groups import GROUP_QUIET_S

    config = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16)
    rig = make_rig(config, num_pages=64, page_size=PAGE, manual_clock=True)
    await rig.scheduler.start()
    gap = GROUP_QUIET_S / 2
    ids = await submit_apart(rig, [gap, gap, gap])
    assert rig.toy.plans == []  # nothing planned while members still arrive
    rig.clock[0] += GROUP_QUIET_S  # quiet: the group is in
    await rig.sink.wait(*ids)
    await rig.scheduler.stop()
    starts = new_seq_plans(rig, ids)
    assert len({s for steps in starts.values() for s in steps}) == 1, starts
    num_shared = 4 * PAGE + 1  # 4 pages in place, 1 token copied from the leader's 5th
    expected = len(PROMPT) + (len(ids) - 1) * (len(PROMPT) - num_shared)
    assert scheduled_prefill_tokens(rig, ids) == expected  # the shared pages once
    assert rig.toy.corruptions == []


async def until_planned(rig, timeout_s: float = 10.0) -> None:
    """Until the step loop has sent a plan (it wakes from its wait for a group by itself)."""
    async with asyncio.timeout(timeout_s):
        while not rig.toy.plans:
            await asyncio.sleep(0.001)


@pytest.mark.parametrize("gap", ["quiet", "past_settle"])
async def test_the_wait_for_a_group_is_bounded(gap):
    """A member that comes after a quiet gap, or past GROUP_SETTLE_S from the first, does
    not hold the others back: they start first, it follows (taking their pages cached)."""
    from services.scheduler.core.groups import GROUP_QUIET_S, GROUP_SETTLE_S

    config = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16)
    rig = make_rig(config, num_pages=64, page_size=PAGE, manual_clock=True)
    await rig.scheduler.start()
    if gap == "quiet":
        gaps = []
    else:  # members keep coming, each within the quiet gap, until just before the bound
        gaps = [GROUP_QUIET_S / 2] * (round(GROUP_SETTLE_S / (GROUP_QUIET_S / 2)) - 1)
    ids = await submit_apart(rig, gaps)
    assert rig.toy.plans == []
    if gap == "quiet":
        rig.clock[0] += GROUP_QUIET_S
    else:  # the first came at 0
        rig.clock[0] = GROUP_SETTLE_S
    await until_planned(rig)
    late = f"m{len(ids)}"
    await rig.scheduler.submit(late, PROMPT, greedy(2), group_id="prog/select")
    ids.append(late)
    rig.clock[0] += GROUP_QUIET_S  # were the others done, it would wait as a group anew
    await rig.sink.wait(*ids)
    await rig.scheduler.stop()
    starts = new_seq_plans(rig, ids)
    assert len({steps[0] for r, steps in starts.items() if r != late}) == 1, starts
    assert starts[late][0] > starts[ids[0]][0], starts
    # the group's pages, cached, and the first token of the partial page after them copied
    assert rig.sink.first[late].num_cached_tokens == 4 * PAGE + 1
    assert rig.toy.corruptions == []
    for req_id in ids:
        assert rig.sink.tokens[req_id] == reference(PROMPT, 2)


@pytest.mark.parametrize("complete", [True, False])
async def test_a_group_that_said_its_size_waits_for_every_member_past_the_quiet_time(complete):
    """Members spread further apart than the quiet time and the settle bound (a loaded
    machine) still start in one step when the group said its size; an incomplete one
    starts GROUP_COMPLETE_S after its first member, its last member following."""
    from services.scheduler.core.groups import GROUP_COMPLETE_S, GROUP_SETTLE_S

    config = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16)
    rig = make_rig(config, num_pages=64, page_size=PAGE, manual_clock=True)
    await rig.scheduler.start()
    ids = [f"m{i}" for i in range(4)]
    for i, req_id in enumerate(ids[:3]):
        rig.clock[0] = i * GROUP_SETTLE_S  # each past the unsized group's whole wait
        await rig.scheduler.submit(req_id, PROMPT, greedy(2), group_id="g", group_size=4)
        await let_loop_run()
    assert rig.toy.plans == []  # three of four are in: it waits
    if complete:
        rig.clock[0] = 3 * GROUP_SETTLE_S
        await rig.scheduler.submit(ids[3], PROMPT, greedy(2), group_id="g", group_size=4)
    else:
        rig.clock[0] = GROUP_COMPLETE_S
        await until_planned(rig)
        await rig.scheduler.submit(ids[3], PROMPT, greedy(2), group_id="g", group_size=4)
        rig.clock[0] += GROUP_COMPLETE_S  # were the others done, it would wait anew
    await rig.sink.wait(*ids)
    await rig.scheduler.stop()
    starts = new_seq_plans(rig, ids)
    firsts = {r: steps[0] for r, steps in starts.items()}
    if complete:
        assert len(set(firsts.values())) == 1, starts  # no quiet time waited: it was whole
    else:
        assert len({firsts[r] for r in ids[:3]}) == 1 and firsts[ids[3]] > firsts[ids[0]], starts
    assert rig.toy.corruptions == []
    for req_id in ids:
        assert rig.sink.tokens[req_id] == reference(PROMPT, 2)


@pytest.mark.parametrize(
    ("group_id", "group_size", "needle"),
    [("", 2, "needs a group_id"), ("g", 5000, "group_size: must be in [1, 4096]")],
)
async def test_a_bad_group_size_is_refused_with_its_reason(group_id, group_size, needle):
    from radixmesh.errors import InvalidArgument

    rig = make_rig(SchedulerConfig(), num_pages=64, page_size=PAGE)
    await rig.scheduler.start()
    with pytest.raises(InvalidArgument, match=re.escape(needle)):
        await rig.scheduler.submit("r", PROMPT, greedy(2), group_id=group_id, group_size=group_size)
    await rig.scheduler.stop()


async def test_members_arriving_after_their_group_began_start_together_from_the_tree():
    """m0 starts alone; m1 and m2 come while it runs, so the prefix their submits matched is
    older than the tree by the time they are admitted (m0 committed the shared pages). They
    still start in one step, both taking those pages cached (none waits a step for the
    other's lease, whose pages it would only find cached)."""
    config = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16)
    rig = make_rig(config, num_pages=64, page_size=PAGE)
    rig.port.gate = asyncio.Event()
    await rig.scheduler.start()
    await rig.scheduler.submit("m0", PROMPT, greedy(1), group_id="prog/fork")
    async with asyncio.timeout(10):
        while not rig.port._plans:  # planned (its step held at the gate)
            await asyncio.sleep(0.001)
    for req_id in ("m1", "m2"):
        await rig.scheduler.submit(req_id, PROMPT, greedy(3), group_id="prog/fork")
    rig.port.gate.set()
    await rig.sink.wait("m0", "m1", "m2")
    await rig.scheduler.stop()
    starts = new_seq_plans(rig, ["m0", "m1", "m2"])
    assert starts["m1"][0] > starts["m0"][0]
    assert starts["m1"] == starts["m2"], starts
    # m0's 4 pages in place and the first token of its partial page (its tail) copied
    assert rig.sink.first["m1"].num_cached_tokens == rig.sink.first["m2"].num_cached_tokens == 4 * PAGE + 1
    assert rig.toy.corruptions == []
    for req_id in ("m1", "m2"):
        assert rig.sink.tokens[req_id] == reference(PROMPT, 3)


async def test_a_busy_executor_leaves_a_group_still_arriving_for_its_next_plan():
    """While a step runs, the plan built beside it leaves out a group whose members are
    still coming; the group then starts whole in one step, not its first member alone."""
    from services.scheduler.core.groups import GROUP_QUIET_S

    # one step per plan, so that the plans in flight are the two steps the gate holds
    config = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=16, decode_steps_per_plan=1)
    rig = make_rig(config, num_pages=64, page_size=PAGE, manual_clock=True)
    rig.port.gate = asyncio.Event()
    await rig.scheduler.start()
    await rig.scheduler.submit("busy", [90, 91, 92], greedy(12))

    async def until_plans(num_plans: int, num_run: int) -> None:
        async with asyncio.timeout(10):
            while len(rig.port._plans) < num_plans or rig.port.num_steps_run < num_run:
                await asyncio.sleep(0.001)

    await until_plans(2, 0)  # two steps in flight, both held
    await rig.scheduler.submit("m0", PROMPT, greedy(2), group_id="prog/fork")
    rig.port.gate.set()  # one step ends; the plan built then leaves m0 out
    rig.port.gate.clear()
    await until_plans(2, 1)
    rig.clock[0] += GROUP_QUIET_S / 2
    await rig.scheduler.submit("m1", PROMPT, greedy(2), group_id="prog/fork")
    rig.clock[0] += GROUP_QUIET_S
    rig.port.gate.set()
    await rig.sink.wait("busy", "m0", "m1")
    await rig.scheduler.stop()
    starts = new_seq_plans(rig, ["m0", "m1"])
    assert starts["m0"] == starts["m1"], starts
    assert starts["m0"][0] > 3  # not the plan built while m0 was the only one in
    # taken in that step: 4 pages in place, the 17th token copied from m0's 5th page
    assert rig.sink.first["m1"].num_cached_tokens == 4 * PAGE + 1
    assert rig.toy.corruptions == []
    for req_id in ("m0", "m1"):
        assert rig.sink.tokens[req_id] == reference(PROMPT, 2)


async def test_a_group_whose_first_chunk_would_stop_short_of_its_shared_pages_waits_a_step():
    """The step's budget left after an earlier request cannot hold the group's prompt: the
    group does not start with a cut first chunk (its other members would then wait for the
    rest of that prefill); it starts whole in the next step, computing the pages once."""
    config = SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=16)
    rig = make_rig(config, num_pages=64, page_size=PAGE)
    await rig.scheduler.start()
    await rig.scheduler.submit("first", list(range(40, 52)), greedy(1))  # 12 of the 24
    ids = ["g0", "g1"]
    for req_id in ids:
        await rig.scheduler.submit(req_id, PROMPT, greedy(2), group_id="prog/fork")
    await rig.sink.wait("first", *ids)
    await rig.scheduler.stop()
    starts = new_seq_plans(rig, ["first", *ids])
    assert starts["g0"] == starts["g1"], starts
    assert starts["g0"][0] > starts["first"][0]
    assert scheduled_prefill_tokens(rig, ids) == len(PROMPT) + (len(PROMPT) - 4 * PAGE - 1)
    assert rig.toy.corruptions == []
    for req_id in ids:
        assert rig.sink.tokens[req_id] == reference(PROMPT, 2)
