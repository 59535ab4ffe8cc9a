"""The health Watch handler at a graceful stop, driven step by step with a fake context."""

from __future__ import annotations

import asyncio

import pytest
from grpc_health.v1 import health_pb2

from services.common.health import NOT_SERVING, SERVICE_UNKNOWN, SERVING, HealthServicer

SERVICE = "radixmesh.v1.Inference"


class HeldWriteContext:
    """A Watch context whose writes finish only when `release` is set."""

    def __init__(self) -> None:
        self.written: list[int] = []
        self.writing = asyncio.Event()  # set when a write has started
        self.release = asyncio.Event()
        self._wrote = asyncio.Condition()

    async def write(self, response: health_pb2.HealthCheckResponse) -> None:
        self.written.append(response.status)
        self.writing.set()
        async with self._wrote:
            self._wrote.notify_all()
        await self.release.wait()

    def add_done_callback(self, callback) -> None:
        pass  # the call's end is not simulated here (test_runtime_shutdown.py has it)

    async def wait_written(self, num_writes: int) -> None:
        async with self._wrote:
            await self._wrote.wait_for(lambda: len(self.written) >= num_writes)


def watch(health: HealthServicer, context: HeldWriteContext, service: str = SERVICE):
    return asyncio.ensure_future(
        health.Watch(health_pb2.HealthCheckRequest(service=service), context)
    )


async def test_shutdown_during_an_in_flight_write_still_sends_not_serving():
    health = HealthServicer()
    health.set(SERVICE, SERVING)
    context = HeldWriteContext()
    watcher = watch(health, context)
    await context.writing.wait()  # SERVING is on its way, its write not finished
    health.enter_graceful_shutdown()
    context.release.set()
    await asyncio.wait_for(watcher, timeout=10)
    assert context.written == [SERVING, NOT_SERVING]


async def test_waiting_watchers_get_not_serving_then_end():
    health = HealthServicer()
    health.set(SERVICE, SERVING)
    contexts = [HeldWriteContext() for _ in range(3)]
    for context in contexts:
        context.release.set()
    watchers = [watch(health, context) for context in contexts]
    for context in contexts:
        await context.writing.wait()
    health.enter_graceful_shutdown()
    await asyncio.wait_for(asyncio.gather(*watchers), timeout=10)
    assert [context.written for context in contexts] == [[SERVING, NOT_SERVING]] * 3


@pytest.mark.parametrize(("service", "first"), [(SERVICE, NOT_SERVING), ("nope", SERVICE_UNKNOWN)])
async def test_a_watch_opened_after_shutdown_sends_one_status_and_ends(service, first):
    health = HealthServicer()
    health.set(SERVICE, SERVING)
    health.enter_graceful_shutdown()
    context = HeldWriteContext()
    context.release.set()
    await asyncio.wait_for(watch(health, context, service), timeout=10)
    assert context.written == [first]


async def test_a_change_during_a_write_is_sent_after_it():
    health = HealthServicer()
    health.set(SERVICE, NOT_SERVING)
    context = HeldWriteContext()
    watcher = watch(health, context)
    await context.writing.wait()
    health.set(SERVICE, SERVING)
    context.release.set()
    await asyncio.wait_for(context.wait_written(2), timeout=10)
    health.enter_graceful_shutdown()
    await asyncio.wait_for(watcher, timeout=10)
    assert context.written == [NOT_SERVING, SERVING, NOT_SERVING]
