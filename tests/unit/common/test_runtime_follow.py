"""Following another service's health: `serving_lost` and `follow_serving` on a real port."""

from __future__ import annotations

import asyncio

from runtime_fakes import CACHE, start_mesh

from services.common.health import follow_serving, serving_lost


async def test_serving_lost_returns_when_the_service_turns_not_serving(mesh):
    mesh.runtime.set_serving()
    lost = asyncio.create_task(serving_lost(mesh.runtime.address, CACHE))
    await asyncio.sleep(0)
    assert not lost.done()
    mesh.runtime.set_serving(False)
    reason = await asyncio.wait_for(lost, 10)
    assert reason == f"{mesh.runtime.address} reports {CACHE} NOT_SERVING"


async def test_serving_lost_returns_at_once_for_a_server_that_is_not_up():
    mesh = await start_mesh()
    address = mesh.runtime.address
    await mesh.channel.close()
    await mesh.runtime.shutdown()
    reason = await asyncio.wait_for(serving_lost(address, CACHE), 10)
    assert address in reason


async def test_follow_serving_reports_every_change_in_order(mesh):
    changes: list[tuple[bool, str]] = []
    seen = asyncio.Event()

    def on_change(serving: bool, reason: str) -> None:
        changes.append((serving, reason))
        seen.set()

    async def next_change() -> None:
        await asyncio.wait_for(seen.wait(), 10)
        seen.clear()

    follow = asyncio.create_task(follow_serving(mesh.runtime.address, CACHE, on_change))
    mesh.runtime.set_serving()
    await next_change()
    mesh.runtime.set_serving(False)
    await next_change()
    mesh.runtime.set_serving()
    await next_change()
    follow.cancel()
    assert [serving for serving, _ in changes] == [True, False, True]
    assert "NOT_SERVING" in changes[1][1]
