"""Routing around executors whose GPU reports trouble (hot, or saturated with a queue)."""

from __future__ import annotations

import pytest
from sched_fakes import greedy as g
from sched_fakes import make_rig, reference

from radixmesh.errors import InvalidArgument
from radixmesh.sampling import SamplingParams
from radixmesh.step import DeviceHealth
from radixmesh.v1 import executor_pb2
from radixmesh.wire import result_from_proto
from services.scheduler.core import Request, SchedulerConfig
from services.scheduler.core.executor_state import ExecutorState
from services.scheduler.core.routing import choose_executor, device_trouble, executors_in_trouble

CONFIG = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16)
HOT = DeviceHealth(utilization_ratio=0.3, temperature_celsius=91.0)
BUSY = DeviceHealth(utilization_ratio=0.99, temperature_celsius=70.0)
FINE = DeviceHealth(utilization_ratio=0.6, temperature_celsius=70.0)


def _plans_of(rig, i: int) -> set[str]:
    return {s.req_id for p in rig.toys[i].plans for s in p.new_seqs}


def report_health(port, health: DeviceHealth | None) -> None:
    """Make the toy port attach `health` to every result, as an executor on a GPU does."""
    run = port.next_result

    async def next_result():
        result = await run()
        result.health = health
        return result

    port.next_result = next_result


def waiting(n: int) -> list[Request]:
    return [Request(f"w{i}", [1, 2, 3], SamplingParams(), arrival_time=0.0) for i in range(n)]


@pytest.mark.parametrize(
    ("health", "num_waiting", "trouble"),
    [
        (None, 100, None),  # CPU: nothing known, nothing avoided
        (DeviceHealth(), 100, None),
        (DeviceHealth(temperature_celsius=85.0), 0, None),  # at the limit is not above it
        (DeviceHealth(temperature_celsius=85.5), 0, "hot"),
        (HOT, 0, "hot"),
        (BUSY, 7, None),  # busy GPU, short queue: normal
        (BUSY, 8, "saturated"),
        (DeviceHealth(utilization_ratio=0.95), 8, "saturated"),
        (DeviceHealth(utilization_ratio=0.94), 50, None),
        (DeviceHealth(memory_used_bytes=1, memory_total_bytes=1), 50, None),
    ],
)
def test_device_trouble_follows_the_documented_rule(health, num_waiting, trouble):
    assert device_trouble(health, num_waiting, SchedulerConfig()) == trouble


def test_the_limits_are_configurable_and_validated():
    config = SchedulerConfig(max_temperature_celsius=70.0, saturation_queue_len=0)
    assert device_trouble(DeviceHealth(temperature_celsius=71.0), 0, config) == "hot"
    assert device_trouble(DeviceHealth(utilization_ratio=1.0), 0, config) == "saturated"
    for field, value in [
        ("max_temperature_celsius", 0.0),
        ("saturation_utilization_ratio", 1.5),
        ("saturation_queue_len", -1),
        ("max_health_age_s", 0.0),
    ]:
        with pytest.raises(InvalidArgument, match=field):
            SchedulerConfig(**{field: value})


def test_choose_executor_passes_over_avoided_executors_unless_all_are():
    loads = {"a": 0, "b": 500}
    assert choose_executor(10, loads, {"a": 10}, avoid={"a"}) == "b"
    assert choose_executor(10, loads, {}, avoid={"a", "b"}) == "a"  # cost decides again


def test_trouble_is_judged_from_fresh_health_and_the_queue():
    rig = make_rig(CONFIG, num_executors=3)
    hot, busy, fine = (ExecutorState.create(port, CONFIG) for port in rig.ports)
    hot.note_health(HOT, now=10.0)
    busy.note_health(BUSY, now=10.0)
    fine.note_health(FINE, now=10.0)
    fine.note_health(None, now=12.0)  # a result between reports keeps the last one
    assert fine.health == FINE and fine.health_time == 10.0
    for req in waiting(CONFIG.saturation_queue_len):
        busy.queue.push(req)
    executors = [hot, busy, fine]
    ids = [ex.executor_id for ex in executors]
    assert executors_in_trouble(executors, 12.0, CONFIG) == {ids[0]: "hot", ids[1]: "saturated"}
    busy.queue.remove("w0")
    assert executors_in_trouble(executors, 12.0, CONFIG) == {ids[0]: "hot"}
    age_out = 10.0 + CONFIG.max_health_age_s + 0.1
    assert executors_in_trouble(executors, age_out, CONFIG) == {}


def test_health_is_read_from_the_executors_step_result():
    msg = executor_pb2.StepResult(step_id=3)
    msg.health.temperature_celsius = 88.0
    msg.health.memory_total_bytes = 1 << 37
    assert result_from_proto(msg).health == DeviceHealth(
        temperature_celsius=88.0, memory_total_bytes=1 << 37
    )
    assert result_from_proto(executor_pb2.StepResult(step_id=4)).health is None


async def test_a_hot_executor_gets_no_new_requests_until_its_report_ages_out():
    rig = make_rig(CONFIG, num_executors=2, manual_clock=True)
    report_health(rig.ports[0], HOT)
    report_health(rig.ports[1], FINE)
    scheduler = rig.scheduler
    await scheduler.start()
    await scheduler.submit("first", [5, 6, 7], g(2))  # equal loads: the first executor
    await scheduler.submit("second", [8, 9], g(2))  # the first one is loaded: the second
    await rig.sink.wait("first", "second")
    assert "first" in _plans_of(rig, 0) and "second" in _plans_of(rig, 1)
    prompts = {f"r{i}": [i + 1] * 12 for i in range(4)}
    for req_id, prompt in prompts.items():  # load alone would spread these over both
        await scheduler.submit(req_id, prompt, g(3))
    await rig.sink.wait(*prompts)
    assert not _plans_of(rig, 0) & set(prompts)
    rig.clock[0] += CONFIG.max_health_age_s + 1  # the hot report is old: no longer trusted
    await scheduler.submit("later", [4, 4], g(2))  # equal loads again: the first executor
    await rig.sink.wait("later")
    await scheduler.stop()
    assert "later" in _plans_of(rig, 0)
    for req_id, prompt in prompts.items():
        assert rig.sink.tokens[req_id] == reference(prompt, 3)


async def test_when_every_executor_is_hot_requests_are_still_served():
    rig = make_rig(CONFIG, num_executors=2, manual_clock=True)
    for port in rig.ports:
        report_health(port, HOT)
    await rig.scheduler.start()
    await rig.scheduler.submit("warm-0", [1], g(1))
    await rig.scheduler.submit("warm-1", [2], g(1))
    await rig.sink.wait("warm-0", "warm-1")
    for i in range(4):
        await rig.scheduler.submit(f"r{i}", [i + 3] * 8, g(2))
    await rig.sink.wait(*(f"r{i}" for i in range(4)))
    await rig.scheduler.stop()
    assert all(rig.sink.tokens[f"r{i}"] == reference([i + 3] * 8, 2) for i in range(4))
    assert _plans_of(rig, 0) & {"r0", "r1", "r2", "r3"}  # load still spreads them
    assert _plans_of(rig, 1) & {"r0", "r1", "r2", "r3"}
