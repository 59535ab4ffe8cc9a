"""Admission by estimated queue wait: the estimator, the bounds per class, and the core."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest
from sched_fakes import MessageCache, greedy, make_rig, reference, run_checked

from radixmesh.capacity import capacity_from_proto, capacity_to_proto
from radixmesh.errors import InvalidArgument, ResourceExhausted
from radixmesh.retry_after import retry_after_of, with_retry_after
from radixmesh.sampling import Constraint, ConstraintKind, Priority
from radixmesh.v1 import scheduler_pb2
from services.scheduler.core import SchedulerConfig
from services.scheduler.core.queue_wait import (
    MAX_HEADROOM,
    QueueWaitConfig,
    Rate,
    Throughput,
    check_wait,
    estimate_wait_s,
    num_ahead_past_capacity,
    num_within,
    wait_allowed,
    work_past_capacity,
)


def test_throughput_is_unknown_until_enough_requests_finished_then_per_window():
    throughput = Throughput(QueueWaitConfig(window_s=10, min_finished=4))
    # a run older than the window (its first request arrived at -20): read over the window
    throughput.note_finished(1.0, work=4, arrival_time=-20.0, count=3)
    assert throughput.rate(2.0) is None
    throughput.note_finished(2.0, work=4, arrival_time=-20.0, count=17)
    assert throughput.rate(2.0) == Rate(2.0, 8.0)  # 20 requests of work 4 in the last 10 s
    assert throughput.rate(11.5) == Rate(1.7, 6.8)  # the first three left the window
    assert throughput.rate(30.0) is None  # nothing finished lately: not judged


def test_the_wait_counts_the_work_ahead_and_its_own():
    assert estimate_wait_s(0.0, 400, None) == 0.0  # nothing past the batch: no wait
    assert estimate_wait_s(90.0, 10, 20.0) == 5.0  # (90 ahead + its own 10) / 20 per second
    assert estimate_wait_s(30.0, 10, None) is None
    assert math.isinf(estimate_wait_s(1.0, 1, 0.0))


@pytest.mark.parametrize(
    ("priority", "refused"),
    [(Priority.INTERACTIVE, False), (Priority.BATCH, True), (Priority.SHEDDABLE, True)],
)
def test_sheddable_is_refused_first_interactive_last(priority, refused):
    config = QueueWaitConfig(max_queue_wait_s=20)
    if refused:
        with pytest.raises(ResourceExhausted) as info:
            check_wait(config, priority, [12.0, 15.0], now=0.0, deadline=None)
        assert "estimated queue wait 12.0s exceeds" in str(info.value)
        assert retry_after_of(str(info.value)) >= 1
    else:
        assert check_wait(config, priority, [12.0, 15.0], now=0.0, deadline=None) == 12.0


def test_a_deadline_shorter_than_the_wait_is_refused_at_once():
    with pytest.raises(ResourceExhausted, match="passes the request's deadline"):
        check_wait(QueueWaitConfig(None), Priority.INTERACTIVE, [8.0], now=100.0, deadline=105.0)


def test_only_measured_executors_are_judged():
    config = QueueWaitConfig(max_queue_wait_s=1)
    assert check_wait(config, Priority.SHEDDABLE, [None, None], 0.0, None) is None
    with pytest.raises(ResourceExhausted):  # a queue that finished nothing lately is no escape
        check_wait(config, Priority.SHEDDABLE, [None, 50.0], 0.0, None)
    assert check_wait(config, Priority.SHEDDABLE, [None, 0.0], 0.0, None) == 0.0


def test_retry_after_travels_in_the_message():
    message = with_retry_after("overloaded", 7)
    assert message == "overloaded; retry after 7 s" and retry_after_of(message) == 7
    assert retry_after_of("overloaded") is None


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_bounds_name_the_field(bad):
    with pytest.raises(InvalidArgument, match="max_queue_wait_s"):
        SchedulerConfig(max_queue_wait_s=bad)


async def test_an_overloaded_scheduler_refuses_at_once_and_loses_nothing_it_accepted():
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=2, max_queue_wait_s=4.0)
    rig = make_rig(config, manual_clock=True)
    rig.port.step_seconds = 0.25  # each step advances the scheduler's clock
    await rig.scheduler.start()
    for i in range(6):  # measure: six short requests finish
        await rig.scheduler.submit(f"warm{i}", [i + 1, 2], greedy(2))
    await rig.sink.wait(*(f"warm{i}" for i in range(6)))
    rig.port.gate = asyncio.Event()  # hold the executor: the queue builds up
    accepted, refused = [], []
    for i in range(40):
        try:
            await rig.scheduler.submit(f"r{i}", [i + 1, 3], greedy(4))
            accepted.append(f"r{i}")
        except ResourceExhausted as exc:
            refused.append(str(exc))
    assert accepted and refused
    assert all("estimated queue wait" in m and retry_after_of(m) for m in refused)
    wait = rig.scheduler.estimated_queue_wait_s()
    assert wait is not None and wait <= 4.0 + 1 / 1.0  # admitted up to about the bound
    rig.port.gate.set()
    await rig.sink.wait(*accepted, timeout=30)
    await rig.scheduler.stop()
    assert all(rig.sink.finished[r].error is None for r in accepted)
    assert all(len(rig.sink.tokens[r]) == 4 for r in accepted)


def test_a_wait_is_allowed_within_the_bound_and_before_the_deadline():
    assert wait_allowed(4.0, 5.0, now=100.0, deadline=None)
    assert not wait_allowed(6.0, 5.0, now=100.0, deadline=None)
    assert wait_allowed(6.0, None, now=100.0, deadline=None)  # no bound
    assert not wait_allowed(4.0, 5.0, now=100.0, deadline=103.0)  # starts past its deadline
    assert wait_allowed(2.0, 5.0, now=100.0, deadline=103.0)
    assert wait_allowed(0.0, 5.0, now=100.0, deadline=100.5)  # starts at once


def test_only_what_overflows_the_batch_waits():
    # 64 queued on an idle executor that runs 256 at once: all start at the next step
    assert num_ahead_past_capacity(64, 0, 256) == 0
    assert num_ahead_past_capacity(199, 56, 256) == 0  # the new one takes the last slot
    # every slot is taken by those ahead: one of them must finish first
    assert num_ahead_past_capacity(200, 56, 256) == 1
    # the batch is full: everything queued ahead waits, then the new one's own slot
    assert num_ahead_past_capacity(10, 256, 256) == 11
    assert num_ahead_past_capacity(10, 250, 256) == 5
    # in work: those past the batch, each at the mean work of all ahead
    assert work_past_capacity(199, 56, 256, 255 * 400) == 0.0
    assert work_past_capacity(10, 250, 256, 250 * 8 + 10 * 320) == 5 * 20.0  # mean 20


async def test_a_burst_within_the_batch_is_admitted_after_the_rate_is_known():
    """An offline burst the batch holds is never refused on a queue-wait estimate, however
    slow the measured rate (requests start together, they do not queue behind each other)."""
    config = SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=64, max_queue_wait_s=1.0)
    rig = make_rig(config, manual_clock=True, num_pages=128)  # the pool holds the 64 slots
    rig.port.step_seconds = 0.5
    await rig.scheduler.start()
    for i in range(8):  # a slow rate: eight requests of four steps each
        await rig.scheduler.submit(f"warm{i}", [i + 1, 2], greedy(4))
    await rig.sink.wait(*(f"warm{i}" for i in range(8)))
    rig.port.gate = asyncio.Event()  # hold the executor: the burst queues up
    burst = [f"b{i}" for i in range(64)]
    for i, req_id in enumerate(burst):
        if i == 63:  # the last slot: a request arriving now starts at the next step
            assert rig.scheduler.estimated_queue_wait_s() == 0.0
        await rig.scheduler.submit(req_id, [i + 1, 3], greedy(2))
    # every slot is taken now: the next waits for one of the burst to finish
    assert rig.scheduler.estimated_queue_wait_s() > 0.0
    with pytest.raises(ResourceExhausted, match="estimated queue wait"):
        for i in range(64, 200):  # past the batch, the estimate counts again
            await rig.scheduler.submit(f"b{i}", [i + 1, 3], greedy(2))
    rig.port.gate.set()
    await rig.sink.wait(*burst, timeout=30)
    await rig.scheduler.stop()
    assert all(rig.sink.finished[r].error is None for r in burst)


async def _burst(
    rig, num: int, prompt_len: int, max_tokens: int, group_id: str = ""
) -> tuple[list[str], int]:
    """`num` requests submitted together (each waits for its prefix match before it is
    queued, as over gRPC; `group_id`: all of one named group); the ids accepted, and how
    many were refused for their wait."""
    outcomes = await asyncio.gather(
        *(
            rig.scheduler.submit(
                f"b{i}",
                [i + 1, *range(2, prompt_len + 1)],
                greedy(max_tokens),
                group_id=group_id,
                group_size=num if group_id else 0,
            )
            for i in range(num)
        ),
        return_exceptions=True,
    )
    accepted = [f"b{i}" for i, o in enumerate(outcomes) if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, ResourceExhausted)]
    assert all("estimated queue wait" in str(o) for o in refused)
    assert len(accepted) + len(refused) == num, outcomes
    return accepted, len(refused)


async def _measured(rig) -> None:
    """Start the rig and measure a rate: six short requests finish."""
    rig.port.step_seconds = 0.25
    await rig.scheduler.start()
    for i in range(6):
        await rig.scheduler.submit(f"warm{i}", [i + 1, 2], greedy(2))
    await rig.sink.wait(*(f"warm{i}" for i in range(6)))


async def _finish_exact(rig, accepted: list[str], prompt_len: int, max_tokens: int) -> None:
    rig.port.gate.set()
    await rig.sink.wait(*accepted, timeout=60)
    await rig.scheduler.stop()
    for req_id in accepted:
        prompt = [int(req_id[1:]) + 1, *range(2, prompt_len + 1)]
        assert rig.sink.finished[req_id].error is None, req_id
        assert rig.sink.tokens[req_id] == reference(prompt, max_tokens), req_id


async def _busy_rig():
    """A measured rig whose executor runs one request of 8 pages (its pool holds 8 of
    them) and is held between two steps, with the cache's answers as messages."""
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=64, max_queue_wait_s=4.0)
    rig = make_rig(config, manual_clock=True, num_pages=64, cache_port=MessageCache)
    await _measured(rig)
    await rig.scheduler.submit("first", [9, 8], greedy(30))
    await rig.sink.wait_tokens("first", 1)
    rig.port.gate = asyncio.Event()  # hold the executor: the burst lands between two steps
    return rig


async def test_a_burst_in_its_prefix_matches_is_refused_past_the_batch():
    """Every submit of a burst passes its first check before the first of them is queued
    (each waits for its match): the check in the turn that queues it sees those ahead."""
    rig = await _busy_rig()
    accepted, num_refused = await _burst(rig, 40, prompt_len=2, max_tokens=30)
    assert num_refused > 0
    assert len(accepted) <= 8 + 4  # the pool's batch, and the few the bound lets wait
    await _finish_exact(rig, accepted, prompt_len=2, max_tokens=30)


@pytest.mark.parametrize("grouped", [False, True])
async def test_a_group_is_admitted_or_refused_as_a_whole(grouped: bool):
    """The members of a named group (a select's choices, a fork's branches) that arrive
    after one of them was accepted are not checked again: the group was admitted at that
    member. The same burst without a group is refused past the pool's batch."""
    rig = await _busy_rig()
    group = "run/fork/0" if grouped else ""
    accepted, num_refused = await _burst(rig, 16, prompt_len=2, max_tokens=30, group_id=group)
    if grouped:
        assert num_refused == 0 and len(accepted) == 16
    else:
        assert num_refused > 0
    await _finish_exact(rig, accepted, prompt_len=2, max_tokens=30)


async def test_a_burst_on_an_idle_executor_counts_on_its_pool_not_its_slots():
    """Submits queued on an idle executor before its step loop turns: its next batch is
    as many of them as the pool holds (8 of 8 pages), not its 64 slots."""
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=64, max_queue_wait_s=4.0)
    rig = make_rig(config, manual_clock=True, num_pages=64)
    await _measured(rig)
    rig.port.gate = asyncio.Event()
    accepted, num_refused = [], 0
    for i in range(40):  # the cache answers at once: the step loop does not turn meanwhile
        try:
            await rig.scheduler.submit(f"b{i}", [i + 1, 2], greedy(30))
            accepted.append(f"b{i}")
        except ResourceExhausted as exc:
            assert "estimated queue wait" in str(exc)
            num_refused += 1
    assert not rig.scheduler._executors[rig.port.info.executor_id].running
    assert num_refused > 0
    assert len(accepted) <= 8 + 4  # the pool's batch, and the few the bound lets wait
    await _finish_exact(rig, accepted, prompt_len=2, max_tokens=30)


async def test_a_burst_on_an_idle_executor_is_refused_past_its_pool():
    """The chaos test's overload, in one turn: a burst on an idle executor, every submit
    in its prefix match at once. What is accepted completes, exactly."""
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=64, max_queue_wait_s=4.0)
    rig = make_rig(config, manual_clock=True, num_pages=64, cache_port=MessageCache)
    await _measured(rig)
    rig.port.gate = asyncio.Event()
    accepted, num_refused = await _burst(rig, 40, prompt_len=2, max_tokens=30)
    assert num_refused > 0
    assert len(accepted) <= 8 + 4
    await _finish_exact(rig, accepted, prompt_len=2, max_tokens=30)


async def test_requests_whose_constraint_compiles_count_as_queued():
    """A constrained request waits for its grammar in `preparing`, not in the queue: those
    accepted meanwhile are ahead of the next request all the same."""
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=64, max_queue_wait_s=4.0)
    rig = make_rig(config, manual_clock=True, num_pages=64)
    await _measured(rig)
    rig.port.gate, rig.port.prepare_gate = asyncio.Event(), asyncio.Event()
    digits = Constraint(ConstraintKind.REGEX, "[0-9]+")
    accepted, num_refused = [], 0
    for i in range(40):
        try:
            await rig.scheduler.submit(f"b{i}", [i + 1, 2], greedy(30), constraint=digits)
            accepted.append(f"b{i}")
        except ResourceExhausted as exc:
            assert "estimated queue wait" in str(exc)
            num_refused += 1
    assert num_refused > 0
    assert len(accepted) <= 8 + 4
    rig.port.prepare_gate.set()
    await _finish_exact(rig, accepted, prompt_len=2, max_tokens=30)


def test_num_within_is_the_edge_of_the_bound():
    assert num_within(lambda n: (n + 1) / 2.0, 30.0) == 60  # (59 + 1) / 2 = 30 s exactly
    assert num_within(lambda n: float(n * n), 50.0) == 8  # 7 * 7 within, 8 * 8 over
    assert num_within(lambda n: 5.0, 1.0) == 0  # not even the first
    assert num_within(lambda n: 0.0, 1.0) == MAX_HEADROOM  # never over: the wire's most


async def test_the_published_headroom_is_what_the_scheduler_admits():
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=2, max_queue_wait_s=4.0)
    rig = make_rig(config, manual_clock=True)
    rig.port.step_seconds = 0.25
    await rig.scheduler.start()
    [unmeasured] = rig.scheduler.capacity()
    assert unmeasured.requests_per_s is None and unmeasured.headroom == {}  # an open door
    for i in range(6):  # requests of the same work as those that follow
        await rig.scheduler.submit(f"warm{i}", [i + 1, 2], greedy(4))
    await rig.sink.wait(*(f"warm{i}" for i in range(6)))
    rig.port.gate = asyncio.Event()  # hold the executor: the queue builds up
    [capacity] = rig.scheduler.capacity()
    assert capacity.requests_per_s is not None and capacity.requests_per_s > 0
    headroom = capacity.headroom
    assert headroom[Priority.INTERACTIVE] > headroom[Priority.BATCH] > 0
    assert headroom[Priority.BATCH] >= headroom[Priority.SHEDDABLE]
    for i in range(headroom[Priority.INTERACTIVE]):
        await rig.scheduler.submit(f"r{i}", [i + 1, 3], greedy(4))
    with pytest.raises(ResourceExhausted, match="estimated queue wait"):
        await rig.scheduler.submit("one-more", [1, 3], greedy(4))
    [full] = rig.scheduler.capacity()
    assert full.headroom[Priority.INTERACTIVE] == 0
    rig.port.gate.set()
    await rig.scheduler.stop()


async def test_an_idle_executors_headroom_counts_the_pool_not_the_slots():
    """After short requests, an idle executor's headroom is what its pool holds of their
    size plus the wait bound's share, not its 256 slots: a burst that lands on it is cut
    at the gateway near where the scheduler cuts it."""
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=256, max_queue_wait_s=4.0)
    rig = make_rig(config, manual_clock=True, num_pages=16)
    rig.port.step_seconds = 0.25
    await rig.scheduler.start()
    for i in range(6):  # each finishes holding one page
        await rig.scheduler.submit(f"warm{i}", [i + 1, 2], greedy(2))
    await rig.sink.wait(*(f"warm{i}" for i in range(6)))
    [capacity] = rig.scheduler.capacity()
    rate = capacity.requests_per_s
    assert rate is not None
    room = capacity.headroom[Priority.INTERACTIVE]
    within = math.floor(4.0 * rate)  # past the batch, requests like those it finished
    assert within < room <= 16 + within  # not 256
    await rig.scheduler.stop()


async def test_the_batch_capacity_kept_per_step_equals_the_walk(monkeypatch):
    from services.scheduler.core import queue_wait

    walk = queue_wait.batch_capacity
    num_walks = 0

    def counted(ex, max_num_seqs, num_held_pages=0):
        nonlocal num_walks
        num_walks += 1
        return walk(ex, max_num_seqs, num_held_pages)

    monkeypatch.setattr(queue_wait, "batch_capacity", counted)
    config = SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=8)
    rig = make_rig(config, num_pages=24)  # tight: requests grow, finish, get preempted
    waits = rig.scheduler._queue_waits
    (ex,) = rig.scheduler._executors.values()
    seen, cached = [], 0

    def compare() -> None:
        nonlocal cached
        value = waits.batch_capacity(ex)
        before = num_walks
        assert waits.batch_capacity(ex) == value == walk(ex, 8)  # the state it was kept in
        cached += num_walks == before
        seen.append(value)

    await run_checked(rig, compare)
    assert len(set(seen)) > 2  # the figure moved with the running set and its pages
    assert cached == len(seen)  # the second ask of each state walked nothing


def test_the_queue_order_is_the_rank_order_and_its_counts_follow_push_and_remove():
    import random

    from services.scheduler.core import SchedulerConfig as Config
    from services.scheduler.core.queue import WaitQueue
    from services.scheduler.core.request import Request

    rng = random.Random(7)
    queue = WaitQueue(Config(aging_rate=0.05, prefix_weight=0.5))
    classes = list(Priority)
    requests = []
    for i in range(200):
        prompt = [rng.randrange(1, 500) for _ in range(rng.randrange(2, 40))]
        req = Request(f"r{i}", prompt, greedy(4), arrival_time=rng.uniform(0, 100))
        req.group_id = f"g{i % 3}" if i % 5 == 0 else None
        req.priority = rng.choice(classes)
        req.match_tokens = rng.randrange(0, len(prompt))
        requests.append(req)
        queue.push(req)
    for req in requests[::3]:
        queue.remove(req.req_id)
    queue.push(requests[1])  # pushed again: counted once
    left = [r for r in requests if r.req_id in queue]

    def rank(r: Request, now: float) -> float:  # the module's rule, written out
        cached = min(1.0, r.match_tokens / max(1, len(r.prompt_token_ids)))
        aged = 0.0 if r.priority is Priority.SPECULATIVE else 0.05 * max(0.0, now - r.arrival_time)
        return float(r.priority) - aged - 0.5 * cached

    def check_order() -> None:
        for now in (100.0, 250.0, 1e4):  # kept on the time-free part: the rank's order
            expected = sorted(
                left,
                key=lambda r: (r.priority is Priority.SPECULATIVE, rank(r, now), r.arrival_time),
            )
            assert [r.req_id for r in queue.ranked()] == [r.req_id for r in expected]
            assert queue.head() is expected[0]
            assert all(queue.rank(r, now) == pytest.approx(rank(r, now)) for r in left)

    check_order()
    for req in left[::4]:  # a queued request's cached prefix grows (a leader's checkpoint)
        req.match_tokens = len(req.prompt_token_ids)
        queue.rekey(req)
    queue.rekey(requests[0])  # not queued: nothing
    assert requests[0].req_id not in queue
    check_order()
    assert queue.count_by_priority() == {p: sum(r.priority is p for r in left) for p in Priority}
    assert queue.num_grouped == sum(r.group_id is not None for r in left) > 0


async def test_the_published_context_is_the_least_its_live_executors_serve():
    """Each executor serves at most what its KV pool holds; the model's published context
    is the least over its live executors, and a request past it is refused at submit."""
    rig = make_rig(num_executors=2, max_model_len=96)
    await rig.scheduler.start()
    [capacity] = rig.scheduler.capacity()
    assert capacity.max_model_len == 96
    small = next(iter(rig.scheduler._executors.values()))
    small.info = dataclasses.replace(small.info, max_model_len=40)
    [capacity] = rig.scheduler.capacity()
    assert capacity.max_model_len == 40
    assert capacity_from_proto(published(capacity)).max_model_len == 40
    with pytest.raises(InvalidArgument, match="limit of 40 tokens"):
        await rig.scheduler.submit("r", [1, 2], greedy(39))
    await rig.scheduler.stop()


def published(capacity):
    out = scheduler_pb2.ModelCapacity()
    capacity_to_proto(capacity, out)
    return out
