"""The service's own profiler: stack samples, cProfile and torch.profiler over counted steps."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import torch

from radixmesh.errors import InvalidArgument
from services.common.metrics import counter
from services.common.profiling import group_of, python_profile, routes_enabled, torch_profile

STEPS = counter("executor", "steps_total", "Steps run, by outcome.", ("outcome",))


def busy_spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(i * i for i in range(1000))


async def test_python_profile_samples_every_thread_and_the_loop():
    stop = threading.Event()
    worker = threading.Thread(target=busy_spin, args=(stop,), name="spinner")
    worker.start()
    try:
        body = await python_profile(0.3, 0.005)
    finally:
        stop.set()
        worker.join()
    assert body["num_samples"] > 10
    assert "thread spinner;" in body["collapsed"] and "busy_spin (" in body["collapsed"]
    assert "function calls" in body["cprofile"]


async def test_torch_profile_covers_the_requested_steps_of_another_thread():
    done = threading.Event()

    def steps() -> None:
        a = torch.randn(64, 64)
        while not done.wait(0.01):  # an executor stepping until the profile is taken
            a = torch.nn.functional.silu(a @ a) / 64
            STEPS.labels("ok").inc()

    stepping = asyncio.create_task(asyncio.to_thread(steps))
    try:
        report = await torch_profile(steps=5, timeout_s=30, trace=True)
    finally:
        done.set()
        await stepping
    assert report["steps"] >= 5 and report["device"] == "cpu"
    assert "matrix products" in report["groups"] and "silu and mul" in report["groups"]
    events = json.loads(report["chrome_trace"])["traceEvents"]
    assert any(e.get("name") == "aten::silu" for e in events)


async def test_torch_profile_of_an_idle_service_says_so():
    with pytest.raises(InvalidArgument, match="no executor step ran"):
        await torch_profile(steps=1, timeout_s=0.2)


def test_routes_only_on_loopback_unless_asked(monkeypatch):
    monkeypatch.delenv("RADIXMESH_PROFILE_ROUTES", raising=False)
    assert routes_enabled("127.0.0.1") and not routes_enabled("0.0.0.0")
    monkeypatch.setenv("RADIXMESH_PROFILE_ROUTES", "1")
    assert routes_enabled("0.0.0.0")


@pytest.mark.parametrize(
    ("kernel", "group"),
    [
        ("_paged_prefill_kernel", "attention"),
        ("_dense_prefill_kernel", "attention"),
        ("_decode_split_kernel", "attention"),
        ("_decode_reduce_kernel", "attention"),
        ("_copy_kv_slots_kernel", "copies"),
        ("Memcpy DtoD (Device -> Device)", "copies"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "copies"),
        ("_rotary_kv_store_kernel", "rotary"),
        ("_kv_store_kernel", "kv store"),
        ("nvjet_sm90_tst_256x152_64x4_1x2_h_bz_coopA_TNT", "matrix products"),
        ("_gemv_splitk_kernel", "matrix products"),
    ],
)
def test_each_of_the_projects_kernels_falls_in_its_group(kernel, group):
    assert group_of(kernel) == group
