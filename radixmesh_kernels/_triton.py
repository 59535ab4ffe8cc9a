"""Triton, when installed; a stand-in otherwise, so the torch references import anywhere.

Kernel modules import `triton` and `tl` from here. Without Triton (a CPU-only
install) the `@triton.jit` kernels become stubs that raise when launched; the
references beside them keep working.

Without a CUDA device Triton can only run kernels through its interpreter, and
the choice is fixed when triton is first imported (its own library functions
are decorated then). So when this module is the first to import triton on a
machine with no CUDA device, it defaults TRITON_INTERPRET to 1; an explicit
setting is kept.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

_first_import = "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules
if _first_import and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - CI installs triton
    HAS_TRITON = False

    class _MissingKernel:
        def __init__(self, fn: Any) -> None:
            self.fn = fn

        def __getitem__(self, grid: Any) -> Any:
            raise RuntimeError(f"{self.fn.__name__}: triton is not installed")

    class _MissingTriton:
        Config = dict

        @staticmethod
        def jit(fn: Any = None, **_: Any) -> Any:
            return _MissingKernel(fn) if fn is not None else _MissingKernel

        @staticmethod
        def autotune(**_: Any) -> Any:
            return lambda fn: fn

        @staticmethod
        def cdiv(a: int, b: int) -> int:
            return -(-a // b)

        @staticmethod
        def next_power_of_2(n: int) -> int:
            return 1 << max(n - 1, 0).bit_length()

    class _MissingLanguage:
        constexpr = Any

    triton = _MissingTriton()  # type: ignore[assignment]
    tl = _MissingLanguage()  # type: ignore[assignment]


def interpreting() -> bool:
    """True when kernels run on the CPU through Triton's interpreter (TRITON_INTERPRET=1)."""
    if not HAS_TRITON:
        return False
    knobs = getattr(triton, "knobs", None)  # triton < 3.4 has no knobs
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def num_multiprocessors(device: torch.device) -> int:
    """The CUDA device's multiprocessor count, read once per device; 2 under the
    interpreter or off CUDA (a small grid to fill, so the grid rules still branch)."""
    if interpreting() or device.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


def _dependent_launch_setting() -> str:
    value = os.environ.get("RADIXMESH_DEPENDENT_LAUNCH", "on")
    if value not in ("on", "off"):
        raise ValueError(f"RADIXMESH_DEPENDENT_LAUNCH must be 'on' or 'off', got {value!r}")
    return value


DEPENDENT_LAUNCH = _dependent_launch_setting()
""""on" (the default): the decode chain's kernels launch as programmatic dependents on
Hopper and later (see `dependent_launch`); "off": plain launches. From the environment's
RADIXMESH_DEPENDENT_LAUNCH, so an A/B run or an operator reaches every process."""


_PLAIN: Mapping[str, bool] = MappingProxyType({})
_DEPENDENT: Mapping[str, bool] = MappingProxyType({"USE_PDL": True, "launch_pdl": True})


@functools.cache
def _device_launch(device: torch.device) -> Mapping[str, bool]:
    """`dependent_launch`'s arguments on `device` when it is on: decided once per device."""
    if device.type != "cuda" or interpreting() or not torch.cuda.is_available():
        return _PLAIN
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:  # pragma: no cover - a Triton without the NVIDIA backend
        return _PLAIN
    if "launch_pdl" not in CUDAOptions.__dataclass_fields__:  # Triton < 3.3
        return _PLAIN
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _DEPENDENT if torch.cuda.get_device_capability(index)[0] >= 9 else _PLAIN


def dependent_launch(device: torch.device) -> Mapping[str, bool]:
    """The launch arguments of a kernel that may start before the kernel ahead of it ends.

    On Hopper and later a kernel launched with `launch_pdl` (CUDA's programmatic dependent
    launch) is scheduled once every program of the kernel ahead has called
    `gdc_launch_dependents`, and its own programs block in `gdc_wait` until that kernel has
    finished and its writes are visible. A kernel taking these arguments must call
    `release_dependents` (or `gdc_wait` itself) before it reads anything another kernel
    writes and before it writes anything; what it does before (a weight tile's loads) overlaps
    the kernel ahead's tail and the launch between them. Everywhere else (the interpreter,
    older GPUs, `DEPENDENT_LAUNCH` not "on"): no arguments, so `USE_PDL` keeps its default
    False and the kernel is as before. Called at every launch of the chain, so it costs a
    comparison and a cached lookup; the mapping returned is shared and read-only."""
    return _device_launch(device) if DEPENDENT_LAUNCH == "on" else _PLAIN


if HAS_TRITON:

    @triton.jit
    def release_dependents(USE_PDL: tl.constexpr):
        """Waits for the kernel ahead (its writes visible), then lets the next kernel's
        programs be scheduled: at most one kernel waits ahead of its turn."""
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()

else:  # pragma: no cover - CI installs triton
    release_dependents = triton.jit(lambda USE_PDL: None)


def check(cond: bool, message: str) -> None:
    """Layout-contract check in a host wrapper: a clear ValueError, kept under `python -O`."""
    if not cond:
        raise ValueError(message)


__all__ = [
    "DEPENDENT_LAUNCH",
    "HAS_TRITON",
    "check",
    "dependent_launch",
    "interpreting",
    "release_dependents",
    "tl",
    "triton",
]
