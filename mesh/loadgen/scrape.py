"""Reading the mesh's Prometheus endpoints: snapshots, deltas over a run, sampled gauges.

Endpoints come as `name=URL` (`--metrics-url scheduler=http://127.0.0.1:9101/metrics`)
or from the JSON file `radixmesh serve --endpoints-json` writes. An endpoint's
role is its name up to a `-<n>` suffix (`executor-0` -> `executor`); samples of
one role's endpoints add up. A missing endpoint or metric reads as None, never 0.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from radixmesh.errors import InvalidArgument

Labels = frozenset[tuple[str, str]]
Samples = dict[tuple[str, Labels], float]
Snapshot = dict[str, Samples]
"""role -> (sample name, labels incl. `endpoint`) -> value."""

RUNNING = "radixmesh_scheduler_running_requests"
WAITING = "radixmesh_scheduler_waiting_requests"
GPU_UTILIZATION = "radixmesh_executor_gpu_utilization_ratio"
GPU_MEMORY = "radixmesh_executor_gpu_memory_used_bytes"
HIT_TOKENS = "radixmesh_cache_prefix_hit_tokens_total"
QUERY_TOKENS = "radixmesh_cache_prefix_query_tokens_total"
_ROLE = re.compile(r"-\d+$")


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    url: str

    @property
    def role(self) -> str:
        return _ROLE.sub("", self.name)


def parse_endpoints(specs: Iterable[str]) -> list[Endpoint]:
    """`name=URL` strings -> endpoints (`/metrics` is appended to a bare host:port URL)."""
    out = []
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise InvalidArgument(
                f"metrics_url: expected name=http://host:port[/path], got {spec!r}"
            )
        if url.rstrip("/").count("/") == 2:
            url = url.rstrip("/") + "/metrics"
        out.append(Endpoint(name, url))
    return out


def endpoints_from_mesh_info(path: str | Path) -> list[Endpoint]:
    """The services of `radixmesh serve --endpoints-json FILE` that have a metrics port."""
    try:
        info = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"mesh_info: cannot read {path}: {exc}") from None
    return endpoints_from_info(info)


def endpoints_from_info(info: dict) -> list[Endpoint]:
    """The services of an endpoints dict (`Mesh.endpoints()`) that have a metrics port."""
    out = []
    for service in info.get("services", ()):
        port = service.get("metrics_port")
        if port:
            host = service.get("address", "127.0.0.1:0").rpartition(":")[0] or "127.0.0.1"
            out.append(Endpoint(service["name"], f"http://{host}:{port}/metrics"))
    return out


def parse_text(text: str, endpoint: str) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = frozenset({**s.labels, "endpoint": endpoint}.items())
            samples[(s.name, labels)] = s.value
    return samples


def total(snapshot: Snapshot, role: str, name: str, **match: str) -> float | None:
    """Sum of a role's samples called `name` whose labels include `match` (None if none)."""
    values = [
        v
        for (n, labels), v in snapshot.get(role, {}).items()
        if n == name and all((k, val) in labels for k, val in match.items())
    ]
    return math.fsum(values) if values else None


def delta(before: Snapshot, after: Snapshot, role: str, name: str, **match: str) -> float | None:
    """The run's increase of `total(..., name, **match)` (None where the end has none)."""
    start, end = total(before, role, name, **match), total(after, role, name, **match)
    if end is None:
        return None
    return end - (start or 0.0)


@dataclass(frozen=True, slots=True)
class HistogramDelta:
    count: float
    sum: float
    buckets: tuple[tuple[float, float], ...]
    """(upper bound, cumulative count) over the run, ascending, ending at +Inf."""

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """Linear interpolation inside the bucket, as Prometheus's histogram_quantile."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        counts = [c for _, c in self.buckets]
        i = min(bisect.bisect_left(counts, rank), len(self.buckets) - 1)
        upper, count = self.buckets[i]
        if math.isinf(upper):
            return self.buckets[i - 1][0] if i > 0 else None
        lower, below = self.buckets[i - 1] if i > 0 else (0.0, 0.0)
        if count == below:
            return upper
        return lower + (upper - lower) * (rank - below) / (count - below)


def histogram_delta(
    before: Snapshot, after: Snapshot, role: str, name: str
) -> HistogramDelta | None:
    """A histogram's increase over the run, all label sets but `le` added up."""
    count = delta(before, after, role, f"{name}_count")
    if count is None:
        return None
    bounds: dict[float, float] = {}
    for snap, sign in ((after, 1.0), (before, -1.0)):
        for (n, labels), v in snap.get(role, {}).items():
            if n == f"{name}_bucket":
                le = float(dict(labels)["le"])
                bounds[le] = bounds.get(le, 0.0) + sign * v
    return HistogramDelta(
        count=count,
        sum=delta(before, after, role, f"{name}_sum") or 0.0,
        buckets=tuple(sorted(bounds.items())),
    )


@dataclass(frozen=True, slots=True)
class TimePoint:
    t_s: float
    """Seconds since the measured run started."""
    running: float | None
    waiting: float | None
    gpu_utilization: float | None
    gpu_memory_bytes: float | None
    hit_tokens: float | None = None
    """Cache prefix hit tokens so far (a counter: hit rate from two samples)."""
    query_tokens: float | None = None


@dataclass
class MetricsScraper:
    endpoints: list[Endpoint]
    timeout_s: float = 5.0
    errors: dict[str, str] = field(default_factory=dict)
    """Endpoint name -> last scrape error."""

    async def snapshot(self) -> Snapshot:
        import aiohttp

        snapshot: Snapshot = {}
        if not self.endpoints:
            return snapshot
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            texts = await asyncio.gather(*(self._fetch(session, e) for e in self.endpoints))
        for endpoint, text in zip(self.endpoints, texts, strict=True):
            if text is not None:
                snapshot.setdefault(endpoint.role, {}).update(parse_text(text, endpoint.name))
        return snapshot

    async def _fetch(self, session, endpoint: Endpoint) -> str | None:
        import aiohttp

        try:
            async with session.get(endpoint.url) as response:
                response.raise_for_status()
                return await response.text()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.errors[endpoint.name] = repr(exc)
            return None

    async def sample(self, interval_s: float, started_s: float, out: list[TimePoint]) -> None:
        """Append a TimePoint every interval_s until cancelled (started_s: perf_counter origin)."""
        while True:
            snap = await self.snapshot()
            out.append(
                TimePoint(
                    t_s=time.perf_counter() - started_s,
                    running=total(snap, "scheduler", RUNNING),
                    waiting=total(snap, "scheduler", WAITING),
                    gpu_utilization=total(snap, "executor", GPU_UTILIZATION),
                    gpu_memory_bytes=total(snap, "executor", GPU_MEMORY),
                    hit_tokens=total(snap, "cache", HIT_TOKENS),
                    query_tokens=total(snap, "cache", QUERY_TOKENS),
                )
            )
            await asyncio.sleep(interval_s)
