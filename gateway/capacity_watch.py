"""Reads the scheduler's published capacity into the gateway's `CapacityGate`, a few times a
second (`GetLoad`, about 3 ms a call on loopback), for as long as the gateway runs.

A failed read clears the gate (it lets requests through; the scheduler decides); the
next read fills it again.
"""

from __future__ import annotations

import asyncio

import grpc

from gateway.core.capacity import CapacityGate
from radixmesh.capacity import capacity_from_proto
from services.common.logging import get_logger
from services.scheduler.client import SchedulerClient

log = get_logger(__name__)

READ_INTERVAL_S = 0.1
"""Between two reads; a burst that arrives in between is counted by the gate itself."""


async def watch_capacity(
    scheduler: SchedulerClient, gate: CapacityGate, interval_s: float = READ_INTERVAL_S
) -> None:
    """Run until cancelled."""
    failing = False
    while True:
        try:
            load = await scheduler.get_load(timeout_s=max(1.0, 5 * interval_s))
        except grpc.aio.AioRpcError as exc:
            gate.clear()
            if not failing:
                log.info("capacity_unread", error=exc.code().name)
            failing = True
        else:
            gate.update(capacity_from_proto(c) for c in load.capacity)
            failing = False
        await asyncio.sleep(interval_s)
