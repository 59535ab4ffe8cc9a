"""Prometheus metrics: one registry per process, names `radixmesh_<room>_<name>`.

Create metrics through `counter`, `gauge` and `histogram`; they check the name
(a counter ends in `_total`, a histogram names its unit) and return the existing
metric when the same one is asked for twice, so modules and tests can create
their metrics at import or construction time without clashing.

`MetricsServer` serves `/metrics` over HTTP from the running asyncio loop
(aiohttp) and stops cleanly.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    gc_collector,
    generate_latest,
    platform_collector,
    process_collector,
)

from radixmesh.errors import InvalidArgument

PREFIX = "radixmesh"

# The process's one registry: every radixmesh metric, plus process/GC/platform facts.
REGISTRY = CollectorRegistry(auto_describe=True)
process_collector.ProcessCollector(registry=REGISTRY)
platform_collector.PlatformCollector(registry=REGISTRY)
gc_collector.GCCollector(registry=REGISTRY)

# Units a histogram name must end with.
HISTOGRAM_UNITS = ("_seconds", "_tokens", "_bytes", "_pages", "_sequences", "_requests", "_ratio")

_WORD = re.compile(r"^[a-z][a-z0-9_]*[a-z0-9]$|^[a-z]$")
_CREATED: dict[str, tuple[type, tuple[str, ...], object]] = {}


def metric_name(room: str, name: str) -> str:
    """`radixmesh_<room>_<name>`, after checking both parts are snake_case words."""
    if not _WORD.match(room) or "__" in room:
        raise InvalidArgument(f"room: must be a snake_case word, got {room!r}")
    if not _WORD.match(name) or "__" in name:
        raise InvalidArgument(f"name: must be snake_case, got {name!r}")
    if name.startswith(f"{PREFIX}_"):
        raise InvalidArgument(f"name: give it without the {PREFIX}_<room>_ prefix, got {name!r}")
    return f"{PREFIX}_{room}_{name}"


def _get_or_create(kind: type, full: str, doc: str, labelnames: Sequence[str], **kwargs):
    labels = tuple(labelnames)
    existing = _CREATED.get(full)
    if existing is not None:
        old_kind, old_labels, metric = existing
        if old_kind is not kind or old_labels != labels:
            raise InvalidArgument(
                f"name: {full} already exists as a {old_kind.__name__} with labels {old_labels}"
            )
        return metric
    metric = kind(full, doc, labelnames=labels, registry=REGISTRY, **kwargs)
    _CREATED[full] = (kind, labels, metric)
    return metric


def counter(room: str, name: str, doc: str, labelnames: Sequence[str] = ()) -> Counter:
    """A counter `radixmesh_<room>_<name>`; `name` must end in `_total`."""
    full = metric_name(room, name)
    if not name.endswith("_total"):
        raise InvalidArgument(f"name: a counter's name ends in _total, got {name!r}")
    return _get_or_create(Counter, full, doc, labelnames)


def gauge(room: str, name: str, doc: str, labelnames: Sequence[str] = ()) -> Gauge:
    """A gauge `radixmesh_<room>_<name>` (a level: `num_running_requests`, `free_pages`)."""
    full = metric_name(room, name)
    if name.endswith("_total"):
        raise InvalidArgument(f"name: _total is for counters, got {name!r}")
    return _get_or_create(Gauge, full, doc, labelnames)


def histogram(
    room: str,
    name: str,
    doc: str,
    labelnames: Sequence[str] = (),
    buckets: Sequence[float] | None = None,
) -> Histogram:
    """A histogram `radixmesh_<room>_<name>`; `name` ends in one of `HISTOGRAM_UNITS`."""
    full = metric_name(room, name)
    if not name.endswith(HISTOGRAM_UNITS):
        raise InvalidArgument(
            f"name: a histogram's name ends in its unit {HISTOGRAM_UNITS}, got {name!r}"
        )
    kwargs = {} if buckets is None else {"buckets": tuple(buckets)}
    return _get_or_create(Histogram, full, doc, labelnames, **kwargs)


def render_metrics() -> bytes:
    """The registry in Prometheus text format."""
    return generate_latest(REGISTRY)


class MetricsServer:
    """`GET /metrics` on `host:port` (0 picks a free port), served by the running loop."""

    def __init__(self, host: str, port: int) -> None:
        self._host = host
        self._requested_port = port
        self._runner: Any = None  # aiohttp AppRunner once started
        self.port: int | None = None

    async def start(self) -> int:
        """Bind and serve; returns the bound port."""
        from aiohttp import web  # imported here: a service without metrics does not pay for it

        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        from services.common.profiling import add_profile_routes, routes_enabled

        if routes_enabled(self._host):
            add_profile_routes(app)
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self._host, self._requested_port))
        except OSError as exc:
            sock.close()
            raise OSError(
                exc.errno, f"metrics_port: cannot bind {self._host}:{self._requested_port}"
            ) from exc
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._runner = runner
        self.port = sock.getsockname()[1]
        return self.port

    async def stop(self) -> None:
        """Close the listener and any open connections (idempotent)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _handle(self, _request: Any) -> Any:
        from aiohttp import web

        return web.Response(body=render_metrics(), headers={"Content-Type": CONTENT_TYPE_LATEST})
