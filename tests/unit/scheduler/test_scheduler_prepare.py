"""Constraint preparation: a constrained request compiles on its executor before it is queued,
without holding up the step loop, and ends with the compiler's error if it fails."""

from __future__ import annotations

import asyncio

import pytest
from sched_fakes import greedy as g
from sched_fakes import make_rig, reference

from radixmesh.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted
from radixmesh.sampling import Constraint, ConstraintKind, Priority
from services.scheduler.core import RequestStatus, SchedulerConfig

DIGITS = Constraint(ConstraintKind.REGEX, "[0-9]+")


def sent_as_new(rig, req_id: str) -> bool:
    return any(new.req_id == req_id for plan in rig.toy.plans for new in plan.new_seqs)


async def test_a_preparing_request_does_not_hold_up_the_others():
    rig = make_rig(manual_clock=True)
    rig.port.prepare_gate = asyncio.Event()
    await rig.scheduler.start()
    constrained = await rig.scheduler.submit("c", [1, 2, 3], g(3), constraint=DIGITS)
    for i in range(3):
        await rig.scheduler.submit(f"u{i}", [4, 5 + i], g(4))
    await rig.sink.wait("u0", "u1", "u2")
    assert constrained.status is RequestStatus.PREPARING
    assert not sent_as_new(rig, "c") and "c" not in rig.sink.tokens
    assert rig.scheduler.executor_loads()[0].num_preparing == 1
    rig.clock[0] = 1.5
    rig.port.prepare_gate.set()
    await rig.sink.wait("c")
    assert rig.sink.tokens["c"] == reference([1, 2, 3], 3)
    assert rig.port.prepared == [DIGITS]
    (new,) = [n for plan in rig.toy.plans for n in plan.new_seqs if n.req_id == "c"]
    assert new.constraint == DIGITS
    assert rig.scheduler.stats.constraint_prepare.sum == pytest.approx(1.5)
    assert rig.scheduler.executor_loads()[0].num_preparing == 0
    await rig.scheduler.stop()


async def test_a_constraint_that_fails_to_compile_ends_the_request_with_its_reason():
    rig = make_rig()
    rig.port.bad_constraints = {"(": "constraint.regex: Regex parsing error: missing )"}
    before = rig.stats()
    await rig.scheduler.start()
    await rig.scheduler.submit(
        "bad", [1, 2, 3], g(3), constraint=Constraint(ConstraintKind.REGEX, "(")
    )
    await rig.scheduler.submit("good", [1, 2, 3], g(2))
    await rig.sink.wait("bad", "good")
    error = rig.sink.finished["bad"].error
    assert isinstance(error, InvalidArgument)
    assert str(error) == "constraint.regex: Regex parsing error: missing )"
    assert not sent_as_new(rig, "bad") and rig.sink.tokens["bad"] == []
    assert rig.sink.tokens["good"] == reference([1, 2, 3], 2)
    after = rig.stats()
    assert (after.num_leases, after.num_leased_pages) == (
        before.num_leases,
        before.num_leased_pages,
    )
    await rig.scheduler.stop()


async def test_abort_and_deadline_end_a_preparing_request():
    rig = make_rig(manual_clock=True)
    rig.port.prepare_gate = asyncio.Event()
    await rig.scheduler.start()
    await rig.scheduler.submit("cancelled", [1, 2], g(2), constraint=DIGITS)
    await rig.scheduler.submit("late", [1, 2], g(2), constraint=DIGITS, deadline=1.0)
    assert rig.scheduler.abort("cancelled")
    await rig.sink.wait("cancelled")
    rig.clock[0] = 2.0
    await rig.scheduler.submit("wake", [3], g(1))  # a turn of the loop after the clock moved
    await rig.sink.wait("late", "wake")
    assert rig.sink.finished["cancelled"].finish_reason == "abort"
    assert isinstance(rig.sink.finished["late"].error, DeadlineExceeded)
    assert rig.scheduler.executor_loads()[0].num_preparing == 0
    rig.port.prepare_gate.set()  # a compile that outlived its request must not queue it
    num_plans = len(rig.toy.plans)
    await rig.scheduler.submit("after", [4], g(2))  # full turns of the loop after the gate
    await rig.sink.wait("after")
    assert sent_as_new(rig, "after") and len(rig.toy.plans) >= num_plans + 2
    assert not sent_as_new(rig, "cancelled") and not sent_as_new(rig, "late")
    assert rig.port.prepared == []  # both compiles were cancelled, not run to their end
    assert rig.scheduler.executor_loads()[0].num_preparing == 0
    assert rig.scheduler.num_waiting() == dict.fromkeys(Priority, 0)
    await rig.scheduler.stop()


async def test_preparing_requests_count_against_the_queue_bound():
    rig = make_rig(SchedulerConfig(max_queue_len=2))
    rig.port.prepare_gate = asyncio.Event()
    await rig.scheduler.submit("c1", [1, 2], g(2), constraint=DIGITS)
    await rig.scheduler.submit("c2", [1, 2], g(2), constraint=DIGITS)
    with pytest.raises(ResourceExhausted, match="queue full"):
        await rig.scheduler.submit("c3", [1, 2], g(2))
    await rig.scheduler.stop()


async def test_a_request_preparing_on_an_executor_that_fails_is_prepared_again_elsewhere():
    rig = make_rig(num_executors=2)
    lost, other = rig.ports
    lost.gate, lost.prepare_gate, lost.fail_at_step = asyncio.Event(), asyncio.Event(), 1
    prefix = list(range(1, 17))
    lease = rig.cache.acquire(lost.info.executor_id, prefix, len(prefix), "test")
    rig.cache.commit(lease.lease_id, prefix)  # routing prefers the executor holding the prefix
    await rig.scheduler.start()
    await rig.scheduler.submit("u", [5, 6], g(2))
    constrained = await rig.scheduler.submit("c", [*prefix, 40, 41], g(3), constraint=DIGITS)
    assert constrained.executor_id == lost.info.executor_id
    assert constrained.status is RequestStatus.PREPARING
    lost.gate.set()  # its first step fails: the executor is gone
    await rig.sink.wait("u", "c")
    assert rig.sink.tokens["c"] == reference([*prefix, 40, 41], 3)
    assert rig.sink.tokens["u"] == reference([5, 6], 2)  # it had streamed nothing: moved
    assert (lost.prepared, other.prepared) == ([], [DIGITS])
    await rig.scheduler.stop()
