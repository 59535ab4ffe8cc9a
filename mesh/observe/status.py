"""The status page of `radixmesh serve`: live charts of the mesh's own metrics, no build step.

    GET /             the page (mesh/observe/status.html: plain HTML and JS, canvas charts)
    GET /api/status   {"model", "series": [...], "executors": [...], "services": [...]}

A sampler scrapes every service's `/metrics` once per `interval_s` and keeps
the last `max_points` points. Each point holds what changed since the
previous scrape: TTFT and time per output token (the means of the
scheduler's histograms' increase), requests and output tokens per second,
the cache's prefix hit rate, and the queue and batch levels. Executors are
listed from the scheduler's per-executor gauges with their GPU gauges
(absent on CPU: null, never 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from mesh.loadgen.scrape import (
    Endpoint,
    MetricsScraper,
    Snapshot,
    delta,
    endpoints_from_info,
    histogram_delta,
    total,
)
from radixmesh.errors import InvalidArgument

S = "radixmesh_scheduler_"
GPU = {
    "gpu_utilization": "radixmesh_executor_gpu_utilization_ratio",
    "gpu_memory_used_bytes": "radixmesh_executor_gpu_memory_used_bytes",
    "gpu_memory_total_bytes": "radixmesh_executor_gpu_memory_total_bytes",
    "gpu_temperature_celsius": "radixmesh_executor_gpu_temperature_celsius",
}


def _hist_mean(before: Snapshot, after: Snapshot, role: str, name: str) -> float | None:
    hist = histogram_delta(before, after, role, name)
    return hist.mean if hist is not None else None


def series_point(before: Snapshot, after: Snapshot, dt_s: float, t_s: float) -> dict[str, Any]:
    """What changed between two scrapes `dt_s` apart, as one chart point."""
    dt = max(dt_s, 1e-9)
    finished = delta(before, after, "scheduler", S + "finished_requests_total")
    tokens = delta(before, after, "scheduler", S + "generation_tokens_total")
    errors = _labelled_delta(before, after, S + "finished_requests_total", "finish_reason", "error")
    hit = delta(before, after, "cache", "radixmesh_cache_prefix_hit_tokens_total")
    query = delta(before, after, "cache", "radixmesh_cache_prefix_query_tokens_total")
    return {
        "t": round(t_s, 3),
        "ttft_s": _hist_mean(before, after, "scheduler", S + "time_to_first_token_seconds"),
        "tpot_s": _hist_mean(before, after, "scheduler", S + "inter_token_latency_seconds"),
        "requests_per_s": None if finished is None else finished / dt,
        "output_tokens_per_s": None if tokens is None else tokens / dt,
        "error_rate": errors / finished if finished and errors is not None else None,
        "hit_rate": hit / query if hit is not None and query else None,
        "running": total(after, "scheduler", S + "running_requests"),
        "waiting": total(after, "scheduler", S + "waiting_requests"),
        "preemptions": delta(before, after, "scheduler", S + "preemptions_total"),
    }


def _labelled_delta(
    before: Snapshot, after: Snapshot, name: str, label: str, value: str
) -> float | None:
    end = total(after, "scheduler", name, **{label: value})
    if end is None:
        return 0.0 if total(after, "scheduler", name) is not None else None
    return end - (total(before, "scheduler", name, **{label: value}) or 0.0)


def executors(snapshot: Snapshot, endpoints: list[Endpoint]) -> list[dict[str, Any]]:
    """One row per executor the scheduler knows, with its queue, batch and GPU gauges."""
    rows: dict[str, dict[str, Any]] = {}
    for (name, labels), value in snapshot.get("scheduler", {}).items():
        lab = dict(labels)
        if "executor_id" not in lab or not name.startswith(S):
            continue
        row = rows.setdefault(lab["executor_id"], {"executor_id": lab["executor_id"]})
        row["model"] = lab.get("model")
        row[name.removeprefix(S)] = value
    gpu = {
        _index(e.name): {k: _endpoint_value(snapshot, e.name, m) for k, m in GPU.items()}
        for e in endpoints
        if e.role == "executor"
    }
    ordered = sorted(rows.values(), key=lambda r: (_index(r["executor_id"]), r["executor_id"]))
    for row in ordered:
        row.update(gpu.get(_index(row["executor_id"])) or dict.fromkeys(GPU))
        row["healthy"] = bool(row.get("executor_healthy"))
    return ordered


def _index(name: str) -> int:
    """`executor-3` / `exec-3` -> 3 (how serve names an executor and its pool); -1 if none."""
    digits = re.search(r"(\d+)$", name)
    return int(digits.group(1)) if digits else -1


def _endpoint_value(snapshot: Snapshot, endpoint: str, metric: str) -> float | None:
    values = [
        v
        for (n, labels), v in snapshot.get("executor", {}).items()
        if n == metric and ("endpoint", endpoint) in labels
    ]
    return sum(values) if values else None


@dataclass
class StatusSampler:
    endpoints: list[Endpoint]
    interval_s: float = 1.0
    max_points: int = 600
    series: deque[dict[str, Any]] = field(init=False)
    last: Snapshot = field(default_factory=dict)
    up: dict[str, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.series = deque(maxlen=self.max_points)
        self._scraper = MetricsScraper(self.endpoints, timeout_s=max(self.interval_s, 1.0))
        self._t0 = time.monotonic()

    async def run(self) -> None:
        """Scrape every interval_s until cancelled."""
        before, t_before = await self._scrape()
        while True:
            await asyncio.sleep(self.interval_s)
            after, t_after = await self._scrape()
            self.series.append(series_point(before, after, t_after - t_before, t_after - self._t0))
            before, t_before = after, t_after

    async def _scrape(self) -> tuple[Snapshot, float]:
        self._scraper.errors.clear()
        snap = await self._scraper.snapshot()
        self.last = snap
        self.up = {e.name: e.name not in self._scraper.errors for e in self.endpoints}
        return snap, time.monotonic()

    def status(self, info: dict[str, Any]) -> dict[str, Any]:
        return {
            "model": info.get("model"),
            "public": info.get("http"),
            "interval_s": self.interval_s,
            "series": list(self.series),
            "executors": executors(self.last, self.endpoints),
            "services": [
                {"name": s["name"], "pid": s.get("pid"), "up": self.up.get(s["name"])}
                for s in info.get("services", ())
            ],
        }


def page_html() -> str:
    return resources.files("mesh.observe").joinpath("status.html").read_text()


class StatusServer:
    """The page and its JSON on `host:port` (0: a free port), from the running loop."""

    def __init__(self, info: dict[str, Any], host: str = "127.0.0.1", port: int = 0) -> None:
        if isinstance(port, bool) or not 0 <= port < 65536:
            raise InvalidArgument(f"status_port: must be in [0, 65535] (0: a free one), got {port}")
        self.info = info
        self.sampler = StatusSampler(endpoints_from_info(info))
        self._host, self._port = host, port
        self._runner: Any = None
        self._task: asyncio.Task | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}/"

    async def start(self) -> str:
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/", self._page)
        app.router.add_get("/api/status", self._status)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self._host, self._port))
        except OSError as exc:
            sock.close()
            raise OSError(
                exc.errno,
                f"status_port: cannot bind {self._host}:{self._port}: {exc.strerror or exc}",
            ) from exc
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        self.port = sock.getsockname()[1]
        self._task = asyncio.create_task(self.sampler.run())
        return self.url

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _page(self, _request: Any) -> Any:
        from aiohttp import web

        return web.Response(text=page_html(), content_type="text/html")

    async def _status(self, _request: Any) -> Any:
        from aiohttp import web

        return web.json_response(self.sampler.status(self.info))

