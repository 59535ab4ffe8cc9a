"""An executor that died comes back (readmit); a cache service that went away (cache_lost)."""

from __future__ import annotations

import asyncio

import pytest
from sched_fakes import ToyExecutor, ToyExecutorPort, greedy, make_rig, reference

from radixmesh.errors import InvalidArgument, Unavailable


async def test_a_dead_executor_is_readmitted_and_serves_again():
    rig = make_rig()
    lost: list[str] = []
    rig.scheduler.on_executor_lost = lost.append
    rig.port.fail_at_step = 2
    await rig.scheduler.start()
    await rig.scheduler.submit("a", [1, 2, 3], greedy(20))
    await rig.sink.wait("a")
    executor_id = rig.port.info.executor_id
    assert lost == [executor_id]
    with pytest.raises(Unavailable):
        await rig.scheduler.submit("refused", [1], greedy(1))
    # the restarted executor: a new process (empty KV), the same id, a fresh port
    toy = ToyExecutor(rig.toy.num_pages, rig.toy.page_size)
    rig.cache.unregister_pool(executor_id)
    rig.cache.register_pool(executor_id, "toy", toy.num_pages, toy.page_size)
    rig.scheduler.readmit(ToyExecutorPort(executor_id, toy))
    await rig.scheduler.submit("b", [4, 5, 6], greedy(6))
    await rig.sink.wait("b")
    await rig.scheduler.stop()
    assert rig.sink.finished["b"].error is None
    assert rig.sink.tokens["b"] == reference([4, 5, 6], 6)
    assert [x.healthy for x in rig.scheduler.executor_loads()] == [True]
    assert rig.stats().num_leases == 0


async def test_a_running_executor_is_not_readmitted():
    rig = make_rig()
    await rig.scheduler.start()
    with pytest.raises(InvalidArgument, match="executor_id"):
        rig.scheduler.readmit(ToyExecutorPort(rig.port.info.executor_id, rig.toy))
    await rig.scheduler.stop()


async def test_cache_lost_ends_leased_requests_and_keeps_serving():
    rig = make_rig()
    rig.port.gate = asyncio.Event()
    rig.port.gate.set()
    await rig.scheduler.start()
    await rig.scheduler.submit("running", [1, 2, 3], greedy(200))
    await rig.sink.wait_tokens("running", 2)
    rig.scheduler.cache_lost("cache restarted")
    await rig.sink.wait("running")
    err = rig.sink.finished["running"].error
    assert isinstance(err, Unavailable) and "cache service lost: cache restarted" in str(err)
    assert len(rig.sink.tokens["running"]) < 200
    # the same executor takes new work on the (new) cache at once
    await rig.scheduler.submit("next", [7, 8, 9], greedy(5))
    await rig.sink.wait("next")
    await rig.scheduler.stop()
    assert rig.sink.tokens["next"] == reference([7, 8, 9], 5)
    assert rig.stats().num_leases == 0


async def test_an_executor_whose_health_is_lost_is_failed_even_while_idle():
    rig = make_rig()
    lost: list[str] = []
    failed = asyncio.Event()

    def on_lost(executor_id: str) -> None:
        lost.append(executor_id)
        failed.set()

    rig.scheduler.on_executor_lost = on_lost
    await rig.scheduler.start()
    executor_id = rig.port.info.executor_id
    rig.scheduler.executor_lost(executor_id, "health watch failed: UNAVAILABLE")
    await asyncio.wait_for(failed.wait(), 10)
    assert lost == [executor_id] and rig.port.closed
    with pytest.raises(Unavailable):
        await rig.scheduler.submit("refused", [1], greedy(1))
    await rig.scheduler.stop()
