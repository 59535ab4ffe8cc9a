"""The device's own ceilings: copy bandwidth and bf16 matrix throughput.

- copy: one large device-to-device copy, counted as bytes read + bytes written;
- matmul: a bf16 [n, n] @ [n, n] product on random data (n = 8192), 2 n^3 FLOPs.

Each is timed with CUDA events around single calls after a warm-up; the median
is reported. Prints the versions (torch, triton, CUDA, GPU), a short table and
one JSON object. `--quick` runs small sizes (on the CPU when there is no GPU)
to check the script; its numbers mean nothing.

    python bench/ceilings.py [--quick] [--json ceilings.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch


def versions(device: torch.device) -> dict[str, str | None]:
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    cuda = device.type == "cuda"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
        "capability": ".".join(map(str, torch.cuda.get_device_capability(device)))
        if cuda
        else None,
    }


def median_ms(fn: Callable[[], object], device: torch.device, warmup: int, reps: int) -> float:
    """Median milliseconds of one call: CUDA events on a GPU, perf_counter on the CPU."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth_gbps(device: torch.device, num_bytes: int, reps: int) -> tuple[float, float]:
    """(GB/s, ms) of copying num_bytes on the device, read + written bytes counted."""
    src = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device, warmup=3, reps=reps)
    return 2 * num_bytes / ms / 1e6, ms


def matmul_tflops(device: torch.device, n: int, reps: int) -> tuple[float, float]:
    """(TFLOP/s, ms) of a bf16 n x n x n matrix product on random data."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn((n, n), generator=gen, device=device, dtype=torch.bfloat16)
    b = torch.randn((n, n), generator=gen, device=device, dtype=torch.bfloat16)
    out = torch.empty((n, n), device=device, dtype=torch.bfloat16)
    ms = median_ms(lambda: torch.matmul(a, b, out=out), device, warmup=5, reps=reps)
    return 2 * n**3 / ms / 1e9, ms


def measure(device: torch.device, quick: bool) -> dict[str, object]:
    copy_bytes = (64 << 20) if quick else (4 << 30)
    n = 512 if quick else 8192
    reps = 5 if quick else 30
    copy_gbps, copy_ms = copy_bandwidth_gbps(device, copy_bytes, reps)
    tflops, mm_ms = matmul_tflops(device, n, reps)
    return {
        "versions": versions(device),
        "quick": quick,
        "copy_bytes": copy_bytes,
        "copy_ms": round(copy_ms, 4),
        "copy_gbps": round(copy_gbps, 3),
        "matmul_n": n,
        "matmul_ms": round(mm_ms, 4),
        "matmul_tflops": round(tflops, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; checks the script")
    parser.add_argument("--json", type=Path, help="also write the JSON object here")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.quick:
        parser.error("the ceilings need a CUDA device; use --quick for a CPU smoke run")
    result = measure(device, args.quick)
    v = result["versions"]
    print("versions " + "  ".join(f"{k} {val}" for k, val in v.items()))  # type: ignore[union-attr]
    print(
        f"copy     {result['copy_bytes'] / 2**30:.2f} GiB D2D: {result['copy_ms']} ms median, "
        f"{result['copy_gbps']:,.1f} GB/s (read + written)"
    )
    print(
        f"matmul   bf16 {result['matmul_n']}^3: {result['matmul_ms']} ms median, "
        f"{result['matmul_tflops']:,.1f} TFLOP/s"
    )
    text = json.dumps(result)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
