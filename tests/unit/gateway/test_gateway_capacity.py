"""The gateway's refusal on arrival from the scheduler's published headroom."""

from __future__ import annotations

import pytest

from gateway.core.capacity import CapacityGate, CapacityGateConfig
from radixmesh.capacity import ModelCapacity, capacity_from_proto, capacity_to_proto
from radixmesh.errors import InvalidArgument, ResourceExhausted
from radixmesh.retry_after import retry_after_of
from radixmesh.sampling import Priority
from radixmesh.v1 import scheduler_pb2

INT, BAT, SHED = Priority.INTERACTIVE, Priority.BATCH, Priority.SHEDDABLE


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def gate_with(*capacities: ModelCapacity) -> tuple[CapacityGate, FakeClock]:
    clock = FakeClock()
    gate = CapacityGate(CapacityGateConfig(max_age_s=1.0), clock)
    gate.update(capacities)
    return gate, clock


def test_a_burst_is_cut_at_the_published_headroom_with_a_retry_after():
    gate, _ = gate_with(ModelCapacity("m", 4.0, {INT: 3}))
    for _ in range(3):
        gate.admit("m", INT)
    with pytest.raises(ResourceExhausted) as info:
        gate.admit("m", INT)
    message = str(info.value)
    assert "admits no more interactive requests" in message
    assert retry_after_of(message) == 1  # one request over, at 4 requests/s


def test_a_request_uses_up_its_own_class_and_every_lower_one():
    gate, _ = gate_with(ModelCapacity("m", 2.0, {INT: 10, BAT: 4, SHED: 1}))
    gate.admit("m", INT, num_requests=3)  # queued ahead of batch and sheddable work too
    with pytest.raises(ResourceExhausted):
        gate.admit("m", SHED)
    gate.admit("m", BAT)  # 3 + 1 of the batch class's 4
    with pytest.raises(ResourceExhausted):
        gate.admit("m", BAT)
    gate.admit("m", INT, num_requests=6)  # sheddable and batch sends leave interactive alone
    with pytest.raises(ResourceExhausted) as info:
        gate.admit("m", INT, num_requests=2)  # n choices need room for all of them
    assert retry_after_of(str(info.value)) == 1


def test_the_retry_after_is_the_deficit_over_the_rate():
    gate, _ = gate_with(ModelCapacity("m", 0.5, {INT: 0}))
    with pytest.raises(ResourceExhausted) as info:
        gate.admit("m", INT, num_requests=4)
    assert retry_after_of(str(info.value)) == 8


def test_a_new_reading_starts_the_counts_over():
    gate, _ = gate_with(ModelCapacity("m", 1.0, {INT: 1}))
    gate.admit("m", INT)
    with pytest.raises(ResourceExhausted):
        gate.admit("m", INT)
    gate.update([ModelCapacity("m", 1.0, {INT: 2})])
    gate.admit("m", INT)
    gate.admit("m", INT)
    with pytest.raises(ResourceExhausted):
        gate.admit("m", INT)


def test_without_a_fresh_reading_the_scheduler_decides():
    gate, clock = gate_with(ModelCapacity("m", 1.0, {INT: 0}))
    gate.admit("other-model", INT)  # a model it did not publish
    gate.admit("m", SHED)  # a class it did not bound
    with pytest.raises(ResourceExhausted):
        gate.admit("m", INT)
    clock.now += 1.5  # the reading is stale: let through
    gate.admit("m", INT)
    assert gate.requests_per_s("m") is None
    clock.now -= 1.5
    assert gate.requests_per_s("m") == 1.0
    gate.clear()  # the scheduler could not be read
    gate.admit("m", INT)
    assert gate.requests_per_s() is None


def test_the_rate_of_every_model_together():
    gate, _ = gate_with(ModelCapacity("a", 3.0), ModelCapacity("b", None), ModelCapacity("c", 1.5))
    assert gate.requests_per_s() == 4.5
    assert gate.requests_per_s("b") is None


def test_the_published_capacity_crosses_the_wire():
    capacity = ModelCapacity("tiny", 12.5, {INT: 7, SHED: 0})
    msg = scheduler_pb2.GetLoadResponse()
    capacity_to_proto(capacity, msg.capacity.add())
    parsed = capacity_from_proto(scheduler_pb2.GetLoadResponse.FromString(msg.SerializeToString()).capacity[0])
    assert parsed == capacity
    unmeasured = scheduler_pb2.ModelCapacity(model="tiny", headroom={"future_class": 3})
    assert capacity_from_proto(unmeasured) == ModelCapacity("tiny", None, {})


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_a_bad_max_age_names_the_field(bad):
    with pytest.raises(InvalidArgument, match="max_age_s"):
        CapacityGateConfig(max_age_s=bad)


def test_adaptive_rate_limit_flags_build_a_bucket_fed_by_the_gate():
    from gateway.core.ratelimit import AdaptiveRateConfig, LocalRateLimiter
    from gateway.main import _admission, build_parser

    flags = [*args_list(), "--rate-limit-per-s", "2", "--rate-limit-share", "0.5"]
    args = build_parser().parse_args(flags)
    gate, _ = gate_with(ModelCapacity("m", 40.0))
    admission, redis_client = _admission(args, gate)
    assert redis_client is None and isinstance(admission.limiter, LocalRateLimiter)
    source = admission.limiter._source
    assert source.config == AdaptiveRateConfig(share=0.5, floor_per_s=2.0)
    assert source._compute().refill_per_s == 20.0  # half of the gate's 40 requests/s
    with pytest.raises(InvalidArgument, match=r"rate_limit\.share"):
        _admission(build_parser().parse_args([*args_list(), "--rate-limit-share", "0"]), gate)


def args_list() -> list[str]:
    return ["--model", "m", "--scheduler-address", "x:1", "--rate-limit", "adaptive"]
