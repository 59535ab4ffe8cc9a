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

import os
import sys
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


def check(cond: bool, message: str) -> None:
    """Layout-contract check in a host wrapper: a clear ValueError, kept under `python -O`."""
    if not cond:
        raise ValueError(message)


__all__ = ["HAS_TRITON", "check", "interpreting", "tl", "triton"]
