"""Queueing: priority classes, cached-prefix order, aging, the queue bound, deadlines, input."""

from __future__ import annotations

import pytest
from sched_fakes import greedy as g
from sched_fakes import make_rig, reference

from radixmesh.errors import InvalidArgument, ResourceExhausted
from radixmesh.sampling import Priority, SamplingParams
from services.scheduler.core import SchedulerConfig

ONE_AT_A_TIME = dict(max_num_batched_tokens=64, max_num_seqs=1)


async def _run_in_order(rig, submissions, also=()) -> list[str]:
    """Submit everything before the loop starts, then return the order requests ran in."""
    for req_id, prompt, priority in submissions:
        await rig.scheduler.submit(req_id, prompt, g(2), priority=priority)
    await rig.scheduler.start()
    await rig.sink.wait(*(s[0] for s in submissions), *also)
    await rig.scheduler.stop()
    return rig.sink.order


async def test_interactive_runs_before_batch_before_sheddable():
    rig = make_rig(SchedulerConfig(**ONE_AT_A_TIME, aging_rate=0.0), manual_clock=True)
    order = await _run_in_order(
        rig,
        [
            ("shed", [1, 2], Priority.SHEDDABLE),
            ("batch", [3, 4], Priority.BATCH),
            ("inter", [5, 6], Priority.INTERACTIVE),
        ],
    )
    assert order == ["inter", "batch", "shed"]


async def test_within_a_class_the_longest_cached_prefix_goes_first():
    rig = make_rig(SchedulerConfig(**ONE_AT_A_TIME, aging_rate=0.0))
    warm = list(range(1, 33))
    await rig.scheduler.start()
    await rig.scheduler.submit("warm", warm, g(1))
    await rig.sink.wait("warm")
    await rig.scheduler.submit("blocker", [99], g(30))
    await rig.sink.wait_tokens("blocker", 1)
    await rig.scheduler.submit("cold", list(range(60, 90)), g(2), priority=Priority.BATCH)
    await rig.scheduler.submit("hot", [*warm, 50], g(2), priority=Priority.BATCH)
    await rig.sink.wait("cold", "hot")
    await rig.scheduler.stop()
    assert rig.sink.order == ["warm", "blocker", "hot", "cold"]
    assert rig.sink.first["hot"].num_cached_tokens == 32


async def test_aging_lets_an_old_batch_request_overtake_new_interactive_work():
    for aging_rate, expected in ((0.0, ["inter", "batch"]), (0.2, ["batch", "inter"])):
        rig = make_rig(SchedulerConfig(**ONE_AT_A_TIME, aging_rate=aging_rate), manual_clock=True)
        await rig.scheduler.submit("batch", [1, 2], g(2), priority=Priority.BATCH)
        rig.clock[0] = 10.0  # the batch request has waited 10 s: 2 classes at 0.2/s
        order = await _run_in_order(rig, [("inter", [3, 4], Priority.INTERACTIVE)], ["batch"])
        assert order == expected, aging_rate


async def test_a_full_queue_refuses_and_sheds_sheddable_work_for_interactive():
    rig = make_rig(SchedulerConfig(max_queue_len=2))
    submit = rig.scheduler.submit
    await submit("s1", [1], g(1), priority=Priority.SHEDDABLE)
    await submit("b1", [2], g(1), priority=Priority.BATCH)
    with pytest.raises(ResourceExhausted, match="max_queue_len 2"):
        await submit("b2", [3], g(1), priority=Priority.BATCH)
    await submit("i1", [4], g(1), priority=Priority.INTERACTIVE)
    shed = rig.sink.finished["s1"]
    assert shed.error.code == "RESOURCE_EXHAUSTED" and "shed" in str(shed.error)
    with pytest.raises(ResourceExhausted):
        await submit("i2", [5], g(1), priority=Priority.INTERACTIVE)  # nothing left to shed
    await rig.scheduler.start()
    await rig.sink.wait("b1", "i1")
    await rig.scheduler.stop()
    assert rig.sink.tokens["i1"] == reference([4], 1)


async def test_priority_preemption_makes_room_for_interactive_work():
    rig = make_rig(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1, priority_preemption_gap=2)
    )
    await rig.scheduler.start()
    await rig.scheduler.submit("bulk", [1, 2, 3], g(60), priority=Priority.SHEDDABLE)
    await rig.sink.wait_tokens("bulk", 3)
    await rig.scheduler.submit("urgent", [4, 5, 6], g(3), priority=Priority.INTERACTIVE)
    await rig.sink.wait("urgent", "bulk")
    await rig.scheduler.stop()
    assert len(rig.sink.tokens["bulk"]) < 60 or rig.sink.order.index("urgent") > 0
    finish_order = list(rig.sink.finished)
    assert finish_order == ["urgent", "bulk"]
    assert rig.sink.tokens["bulk"] == reference([1, 2, 3], 60)
    assert rig.sink.tokens["urgent"] == reference([4, 5, 6], 3)
    assert any("bulk" in p.finished_req_ids for p in rig.toy.plans)


async def test_without_priority_preemption_interactive_work_waits():
    rig = make_rig(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1, priority_preemption_gap=None)
    )
    await rig.scheduler.start()
    await rig.scheduler.submit("bulk", [1, 2, 3], g(20), priority=Priority.SHEDDABLE)
    await rig.sink.wait_tokens("bulk", 3)
    await rig.scheduler.submit("urgent", [4, 5, 6], g(3), priority=Priority.INTERACTIVE)
    await rig.sink.wait("urgent", "bulk")
    await rig.scheduler.stop()
    assert list(rig.sink.finished) == ["bulk", "urgent"]


async def test_deadlines_end_queued_and_running_requests():
    rig = make_rig(SchedulerConfig(**ONE_AT_A_TIME), manual_clock=True)
    await rig.scheduler.start()
    await rig.scheduler.submit("runs", [1, 2], g(500), deadline=5.0)
    await rig.scheduler.submit("waits", [3, 4], g(2), deadline=5.0)
    await rig.scheduler.submit("free", [5, 6], g(2))
    await rig.sink.wait_tokens("runs", 3)
    assert "waits" not in rig.sink.finished
    rig.clock[0] = 6.0
    await rig.sink.wait("runs", "waits", "free")
    await rig.scheduler.stop()
    for req_id in ("runs", "waits"):
        assert rig.sink.finished[req_id].error.code == "DEADLINE_EXCEEDED"
    assert rig.sink.tokens["waits"] == []
    assert rig.sink.tokens["free"] == reference([5, 6], 2)
    assert rig.stats().num_leases == 0


async def test_max_tokens_past_the_executors_limit_is_refused_naming_it():
    """The executors serve 64 tokens (a KV pool smaller than the model's context lowers it):
    a prompt and max_tokens (or min_tokens) past that are refused, not cut short with
    "length"; a request without max_tokens runs to the limit and ends there."""
    rig = make_rig(max_model_len=64)
    await rig.scheduler.start()
    over = r"^sampling.max_tokens \(63\) plus the prompt's 2 tokens exceeds the model's limit of 64"
    with pytest.raises(InvalidArgument, match=over):
        await rig.scheduler.submit("over", [1, 2], g(63))
    at_least = SamplingParams(min_tokens=63, temperature=0.0)  # no max_tokens: to the limit
    with pytest.raises(InvalidArgument, match=r"^sampling.min_tokens \(63\) plus the prompt's 2"):
        await rig.scheduler.submit("over", [1, 2], at_least)
    await rig.scheduler.submit("fits", [1, 2], g(62))
    await rig.scheduler.submit("open", [3, 4], SamplingParams(temperature=0.0, ignore_eos=True))
    await rig.sink.wait("fits", "open")
    await rig.scheduler.stop()
    assert "over" not in rig.sink.finished
    assert rig.sink.tokens["fits"] == reference([1, 2], 62)
    assert rig.sink.tokens["open"] == reference([3, 4], 62)
    assert [rig.sink.finished[r].finish_reason for r in ("fits", "open")] == ["length", "length"]


@pytest.mark.parametrize(
    ("tokens", "field"),
    [([], "token_ids must not be empty"), ([1, -1], "non-negative"), ([1, 500], "vocabulary")],
)
async def test_bad_input_names_the_field(tokens, field):
    rig = make_rig()
    with pytest.raises(InvalidArgument, match=field):
        await rig.scheduler.submit("x", tokens, g(1))


async def test_duplicate_ids_and_over_long_prompts_are_refused():
    rig = make_rig(max_model_len=16)
    await rig.scheduler.submit("x", [1], g(1))
    with pytest.raises(InvalidArgument, match="already in use"):
        await rig.scheduler.submit("x", [1], g(1))
    with pytest.raises(InvalidArgument, match="limit is 15"):
        await rig.scheduler.submit("y", [1] * 16, g(1))
    with pytest.raises(InvalidArgument, match="req_id"):
        await rig.scheduler.submit("", [1], g(1))
