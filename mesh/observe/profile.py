"""Taking a profile of one running service: py-spy from outside, the service's own sampler as fallback.

Writes into the output folder:
- `<service>.svg`: a flame graph of where the process spent its samples;
- `<service>.speedscope.json`: the same samples for https://www.speedscope.app;
- `<service>.collapsed.txt`: the collapsed stacks both were drawn from;
- `<service>.cprofile.txt`: (Python fallback only) cProfile of the event-loop thread;
- `<service>.torch.json`: (executors, with torch_steps) torch.profiler over that many
  steps, ops or CUDA kernels grouped as `bench/profile_decode.py` groups them;
- `<service>.torch-trace.json`: the same steps as a Chrome trace (https://ui.perfetto.dev).
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mesh.observe.flame import (
    Stacks,
    flamegraph_svg,
    format_collapsed,
    hottest,
    parse_collapsed,
    speedscope_json,
)
from radixmesh.errors import FailedPrecondition, InvalidArgument, Unavailable

METHODS = ("auto", "py-spy", "python")


@dataclass(frozen=True, slots=True)
class ProfileRequest:
    service: str
    """Name in the mesh (`executor-0`), used for the file names."""
    pid: int | None
    """Process to attach py-spy to; None allows only the Python fallback."""
    metrics_url: str | None
    """`http://host:port` of the service's metrics server (the fallback and torch routes)."""
    seconds: float = 10.0
    rate_hz: int = 100
    """Samples per second."""
    method: str = "auto"
    """auto (py-spy, else the Python fallback), py-spy or python."""
    torch_steps: int = 0
    """Steps to trace with torch.profiler (0: none)."""

    def __post_init__(self) -> None:
        if not 0.05 <= self.seconds <= 600:
            raise InvalidArgument(f"seconds: must be in [0.05, 600], got {self.seconds}")
        if not 1 <= self.rate_hz <= 2000:
            raise InvalidArgument(f"rate: must be in [1, 2000] Hz, got {self.rate_hz}")
        if self.method not in METHODS:
            raise InvalidArgument(f"method: must be one of {METHODS}, got {self.method!r}")
        if self.torch_steps < 0:
            raise InvalidArgument(f"torch_steps: must be >= 0, got {self.torch_steps}")
        if self.pid is None and self.metrics_url is None:
            raise InvalidArgument("service: neither a pid nor a metrics port to profile through")


@dataclass(slots=True)
class ProfileResult:
    method: str
    """What took the samples: py-spy or python."""
    num_samples: int
    files: dict[str, Path] = field(default_factory=dict)
    hottest: list[tuple[str, int]] = field(default_factory=list)
    fallback_reason: str | None = None
    """Why py-spy was not used (auto only)."""
    torch: dict[str, Any] | None = None
    torch_error: str | None = None


def py_spy_binary() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


async def record_py_spy(pid: int, seconds: float, rate_hz: int, out: Path) -> Stacks:
    """`py-spy record --format raw`: raises FailedPrecondition with py-spy's words if it fails."""
    binary = py_spy_binary()
    if binary is None:
        raise FailedPrecondition("py-spy is not installed (pip install py-spy)")
    argv = [binary, "record", "--pid", str(pid), "--duration", str(max(1, math.ceil(seconds)))]
    argv += ["--rate", str(rate_hz), "--format", "raw", "--output", str(out), "--threads"]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await proc.communicate()
    if proc.returncode != 0 or not out.is_file():
        text = output.decode(errors="replace").strip().splitlines()
        raise FailedPrecondition(f"py-spy could not sample pid {pid}: {' | '.join(text[-3:])}")
    return parse_collapsed(out.read_text().splitlines())


async def _get_json(url: str, timeout_s: float) -> dict[str, Any]:
    import aiohttp

    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(url) as response,
        ):
            body = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise Unavailable(f"profile: {url} did not answer: {exc!r}") from None
    if response.status != 200:
        raise FailedPrecondition(f"profile: {url} answered {response.status}: {body.get('error')}")
    return body


async def record_python(metrics_url: str, seconds: float, rate_hz: int) -> dict[str, Any]:
    interval_ms = 1e3 / rate_hz
    url = f"{metrics_url}/debug/profile?seconds={seconds:g}&interval_ms={interval_ms:g}"
    return await _get_json(url, seconds + 30)


async def _samples(req: ProfileRequest, out: Path, result: ProfileResult) -> Stacks:
    raw = out / f"{req.service}.collapsed.txt"
    if req.method in ("auto", "py-spy") and req.pid is not None:
        try:
            stacks = await record_py_spy(req.pid, req.seconds, req.rate_hz, raw)
            result.method = "py-spy"
            return stacks
        except FailedPrecondition as exc:
            if req.method == "py-spy":
                raise
            result.fallback_reason = str(exc)
    elif req.method == "py-spy":
        raise InvalidArgument("pid: py-spy needs the service's pid")
    if req.metrics_url is None:
        raise FailedPrecondition(
            f"profile: py-spy failed ({result.fallback_reason}) and the service has no metrics port"
        )
    body = await record_python(req.metrics_url, req.seconds, req.rate_hz)
    result.method = "python"
    raw.write_text(body["collapsed"])
    cprofile = out / f"{req.service}.cprofile.txt"
    cprofile.write_text(body.get("cprofile", ""))
    result.files["cprofile"] = cprofile
    return parse_collapsed(body["collapsed"].splitlines())


async def _torch(req: ProfileRequest, out: Path, result: ProfileResult) -> None:
    assert req.metrics_url is not None
    url = f"{req.metrics_url}/debug/torch-profile?steps={req.torch_steps}"
    url += f"&timeout_s={req.seconds:g}&trace=1"
    try:
        result.torch = await _get_json(url, req.seconds + 30)
    except (FailedPrecondition, Unavailable) as exc:
        result.torch_error = str(exc)
        return
    chrome_trace = result.torch.pop("chrome_trace", None)
    path = out / f"{req.service}.torch.json"
    path.write_text(json.dumps(result.torch, indent=2) + "\n")
    result.files["torch"] = path
    if chrome_trace:
        trace_path = out / f"{req.service}.torch-trace.json"
        trace_path.write_text(chrome_trace)
        result.files["torch_trace"] = trace_path


async def take_profile(req: ProfileRequest, out: Path) -> ProfileResult:
    """Sample the service for req.seconds (and trace torch steps meanwhile); write the files."""
    out.mkdir(parents=True, exist_ok=True)
    result = ProfileResult(method=req.method, num_samples=0)
    torch_task = None
    if req.torch_steps and req.metrics_url:
        torch_task = asyncio.create_task(_torch(req, out, result))
    try:
        stacks = await _samples(req, out, result)
    finally:
        if torch_task is not None:
            await torch_task
    result.num_samples = sum(stacks.values())
    title = f"{req.service} ({result.method}, {req.seconds:g} s at {req.rate_hz} Hz)"
    svg = out / f"{req.service}.svg"
    svg.write_text(flamegraph_svg(stacks, title))
    speedscope = out / f"{req.service}.speedscope.json"
    speedscope.write_text(speedscope_json(stacks, title, 1.0 / req.rate_hz))
    collapsed = out / f"{req.service}.collapsed.txt"
    collapsed.write_text(format_collapsed(stacks))
    result.files.update(svg=svg, speedscope=speedscope, collapsed=collapsed)
    result.hottest = hottest(stacks)
    return result
