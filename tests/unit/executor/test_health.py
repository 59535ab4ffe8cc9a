"""Device health: NVML through a fake module, the once-a-second sampler, the gauges, the stream."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from radixmesh.step import DeviceHealth, StepPlan, StepResult
from radixmesh.v1 import executor_pb2, executor_pb2_grpc
from radixmesh.wire import result_from_proto, result_to_proto
from services.executor.core.spec.drafting import NO_DRAFTS, DraftChoice
from services.executor.health import (
    GAUGES,
    DeviceHealthCollector,
    HealthSampler,
    NvmlDevice,
    open_nvml_device,
)
from services.executor.server import SERVICE_NAME, ExecutorServicer
from tests.fixtures.runtime import running_runtime

GIB = 1 << 30


class FakeNvml:
    """The part of `pynvml` the executor uses, over a table of devices by index and UUID."""

    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    def __init__(self, uuids=("GPU-aaa", "GPU-bbb", "GPU-ccc", "GPU-ddd"), fail_init=False):
        self.uuids = list(uuids)
        self.fail_init = fail_init
        self.unsupported: set[str] = set()
        """Queries that raise NVMLError (a device that cannot report them)."""
        self.utilization_percent = 57
        self.temperature = 71
        self.num_reads = 0
        self.num_inits = self.num_shutdowns = 0

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")
        self.num_inits += 1

    def nvmlShutdown(self):
        self.num_shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self.uuids):
            raise self.NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.uuids:
            raise self.NVMLError("Not Found")
        return self.uuids.index(uuid)

    def _check(self, query):
        if query in self.unsupported:
            raise self.NVMLError("Not Supported")

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._check("utilization")
        self.num_reads += 1
        return SimpleNamespace(gpu=self.utilization_percent + handle, memory=20)

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._check("memory")
        return SimpleNamespace(total=141 * GIB, used=(100 + handle) * GIB, free=0)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        self._check("temperature")
        return self.temperature


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- finding the device ---------------------------------------------------------


def test_cpu_opens_no_nvml_at_all():
    nvml = FakeNvml()
    assert open_nvml_device("cpu", nvml=nvml) is None
    assert nvml.num_inits == 0


def test_a_driver_that_does_not_start_turns_health_off():
    assert open_nvml_device("cuda:0", nvml=FakeNvml(fail_init=True), environ={}) is None


@pytest.mark.parametrize(
    ("device", "uuid", "visible", "handle"),
    [
        ("cuda", None, None, 0),
        ("cuda:2", None, None, 2),
        ("cuda:1", None, "3,0", 0),  # CUDA numbers the visible GPUs, NVML all of them
        ("cuda:0", None, "GPU-ccc,GPU-aaa", 2),
        ("cuda:0", "ddd", "1", 3),  # torch's UUID wins over positions
        ("cuda:0", "GPU-ddd", None, 3),
        ("cuda:1", "not-known", None, 1),  # a UUID NVML does not know: by position
    ],
)
def test_the_executors_gpu_is_found_in_nvml(device, uuid, visible, handle):
    nvml = FakeNvml()
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    reader = open_nvml_device(device, uuid=uuid, nvml=nvml, environ=environ)
    assert reader is not None
    assert reader.read().utilization_ratio == pytest.approx((57 + handle) / 100)


def test_a_device_missing_from_nvml_turns_health_off_and_shuts_nvml_down():
    nvml = FakeNvml()
    environ = {"CUDA_VISIBLE_DEVICES": "0"}
    assert open_nvml_device("cuda:1", nvml=nvml, environ=environ) is None
    assert nvml.num_shutdowns == 1


# -- reading -------------------------------------------------------------------


def test_a_reading_converts_nvml_units():
    health = NvmlDevice(FakeNvml(), 1).read()
    assert health == DeviceHealth(
        utilization_ratio=0.58,
        memory_used_bytes=101 * GIB,
        memory_total_bytes=141 * GIB,
        temperature_celsius=71.0,
    )


def test_a_query_the_device_does_not_support_leaves_only_that_field_empty():
    nvml = FakeNvml()
    nvml.unsupported = {"temperature", "memory"}
    health = NvmlDevice(nvml, 0).read()
    assert health == DeviceHealth(utilization_ratio=0.57)


def test_the_sampler_reads_at_most_once_per_interval_for_results_and_scrapes():
    nvml, clock = FakeNvml(), Clock()
    sampler = HealthSampler(NvmlDevice(nvml, 0), interval_s=1.0, clock=clock)
    first = sampler.poll()
    assert first is not None and first.temperature_celsius == 71.0
    nvml.temperature = 80
    clock.now += 0.5
    assert sampler.poll() is None  # attached once a second, not to every result
    assert sampler.latest() == first  # a scrape in between reads no NVML
    assert nvml.num_reads == 1
    clock.now += 0.5
    assert sampler.latest().temperature_celsius == 80.0  # a scrape refreshes the sample
    assert sampler.poll().temperature_celsius == 80.0  # and the result gets that same one
    assert nvml.num_reads == 2


def test_a_sampler_without_a_device_reports_nothing():
    sampler = HealthSampler()
    assert sampler.poll() is None and sampler.latest() is None


def test_attaching_a_device_replaces_and_closes_the_old_one():
    old, new = FakeNvml(), FakeNvml()
    new.temperature = 50
    sampler = HealthSampler(NvmlDevice(old, 0), clock=Clock())
    assert sampler.latest().temperature_celsius == 71.0
    sampler.attach(NvmlDevice(new, 0))
    assert old.num_shutdowns == 1
    assert sampler.latest().temperature_celsius == 50.0  # not the old device's sample
    sampler.close()
    assert new.num_shutdowns == 1 and sampler.latest() is None


# -- gauges --------------------------------------------------------------------


def _exposition(sampler: HealthSampler) -> str:
    registry = CollectorRegistry()
    registry.register(DeviceHealthCollector(sampler))
    return generate_latest(registry).decode()


def test_gauges_carry_what_the_gpu_reports():
    text = _exposition(HealthSampler(NvmlDevice(FakeNvml(), 0), clock=Clock()))
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values == {
        "radixmesh_executor_gpu_utilization_ratio": 0.57,
        "radixmesh_executor_gpu_memory_used_bytes": float(100 * GIB),
        "radixmesh_executor_gpu_memory_total_bytes": float(141 * GIB),
        "radixmesh_executor_gpu_temperature_celsius": 71.0,
    }


def test_gauges_are_absent_not_zero_without_a_gpu_or_a_field():
    assert "radixmesh_executor_gpu" not in _exposition(HealthSampler())
    nvml = FakeNvml()
    nvml.unsupported = {"utilization"}
    text = _exposition(HealthSampler(NvmlDevice(nvml, 0), clock=Clock()))
    assert "gpu_utilization_ratio" not in text
    assert set(GAUGES) - {"radixmesh_executor_gpu_utilization_ratio"} <= set(text.split())


# -- on the wire ---------------------------------------------------------------


def test_health_crosses_the_step_result_proto_and_stays_absent_when_unset():
    health = DeviceHealth(0.5, 3 * GIB, 141 * GIB, 90.0)
    msg = result_to_proto(StepResult(4, [], 0.01, health))
    assert result_from_proto(msg).health == health
    partial = result_to_proto(StepResult(5, [], 0.01, DeviceHealth(temperature_celsius=40.0)))
    assert not partial.health.HasField("utilization_ratio")
    assert result_from_proto(partial).health == DeviceHealth(temperature_celsius=40.0)
    assert not result_to_proto(StepResult(6)).HasField("health")
    assert result_from_proto(result_to_proto(StepResult(6))).health is None


class EmptyCore:
    """Runs any plan in no time and outputs nothing: the stream's plumbing only."""

    num_seqs = 0
    device = torch.device("cpu")

    def drafting(self, plan: StepPlan, substep: int = 0) -> DraftChoice:
        return NO_DRAFTS

    def prepare(self, plan: StepPlan, drafting: DraftChoice | None = None) -> StepPlan:
        return plan

    def execute(self, prepared: StepPlan) -> StepResult:
        return StepResult(prepared.step_id, [], 0.001)

    def shutdown(self) -> None:
        pass


async def test_step_results_carry_the_health_about_once_a_second():
    nvml, clock = FakeNvml(), Clock()
    servicer = ExecutorServicer(health=HealthSampler(NvmlDevice(nvml, 0), clock=clock))
    servicer.attach(EmptyCore(), "executor-test")

    def register(server: grpc.aio.Server) -> None:
        executor_pb2_grpc.add_ExecutorServicer_to_server(servicer, server)

    plans: asyncio.Queue[executor_pb2.StepPlan | None] = asyncio.Queue()

    async def send():
        while (plan := await plans.get()) is not None:
            yield plan

    carried = []
    try:
        async with (
            running_runtime(register, [SERVICE_NAME]) as runtime,
            grpc.aio.insecure_channel(runtime.address) as channel,
        ):
            call = executor_pb2_grpc.ExecutorStub(channel).Step(send())
            for step_id, advance_s in enumerate((0.0, 0.4, 0.4, 0.4, 0.1), start=1):
                clock.now += advance_s
                plans.put_nowait(executor_pb2.StepPlan(step_id=step_id))
                result = await call.read()
                assert result.step_id == step_id
                carried.append(result.HasField("health"))
            plans.put_nowait(None)
    finally:
        await servicer.close()
    # steps at 0, 0.4, 0.8, 1.2, 1.3 s: reported at 0 and 1.2 only
    assert carried == [True, False, False, True, False]
    assert nvml.num_reads == 2
