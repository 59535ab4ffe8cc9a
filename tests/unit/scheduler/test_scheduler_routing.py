"""Routing across executors, and what happens when one dies."""

from __future__ import annotations

import pytest
from sched_fakes import greedy as g
from sched_fakes import make_rig, reference

from radixmesh.errors import Unavailable
from radixmesh.sampling import Priority
from services.scheduler.core import SchedulerConfig
from services.scheduler.core.routing import choose_executor


def _plans_of(rig, i: int) -> set[str]:
    return {s.req_id for p in rig.toys[i].plans for s in p.new_seqs}


def test_choose_executor_weighs_the_cached_prefix_against_load():
    loads = {"a": 0, "b": 50}
    assert choose_executor(100, loads, {}) == "a"
    assert choose_executor(100, loads, {"b": 96}) == "b"  # 50 + 4 < 0 + 100
    assert choose_executor(100, loads, {"b": 40}) == "a"  # 50 + 60 > 100


async def test_requests_go_to_an_executor_serving_their_model():
    rig = make_rig(num_executors=2, models=["alpha", "beta"])
    await rig.scheduler.start()
    await rig.scheduler.submit("b", [1, 2], g(2), model="beta")
    await rig.scheduler.submit("a", [1, 2], g(2), model="alpha")
    await rig.scheduler.submit("default", [3], g(2))
    with pytest.raises(Unavailable, match="gamma"):
        await rig.scheduler.submit("g", [1], g(1), model="gamma")
    await rig.sink.wait("a", "b", "default")
    await rig.scheduler.stop()
    assert _plans_of(rig, 0) == {"a", "default"}
    assert _plans_of(rig, 1) == {"b"}


async def test_a_cached_prefix_draws_a_request_to_its_executor():
    rig = make_rig(num_executors=2)
    shared = list(range(1, 41))
    await rig.scheduler.start()
    await rig.scheduler.submit("first", [77] * 8, g(1))
    await rig.scheduler.submit("second", shared, g(1))  # executor 0 is busy: goes to 1
    await rig.sink.wait("first", "second")
    await rig.scheduler.submit("follow", [*shared, 5, 6], g(3))
    await rig.sink.wait("follow")
    await rig.scheduler.stop()
    assert "second" in _plans_of(rig, 1)
    assert "follow" in _plans_of(rig, 1)
    assert rig.sink.first["follow"].num_cached_tokens == 40
    assert rig.sink.tokens["follow"] == reference([*shared, 5, 6], 3)


async def test_load_spreads_requests_over_executors():
    rig = make_rig(num_executors=2)
    await rig.scheduler.start()
    for i in range(6):
        await rig.scheduler.submit(f"r{i}", [i + 1] * 10, g(4))
    await rig.sink.wait(*(f"r{i}" for i in range(6)))
    await rig.scheduler.stop()
    assert len(_plans_of(rig, 0)) == len(_plans_of(rig, 1)) == 3


async def test_requests_that_streamed_nothing_move_off_a_dead_executor():
    rig = make_rig(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8), num_executors=2)
    rig.ports[0].fail_at_step = 1  # dies on its very first step
    await rig.scheduler.submit("a", [1, 2, 3], g(5))
    await rig.scheduler.submit("b", [4, 5, 6], g(5))
    await rig.scheduler.submit("c", [7, 8, 9], g(5))
    await rig.scheduler.start()
    await rig.sink.wait("a", "b", "c")
    await rig.scheduler.stop()
    for req_id, prompt in (("a", [1, 2, 3]), ("b", [4, 5, 6]), ("c", [7, 8, 9])):
        assert rig.sink.tokens[req_id] == reference(prompt, 5)
    assert rig.ports[0].closed
    assert rig.stats(0).num_leases == rig.stats(1).num_leases == 0
    loads = {x.executor_id: x.healthy for x in rig.scheduler.executor_loads()}
    assert loads == {rig.ports[0].info.executor_id: False, rig.ports[1].info.executor_id: True}


async def test_requests_that_streamed_end_unavailable_when_their_executor_dies():
    rig = make_rig()
    rig.port.fail_at_step = 4
    await rig.scheduler.start()
    await rig.scheduler.submit("a", [1, 2, 3], g(50))
    await rig.sink.wait("a")
    err = rig.sink.finished["a"].error
    assert isinstance(err, Unavailable) and "toy executor lost" in str(err)
    assert 1 <= len(rig.sink.tokens["a"]) < 50
    assert rig.stats().num_leases == 0
    with pytest.raises(Unavailable):
        await rig.scheduler.submit("b", [1], g(1))
    await rig.scheduler.stop()


async def test_load_report_counts_waiting_requests_per_class():
    rig = make_rig()
    await rig.scheduler.submit("i", [1], g(1), priority=Priority.INTERACTIVE)
    await rig.scheduler.submit("s1", [1], g(1), priority=Priority.SHEDDABLE)
    await rig.scheduler.submit("s2", [1], g(1), priority=Priority.SHEDDABLE)
    assert rig.scheduler.num_waiting() == {
        Priority.INTERACTIVE: 1,
        Priority.BATCH: 0,
        Priority.SHEDDABLE: 2,
        Priority.SPECULATIVE: 0,
    }
    assert rig.scheduler.executor_loads()[0].num_waiting == 3


async def test_an_admitted_request_is_not_routed_where_its_wait_is_over_the_bound():
    """Admission takes the best executor's estimated wait; routing then weighs load and
    cached prefixes among the executors whose wait is within the bound, not all of them
    (the cached prefix alone would draw `follow` to executor 1, as in the test above)."""
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_queue_wait_s=5.0)
    rig = make_rig(config, num_executors=2)
    shared = list(range(1, 41))
    await rig.scheduler.start()
    await rig.scheduler.submit("first", [77] * 8, g(1))
    await rig.scheduler.submit("second", shared, g(1))  # executor 0 is busy: goes to 1
    await rig.sink.wait("first", "second")
    assert "second" in _plans_of(rig, 1)
    # executor 1's queue would keep a new request a minute, executor 0's a second
    waits = {rig.ports[0].info.executor_id: 1.0, rig.ports[1].info.executor_id: 60.0}
    rig.scheduler._queue_waits.estimate_s = lambda ex, *args, **kwargs: waits[ex.executor_id]
    await rig.scheduler.submit("follow", [*shared, 5, 6], g(3))
    await rig.sink.wait("follow")
    await rig.scheduler.stop()
    assert "follow" in _plans_of(rig, 0)
    assert rig.sink.tokens["follow"] == reference([*shared, 5, 6], 3)
