"""Reads the scheduler's published capacity into the gateway's `CapacityGate`, a few times a
second (`GetLoad`, about 3 ms a call on loopback), for as long as the gateway runs.

A failed read clears the gate (it lets requests through; the scheduler decides); the
next read fills it again. Each reading also gives the models' registry the context the
executors serve (`ModelRegistry.serve_within`), which a failed read leaves as it was.
With Envoy's admin address (`--envoy-admin-url`) each reading also sets the edge
admission limit in Envoy (gateway/envoy/admission.py); Envoy not answering is logged
once and leaves the gateway's own gate as the only line.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from gateway.core.capacity import CapacityGate
from gateway.core.models import ModelRegistry
from gateway.envoy.admission import EdgeAdmission, completions_margin
from radixmesh.capacity import capacity_from_proto
from radixmesh.errors import Unavailable
from services.common.logging import get_logger
from services.scheduler.client import SchedulerClient

log = get_logger(__name__)

READ_INTERVAL_S = 0.1
"""Between two reads; a burst that arrives in between is counted by the gate itself."""


async def watch_capacity(
    scheduler: SchedulerClient,
    gate: CapacityGate,
    interval_s: float = READ_INTERVAL_S,
    edge: EdgeAdmission | None = None,
    models: ModelRegistry | None = None,
) -> None:
    """Run until cancelled."""
    failing = edge_failing = False
    while True:
        asked = time.monotonic()
        try:
            load = await scheduler.get_load(timeout_s=max(1.0, 5 * interval_s))
        except grpc.aio.AioRpcError as exc:
            gate.clear()
            if not failing:
                log.info("capacity_unread", error=exc.code().name)
            failing = True
        else:
            capacities = [capacity_from_proto(c) for c in load.capacity]
            gate.update(capacities)
            if models is not None:
                models.serve_within({c.model: c.max_model_len for c in capacities})
            failing = False
        if edge is not None:
            margin = completions_margin(gate.requests_per_s(), time.monotonic() - asked)
            try:
                await edge.apply(gate.edge_headroom(), margin)
            except Unavailable as exc:
                if not edge_failing:
                    log.info("edge_limit_unset", error=str(exc))
                edge_failing = True
            else:
                edge_failing = False
        await asyncio.sleep(interval_s)
