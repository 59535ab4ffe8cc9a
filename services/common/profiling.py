"""Profiles of this process on request, served beside `/metrics` (the fallback of `radixmesh profile`).

`radixmesh profile` samples a service from outside with py-spy. Where py-spy
cannot attach (no ptrace permission, a container without SYS_PTRACE), it asks
the service itself over its metrics port:

    GET /debug/profile?seconds=10&interval_ms=5
        -> {"collapsed": "frame;frame;... COUNT\\n...", "interval_s": 0.005,
            "num_samples": N, "cprofile": "<pstats text of the event-loop thread>"}
    GET /debug/torch-profile?steps=20&timeout_s=60&trace=1
        -> {"steps": N, "device": "cuda"|"cpu", "groups": {group: {us_per_step, ...}},
            "top_ops": [...], "chrome_trace": "<Chrome trace JSON>" (with trace=1)}

The first samples every thread's Python stack (`sys._current_frames`) from a
helper thread and runs the standard `cProfile` on the event-loop thread over
the same window. The second runs `torch.profiler` until the executor's
`radixmesh_executor_steps_total` grew by `steps` (kernels grouped as
`bench/profile_decode.py` groups them).

The routes exist only when the metrics port is bound to loopback, or when
`RADIXMESH_PROFILE_ROUTES=1` says so (a profile shows code paths, not data).
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import os
import pstats
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from radixmesh.errors import InvalidArgument

ENV_ENABLE = "RADIXMESH_PROFILE_ROUTES"
MAX_SECONDS = 600.0
STEPS_METRIC = "radixmesh_executor_steps_total"

# (group, substrings of the kernel or op name, lower-cased); the first match wins (so the
# attention kernels, `_paged_prefill_kernel` among them, come before "fill" of the copies)
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("attention", "attn", "_attend", "flash", "_paged_prefill", "_dense_prefill",
                   "_decode_split", "_decode_reduce")),
    ("rmsnorm", ("rmsnorm", "rms_norm")),
    ("rotary", ("rotary", "rope")),
    ("kv store", ("kv_store", "store_kv", "reshape_and_cache")),
    ("silu and mul", ("silu",)),
    ("matrix products", ("gemm", "gemv", "cutlass", "xmma", "nvjet", "cublas", "splitk",
                         "scaled_mm", "e4m3", "aten::mm", "addmm", "bmm", "matmul")),
    ("fp8 activation quantization", ("quantize_rows", "amax")),
    ("sampling", ("argmax", "softmax", "topk", "sort", "bitmask", "exponential", "sampl")),
    ("embedding", ("embedding", "index_select", "indexselect")),
    ("copies", ("copy", "memcpy", "memset", "fill", "cat")),
)


def group_of(kernel: str) -> str:
    name = kernel.lower()
    for group, needles in GROUPS:
        if any(n in name for n in needles):
            return group
    return "other"


def routes_enabled(host: str) -> bool:
    return host in ("127.0.0.1", "::1", "localhost") or os.environ.get(ENV_ENABLE) == "1"


def _frame_name(code: Any, lineno: int) -> str:
    """The frame as py-spy's raw format writes it: `function (file:line)`."""
    return f"{code.co_name} ({code.co_filename}:{lineno})"


def sample_stacks(seconds: float, interval_s: float, stop: threading.Event) -> dict[str, int]:
    """Every thread's stack (but this one) every interval_s for `seconds`: collapsed -> count."""
    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    counts: dict[str, int] = defaultdict(int)
    deadline = time.monotonic() + seconds
    while not stop.wait(interval_s) and time.monotonic() < deadline:
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            frames = []
            f: Any = frame
            while f is not None:
                frames.append(_frame_name(f.f_code, f.f_lineno))
                f = f.f_back
            thread = f"thread {names.get(ident, ident)}"
            counts[";".join([thread, *reversed(frames)])] += 1
    return dict(counts)


def _number(query: Any, name: str, default: float, low: float, high: float) -> float:
    raw = query.get(name)
    try:
        value = default if raw is None else float(raw)
    except ValueError:
        raise InvalidArgument(f"{name}: expected a number, got {raw!r}") from None
    if not low <= value <= high:
        raise InvalidArgument(f"{name}: must be in [{low}, {high}], got {value}")
    return value


async def python_profile(seconds: float, interval_s: float) -> dict[str, Any]:
    """Stack samples of every thread plus cProfile of the loop thread over one window."""
    stop = threading.Event()
    sampling = asyncio.get_running_loop().run_in_executor(
        None, sample_stacks, seconds, interval_s, stop
    )
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        counts = await sampling
    finally:
        stop.set()
        profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
    return {
        "collapsed": "".join(f"{k} {v}\n" for k, v in sorted(counts.items())),
        "interval_s": interval_s,
        "num_samples": sum(counts.values()),
        "cprofile": text.getvalue(),
    }


def _steps_done() -> float:
    from services.common.metrics import REGISTRY

    return REGISTRY.get_sample_value(STEPS_METRIC, {"outcome": "ok"}) or 0.0


def _chrome_trace(prof: Any) -> str:
    """The profile as Chrome trace JSON (chrome://tracing, https://ui.perfetto.dev)."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        return Path(f.name).read_text()


def _all_threads() -> dict[str, Any]:
    """Record ops of every thread (the executor steps in a worker thread), where torch can."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except (ImportError, TypeError):
        return {}


async def torch_profile(steps: int, timeout_s: float, trace: bool = False) -> dict[str, Any]:
    """torch.profiler over the next `steps` executor steps (CUDA kernels when on a GPU)."""
    import torch

    on_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if on_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=activities, **_all_threads())
    # starting imports torch's compiler stack the first time (seconds): off the event loop
    await asyncio.to_thread(prof.start)
    start = _steps_done()
    deadline = time.monotonic() + timeout_s
    try:
        while _steps_done() - start < steps and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        await asyncio.to_thread(prof.stop)
    done = int(_steps_done() - start)
    if done == 0:
        raise InvalidArgument(f"steps: no executor step ran within {timeout_s} s (idle service?)")
    ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    device = torch.autograd.DeviceType.CUDA if on_cuda else torch.autograd.DeviceType.CPU
    for event in prof.events():
        if event.device_type == device:
            ops[event.name][0] += event.device_time if on_cuda else event.self_cpu_time_total
            ops[event.name][1] += 1
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, (us, count) in ops.items():
        g = groups[group_of(name)]
        g[0] += us / done
        g[1] += count / done
    busy = sum(us for us, _ in groups.values())
    chrome_trace = await asyncio.to_thread(_chrome_trace, prof) if trace else None
    return {
        "chrome_trace": chrome_trace,
        "steps": done,
        "device": "cuda" if on_cuda else "cpu",
        "busy_us_per_step": round(busy, 1),
        "groups": {
            g: {
                "us_per_step": round(us, 1),
                "calls_per_step": round(count, 1),
                "share_of_busy": round(us / busy, 3) if busy else None,
            }
            for g, (us, count) in sorted(groups.items(), key=lambda kv: -kv[1][0])
        },
        "top_ops": [
            {"name": name[:120], "us_per_step": round(us / done, 1), "per_step": count / done}
            for name, (us, count) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:15]
        ],
    }


def add_profile_routes(app: Any) -> None:
    """`/debug/profile` and `/debug/torch-profile` on an aiohttp application."""
    from aiohttp import web

    async def profile(request: Any) -> Any:
        try:
            seconds = _number(request.query, "seconds", 10.0, 0.05, MAX_SECONDS)
            interval_ms = _number(request.query, "interval_ms", 5.0, 0.5, 1000.0)
        except InvalidArgument as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(await python_profile(seconds, interval_ms / 1e3))

    async def torch_route(request: Any) -> Any:
        try:
            steps = int(_number(request.query, "steps", 20, 1, 100_000))
            timeout_s = _number(request.query, "timeout_s", 60.0, 0.1, MAX_SECONDS)
            trace = request.query.get("trace") == "1"
            return web.json_response(await torch_profile(steps, timeout_s, trace))
        except InvalidArgument as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except ImportError:
            return web.json_response({"error": "torch is not installed here"}, status=404)

    app.router.add_get("/debug/profile", profile)
    app.router.add_get("/debug/torch-profile", torch_route)
