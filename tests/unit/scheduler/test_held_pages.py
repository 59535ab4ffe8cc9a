"""A context hold's pages, as the cache counts them (its kept partial page included), in
the scheduler's accounting: the executor's KV usage and the room of its batch."""

from __future__ import annotations

import asyncio

from sched_fakes import greedy, make_rig

from services.scheduler.core import SchedulerConfig
from services.scheduler.core.queue_wait import batch_capacity

PAGE = 4


async def let_loop_run(times: int = 50) -> None:
    """Give the step loop its turns (it plans at once when nothing holds it back)."""
    for _ in range(times):
        await asyncio.sleep(0)


async def test_a_held_partial_page_counts_in_the_load_and_against_the_batchs_room():
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16, page_lookahead=0)
    rig = make_rig(config, num_pages=32, page_size=PAGE)
    (ex,) = rig.scheduler._executors.values()
    await rig.scheduler.start()
    # 17 prompt tokens + 1 output, 17 committed: 4 whole pages and a partial one held
    await rig.scheduler.submit("ctx", list(range(30, 47)), greedy(1), hold_id="prog/ctx")
    await rig.sink.wait("ctx")
    assert rig.stats().num_locked_pages == 5
    assert rig.scheduler.holds.num_pages(ex.executor_id) == 5
    # two sequences that grow to 16 tokens (4 pages) each, held in their first step
    rig.port.gate = asyncio.Event()
    for i in range(2):
        await rig.scheduler.submit(f"r{i}", [80 + i, 81, 82, 83, 84], greedy(11))
    await let_loop_run()
    assert len(ex.running) == 2
    waits = rig.scheduler._queue_waits
    assert batch_capacity(ex, 16) == 32 // 4  # the whole pool
    assert waits.batch_capacity(ex) == (32 - 5) // 4  # less the held pages
    (load,) = rig.scheduler.executor_loads()
    assert load.kv_usage == (5 + sum(len(r.page_table) for r in ex.running.values())) / 32
    assert await rig.scheduler.release_hold("prog/ctx")
    assert rig.scheduler.holds.num_pages(ex.executor_id) == 0
    assert waits.batch_capacity(ex) == 32 // 4  # the same step: the hold's end is seen
    rig.port.gate.set()
    await rig.sink.wait("r0", "r1")
    await rig.scheduler.stop()


async def test_replacing_a_hold_counts_only_the_new_one():
    rig = make_rig(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8), page_size=PAGE)
    (ex,) = rig.scheduler._executors.values()
    await rig.scheduler.start()
    context = list(range(30, 40))  # 10 tokens + 1 output: 2 whole pages and a partial one
    await rig.scheduler.submit("t1", context, greedy(1), hold_id="chat")
    await rig.sink.wait("t1")
    assert rig.scheduler.holds.num_pages(ex.executor_id) == rig.stats().num_locked_pages == 3
    turn2 = [*context, *rig.sink.tokens["t1"], *range(60, 66)]  # 17 tokens: 4 + 1 partial
    await rig.scheduler.submit("t2", turn2, greedy(1), hold_id="chat")
    await rig.sink.wait("t2")
    # the new lock holds its path: 4 whole pages, its own partial page and the first
    # turn's, kept on the node the two paths share; the old lock was released
    assert rig.scheduler.holds.num_pages(ex.executor_id) == rig.stats().num_locked_pages == 6
    assert len(rig.scheduler.holds) == 1
    assert await rig.scheduler.release_hold("chat")
    assert rig.scheduler.holds.num_pages(ex.executor_id) == rig.stats().num_locked_pages == 0
    await rig.scheduler.stop()
