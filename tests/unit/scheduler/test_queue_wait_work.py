"""The queue-wait estimate in work: a request weighs the steps it asks for, a fresh run is
read at its own speed, and the work totals behind the estimate stay exact."""

from __future__ import annotations

import asyncio
import random

from sched_fakes import greedy, make_rig, run_checked

from radixmesh.errors import ResourceExhausted
from radixmesh.retry_after import retry_after_of
from radixmesh.sampling import Priority, SamplingParams
from services.scheduler.core import SchedulerConfig
from services.scheduler.core.queue import WaitQueue, final_pages, request_work
from services.scheduler.core.queue_wait import MIN_SPAN_S, QueueWaitConfig, Rate, Throughput
from services.scheduler.core.request import Request

BOUND_S = 2.0


def request(req_id: str, num_prompt_tokens: int, max_tokens: int | None) -> Request:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return Request(req_id, list(range(1, num_prompt_tokens + 1)), sampling, arrival_time=0.0)


def test_a_request_weighs_its_steps_in_the_batch():
    # a prompt within one chunk: its prefill step samples the first token
    assert request_work(request("a", 20, 4), 64, 512) == 4
    assert request_work(request("b", 20, 400), 64, 512) == 400  # 100 times the first
    assert request_work(request("c", 130, 4), 64, 512) == 3 + 3  # three prefill chunks
    assert request_work(request("d", 20, None), 64, 512) == 1 + 491  # to the context's end
    assert request_work(request("e", 500, 400), 64, 512) == 8 + 11  # within the context
    assert request_work(request("f", 20, None), 64, None) == 1  # no context limit known


def test_a_fresh_run_is_read_over_its_own_span_then_over_the_window():
    throughput = Throughput(QueueWaitConfig(window_s=10, min_finished=4))
    # 100 requests that arrived at 0 finished by 0.5 s: 200/s, not 100 / 10 s
    throughput.note_finished(0.5, work=4, arrival_time=0.0, count=100)
    assert throughput.rate(0.5) == Rate(200.0, 800.0)
    throughput.note_finished(4.0, work=4, arrival_time=3.0, count=100)
    assert throughput.rate(4.0) == Rate(50.0, 200.0)  # the same run, 4 s old
    assert throughput.rate(12.0) == Rate(10.0, 40.0)  # older than the window: over it
    # idle for a whole window: the next finish starts a new run, read from its arrival
    throughput.note_finished(40.0, work=2, arrival_time=39.0, count=8)
    assert throughput.rate(40.0) == Rate(8.0, 16.0)


async def warm_rig(max_num_seqs: int = 4):
    """A fresh executor that served eight short requests (work 2 each) in its first 0.5 s,
    then is held so that what comes next queues up."""
    config = SchedulerConfig(
        max_num_batched_tokens=64, max_num_seqs=max_num_seqs, max_queue_wait_s=BOUND_S
    )
    rig = make_rig(config, manual_clock=True, num_pages=64)
    rig.port.step_seconds = 0.05
    await rig.scheduler.start()
    for i in range(8):
        await rig.scheduler.submit(f"warm{i}", [i + 1, 2], greedy(2))
    await rig.sink.wait(*(f"warm{i}" for i in range(8)))
    assert rig.clock[0] <= 0.5
    rig.port.gate = asyncio.Event()
    return rig


async def submit_all(rig, prefix: str, num_requests: int, max_tokens: int):
    accepted, refused = [], []
    for i in range(num_requests):
        req_id = f"{prefix}{i}"
        try:
            await rig.scheduler.submit(req_id, [i + 1, 3], greedy(max_tokens))
            accepted.append(req_id)
        except ResourceExhausted as exc:
            refused.append(str(exc))
    return accepted, refused


async def test_a_fresh_executor_is_judged_at_its_real_speed():
    """Measured over the whole 10 s window its eight requests read as 0.8/s and a burst
    of 40 would be refused past the fifth; at its real speed it clears them within the
    bound, so all are admitted (and served)."""
    rig = await warm_rig()
    accepted, refused = await submit_all(rig, "b", 40, 2)
    assert refused == [] and len(accepted) == 40
    wait = rig.scheduler.estimated_queue_wait_s()
    assert wait is not None and 0.0 < wait <= BOUND_S  # a real queue, within the bound
    rig.port.gate.set()
    await rig.sink.wait(*accepted, timeout=30)
    await rig.scheduler.stop()
    assert all(rig.sink.finished[r].error is None for r in accepted)


async def test_after_short_requests_a_burst_of_long_ones_is_refused_on_their_work():
    """The same warm-up, then 40 requests asking 100 tokens each: counted as requests at
    the warm-up's 32/s they would all be admitted; in work each is 50 warm-up requests
    and the batch's overflow is refused at once."""
    rig = await warm_rig()
    accepted, refused = await submit_all(rig, "long", 40, 100)
    assert 0 < len(accepted) <= 5 and len(refused) == 40 - len(accepted)
    assert all(m.startswith("overloaded: estimated queue wait ") for m in refused)
    assert all(f"exceeds the interactive bound of {BOUND_S:g}s" in m for m in refused)
    assert all(retry_after_of(m) for m in refused)
    rig.port.gate.set()
    await rig.sink.wait(*accepted, timeout=30)
    await rig.scheduler.stop()
    assert all(len(rig.sink.tokens[r]) == 100 for r in accepted)


def test_the_queues_work_totals_follow_push_and_remove():
    rng = random.Random(11)
    queue = WaitQueue(SchedulerConfig(max_num_batched_tokens=16), page_size=4, max_model_len=64)
    requests = []
    for i in range(300):
        max_tokens = rng.choice([None, 1, 4, 40, 400])
        req = request(f"r{i}", rng.randrange(1, 60), max_tokens)
        req.priority = rng.choice(list(Priority))
        requests.append(req)
    for step in range(2000):
        req = rng.choice(requests)
        if rng.random() < 0.55:
            queue.push(req)  # again while queued: counted once
        else:
            queue.remove(req.req_id)  # not queued: nothing changes
        if step % 97 == 0 or step == 1999:
            left = list(queue)
            expected = {p: sum(queue.work(r) for r in left if r.priority is p) for p in Priority}
            assert queue.work_by_priority() == expected
            for p in Priority:
                ahead = [r for r in left if r.priority <= p]
                assert queue.ahead_of(p) == (len(ahead), sum(queue.work(r) for r in ahead))
                pages = sum(final_pages(r, 4, 64) for r in ahead)
                assert queue.pages_ahead_of(p) == pages
    for req in requests:
        queue.remove(req.req_id)
    assert queue.work_by_priority() == dict.fromkeys(Priority, 0)
    assert all(queue.pages_ahead_of(p) == 0 for p in Priority)


def test_the_windows_work_follows_finishes_and_the_slide():
    rng = random.Random(5)
    config = QueueWaitConfig(window_s=2.0, min_finished=1)
    throughput = Throughput(config)
    finished: list[tuple[float, int]] = []
    now = 0.0
    for _ in range(3000):
        now += rng.choice([0.0, 0.001, 0.05, 0.4])
        work = rng.randrange(1, 500)
        throughput.note_finished(now, work, arrival_time=0.0)
        finished.append((now, work))
        in_window = [w for t, w in finished if t > now - config.window_s]
        span = max(MIN_SPAN_S, min(config.window_s, now))  # the run started at 0
        assert throughput.rate(now) == Rate(len(in_window) / span, sum(in_window) / span)


async def test_the_work_ahead_stays_exact_through_admission_preemption_and_finish():
    config = SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=8, max_queue_wait_s=None)
    rig = make_rig(config, num_pages=24)  # tight: requests grow, finish, get preempted
    waits = rig.scheduler._queue_waits
    (ex,) = rig.scheduler._executors.values()
    checked = 0

    def compare() -> None:
        nonlocal checked
        queued = list(ex.queue)
        for p in Priority:
            ahead = [r for r in queued if r.priority <= p]
            assert ex.queue.ahead_of(p) == (len(ahead), sum(ex.queue.work(r) for r in ahead))
            assert ex.queue.pages_ahead_of(p) == sum(ex.queue.pages(r) for r in ahead)
        running_work = sum(ex.queue.work(r) for r in ex.running.values())
        assert waits._batch(ex)[1] == running_work
        checked += 1

    await run_checked(rig, compare, classes=tuple(Priority)[:3])
    assert rig.scheduler.num_preemptions > 0  # the queue saw requests come back
    assert checked > 24
    assert ex.queue.work_by_priority() == dict.fromkeys(Priority, 0)
    assert waits._batch(ex)[1] == 0
