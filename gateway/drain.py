"""The gateway's health follows its scheduler, and its shutdown drains instead of cutting.

    tasks = edge_tasks(runtime, http, scheduler_address, grace_s, upstream.close, set_ready)

- Health: while the scheduler is not SERVING (it died, or is restarting) the gateway
  says NOT_SERVING on gRPC health and 503 on `GET /health`, so Envoy routes around it,
  and it says SERVING again as soon as the scheduler does (the next request opens a new
  scheduler stream). No polling: both directions follow the scheduler's health Watch.
- Drain: once shutdown is requested (SIGTERM) no new request is taken (gRPC: the server
  stops accepting; HTTP: 503), requests in flight get the grace period, and those still
  running at its end get an UNAVAILABLE error event, `the gateway is shutting down`
  (`close_upstream(SHUTTING_DOWN)` ends them: SchedulerClient.close), before the
  server's own grace runs out and would cut them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from gateway.openai_http import OpenAIHttpServer
from services.common.health import follow_serving
from services.common.logging import get_logger
from services.common.server import ServiceRuntime
from services.scheduler.client import SHUTTING_DOWN

log = get_logger(__name__)

SCHEDULER_SERVICE = "radixmesh.v1.Scheduler"
END_MARGIN_S = 1.0
"""How long before the grace period ends the last streams get their error event."""


def edge_tasks(
    runtime: ServiceRuntime,
    http: OpenAIHttpServer,
    scheduler_address: str,
    grace_s: float,
    close_upstream: Callable[[str], Awaitable[None]],
    set_ready: Callable[[bool], None],
) -> list[asyncio.Task[None]]:
    """Start the scheduler follower and the drain; cancel the tasks at shutdown's end."""

    def changed(serving: bool, reason: str) -> None:
        if runtime.stopping:
            return
        if not serving:
            log.error("scheduler_lost", address=scheduler_address, reason=reason)
        else:
            log.info("scheduler_serving", address=scheduler_address)
        set_ready(serving)

    follow = follow_serving(scheduler_address, SCHEDULER_SERVICE, changed)
    return [
        asyncio.create_task(follow, name="follow-scheduler"),
        asyncio.create_task(drain(runtime, http, grace_s, close_upstream), name="drain"),
    ]


async def finish(tasks: list[asyncio.Task[None]]) -> None:
    """At shutdown: stop following the scheduler, wait for the drain to end (it ends the
    streams still running at the end of the grace)."""
    for task in tasks:
        if task.get_name() != "drain":
            task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def drain(
    runtime: ServiceRuntime,
    http: OpenAIHttpServer,
    grace_s: float,
    close_upstream: Callable[[str], Awaitable[None]],
) -> None:
    """Wait for shutdown, then for the calls in flight (at most grace_s less a margin);
    then end what still runs with UNAVAILABLE (`the gateway is shutting down`)."""
    await runtime.wait_shutdown_requested()
    start = time.monotonic()
    budget = max(0.0, grace_s - END_MARGIN_S)
    try:
        await asyncio.wait_for(asyncio.gather(http.wait_idle(), runtime.wait_calls_done()), budget)
        log.info("drained", seconds=round(time.monotonic() - start, 3))
    except TimeoutError:
        log.warning(
            "grace_over",
            grace_seconds=grace_s,
            num_http=http.num_in_flight,
            num_grpc=runtime.num_active_calls,
        )
    await close_upstream(SHUTTING_DOWN)  # each request left: Unavailable(SHUTTING_DOWN)
