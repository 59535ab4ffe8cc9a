"""The executor's device health: NVML read at most once a second, for results and scrapes.

`open_nvml_device(device)` finds the executor's GPU in NVML (`pynvml`, from
the `nvidia-ml-py` package of the `gpu` extra, imported only here and only
when asked); on CPU, without the package, or when NVML does not start it
returns None and nothing else changes. `HealthSampler` reads the device at
most once per `interval_s` whoever asks:

- the servicer calls `poll()` after each step and attaches what it returns
  to the step's result (a sample at most once per interval, None between);
- `DeviceHealthCollector` calls `latest()` at scrape time and exports the
  `radixmesh_executor_gpu_*` gauges. It yields nothing when the device does
  not report a value: on CPU the gauges are absent, never zero.

A reading that fails (NVML errors, a field the device does not support)
leaves that field None; one bad field does not hide the others.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from radixmesh.step import DeviceHealth
from services.common.logging import get_logger

log = get_logger(__name__)

DEFAULT_INTERVAL_S = 1.0

# Exported gauge name -> (DeviceHealth field, help).
GAUGES = {
    "radixmesh_executor_gpu_utilization_ratio": (
        "utilization_ratio",
        "Fraction of the last NVML sample period the GPU was busy, [0, 1].",
    ),
    "radixmesh_executor_gpu_memory_used_bytes": (
        "memory_used_bytes",
        "GPU memory in use (all processes), bytes.",
    ),
    "radixmesh_executor_gpu_memory_total_bytes": (
        "memory_total_bytes",
        "GPU memory in total, bytes.",
    ),
    "radixmesh_executor_gpu_temperature_celsius": (
        "temperature_celsius",
        "GPU core temperature, degrees Celsius.",
    ),
}


class DeviceReader(Protocol):
    def read(self) -> DeviceHealth: ...

    def close(self) -> None: ...


class NvmlDevice:
    """One GPU through NVML. `read()` makes three NVML queries."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle

    def read(self) -> DeviceHealth:
        nvml, handle = self._nvml, self._handle
        utilization = self._query(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        memory = self._query(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        temperature = self._query(
            lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        )
        return DeviceHealth(
            utilization_ratio=None if utilization is None else utilization.gpu / 100.0,
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            temperature_celsius=None if temperature is None else float(temperature),
        )

    def _query(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except self._nvml.NVMLError:
            return None  # not supported on this device (or a transient failure)

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.warning("nvml_shutdown_failed", error=str(exc))


def cuda_uuid(device: str) -> str | None:
    """The UUID torch reports for a `cuda[:N]` device, None on CPU or when unknown."""
    index = _cuda_index(device)
    if index is None:
        return None
    try:
        import torch

        return str(torch.cuda.get_device_properties(index).uuid)
    except Exception:  # an old torch without .uuid, or no CUDA after all
        return None


def _cuda_index(device: str) -> int | None:
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return None
    return int(index) if index else 0


def open_nvml_device(
    device: str,
    *,
    uuid: str | None = None,
    nvml: Any = None,
    environ: Mapping[str, str] = os.environ,
) -> NvmlDevice | None:
    """NVML's handle on the executor's `device` ("cuda:N"), or None (CPU, no NVML).

    NVML numbers every GPU of the host in PCI order, CUDA only the visible
    ones: so the device is found by its `uuid` when known (see `cuda_uuid`),
    else through CUDA_VISIBLE_DEVICES (indices or GPU-UUIDs), else by index.
    `nvml` replaces the `pynvml` module (tests).
    """
    index = _cuda_index(device)
    if index is None:
        return None
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            log.info("gpu_health_off", reason="pynvml is not installed (extra: gpu)")
            return None
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        log.warning("gpu_health_off", reason=f"NVML did not start: {exc}")
        return None
    try:
        handle = _handle(nvml, index, uuid, environ.get("CUDA_VISIBLE_DEVICES"))
    except (nvml.NVMLError, ValueError) as exc:
        log.warning("gpu_health_off", reason=f"{device} not found in NVML: {exc}")
        NvmlDevice(nvml, None).close()
        return None
    return NvmlDevice(nvml, handle)


def _handle(nvml: Any, index: int, uuid: str | None, visible: str | None) -> Any:
    if uuid:
        name = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        try:
            return nvml.nvmlDeviceGetHandleByUUID(name)
        except nvml.NVMLError:
            pass  # not a UUID NVML knows in this form: find it by position instead
    if visible:
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if index >= len(entries):
            raise ValueError(f"CUDA_VISIBLE_DEVICES={visible!r} has no entry {index}")
        entry = entries[index]
        if not entry.isdigit():
            return nvml.nvmlDeviceGetHandleByUUID(entry)
        index = int(entry)
    return nvml.nvmlDeviceGetHandleByIndex(index)


class HealthSampler:
    """Reads the device at most once per `interval_s`; thread-safe (step thread, scrapes)."""

    def __init__(
        self,
        reader: DeviceReader | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._reader = reader
        self._interval = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._sample: DeviceHealth | None = None
        self._sampled_at = float("-inf")
        self._attached_at = float("-inf")

    def attach(self, reader: DeviceReader | None) -> None:
        """Start reading `reader` (None: stop). The previous reader is closed."""
        with self._lock:
            old, self._reader = self._reader, reader
            self._sample, self._sampled_at = None, float("-inf")
        if old is not None and old is not reader:
            old.close()

    def close(self) -> None:
        self.attach(None)

    def latest(self) -> DeviceHealth | None:
        """The newest sample, read again when older than the interval; None without a device."""
        with self._lock:
            return self._latest(self._clock())

    def poll(self) -> DeviceHealth | None:
        """A sample once per interval (to attach to a step result), None in between."""
        with self._lock:
            now = self._clock()
            if now - self._attached_at < self._interval:
                return None
            self._attached_at = now
            return self._latest(now)

    def _latest(self, now: float) -> DeviceHealth | None:
        if self._reader is None:
            return None
        if now - self._sampled_at >= self._interval:
            self._sample, self._sampled_at = self._reader.read(), now
        return self._sample


class DeviceHealthCollector(Collector):
    """The `radixmesh_executor_gpu_*` gauges at scrape time; only the fields the GPU reports."""

    def __init__(self, sampler: HealthSampler) -> None:
        self._sampler = sampler

    def collect(self) -> Iterator[GaugeMetricFamily]:
        health = self._sampler.latest()
        if health is None:
            return
        for name, (field, doc) in GAUGES.items():
            value = getattr(health, field)
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=value)
