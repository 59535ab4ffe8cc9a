"""Request statistics: latencies from the scheduler clock, token counts, ends by reason and code.

Expected values are read back from what the sink received and when (the rig's
manual clock advances by a fixed time per step), not written down by hand.
"""

from __future__ import annotations

import itertools

import pytest
from prometheus_client import CollectorRegistry
from sched_fakes import greedy as g
from sched_fakes import make_rig

from radixmesh.sampling import Constraint, ConstraintKind, Priority
from services.scheduler.core import SchedulerConfig
from services.scheduler.core.stats import Histogram
from services.scheduler.metrics import SchedulerMetricsCollector


def test_histogram_buckets_are_inclusive_upper_bounds():
    hist = Histogram((1.0, 2.0))
    for value in (0.5, 1.0, 1.5, 2.0, 7.0):
        hist.observe(value)
    assert hist.cumulative() == [(1.0, 2), (2.0, 4), (float("inf"), 5)]
    assert (hist.count, hist.sum) == (5, 12.0)


async def test_latencies_and_token_counts_follow_the_step_results():
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1)
    rig = make_rig(config, manual_clock=True)
    rig.port.step_seconds = 0.25
    await rig.scheduler.start()
    shared = list(range(1, 13))  # three full pages
    prompts = {"a": [*shared, 20, 21], "b": [*shared, 30]}
    await rig.scheduler.submit("a", prompts["a"], g(3))
    await rig.scheduler.submit("b", prompts["b"], g(2))
    await rig.sink.wait("a", "b")
    stats, times = rig.scheduler.stats, rig.sink.token_times

    ttft = stats.time_to_first_token[Priority.INTERACTIVE]
    assert ttft.count == 2
    assert ttft.sum == pytest.approx(times["a"][0] + times["b"][0])  # both submitted at 0
    gaps = [later - earlier for r in "ab" for earlier, later in itertools.pairwise(times[r])]
    assert stats.inter_token_latency.count == len(gaps) == 3
    assert stats.inter_token_latency.sum == pytest.approx(sum(gaps))
    e2e = stats.e2e_latency[Priority.INTERACTIVE]
    assert e2e.sum == pytest.approx(sum(rig.sink.finish_times.values()))
    # one seat: b waits in the queue until a's last step result, a not at all
    queue_time = stats.queue_time[Priority.INTERACTIVE]
    assert queue_time.count == 2 and queue_time.counts[0] == 1
    assert queue_time.sum == pytest.approx(rig.sink.finish_times["a"]) and queue_time.sum > 0
    cached = [rig.sink.first[r].num_cached_tokens for r in "ab"]
    assert cached[1] > 0 and stats.cached_prompt_tokens.sum == sum(cached)
    assert stats.num_prompt_tokens == sum(len(p) for p in prompts.values())
    assert stats.num_generation_tokens == sum(len(rig.sink.tokens[r]) for r in "ab") == 5
    assert stats.num_finished == {("length", "OK"): 2}

    registry = CollectorRegistry()
    registry.register(SchedulerMetricsCollector(lambda: rig.scheduler))
    interactive = {"priority": "interactive"}
    sample = registry.get_sample_value
    assert sample("radixmesh_scheduler_time_to_first_token_seconds_count", interactive) == 2
    assert (
        sample(
            "radixmesh_scheduler_time_to_first_token_seconds_bucket", {**interactive, "le": "+Inf"}
        )
        == 2
    )
    assert sample("radixmesh_scheduler_inter_token_latency_seconds_sum") == pytest.approx(sum(gaps))
    assert sample("radixmesh_scheduler_cached_prompt_tokens_sum") == sum(cached)
    assert sample("radixmesh_scheduler_generation_tokens_total") == 5
    assert sample("radixmesh_scheduler_prompt_tokens_total") == stats.num_prompt_tokens
    assert (
        sample(
            "radixmesh_scheduler_finished_requests_total", {"finish_reason": "length", "code": "OK"}
        )
        == 2
    )
    assert sample("radixmesh_scheduler_running_by_priority", interactive) == 0
    await rig.scheduler.stop()


async def test_requests_ended_early_are_counted_by_reason_and_code():
    rig = make_rig(manual_clock=True)
    rig.port.bad_constraints = {"(": "constraint.regex: Regex parsing error"}
    await rig.scheduler.start()
    await rig.scheduler.submit("late", [1, 2, 3], g(4), deadline=1.0)
    await rig.scheduler.submit("cancelled", [1, 2, 3], g(4), priority=Priority.BATCH)
    await rig.scheduler.submit(
        "bad", [1, 2], g(4), constraint=Constraint(ConstraintKind.REGEX, "(")
    )
    await rig.scheduler.submit("ok", [4, 5], g(2))
    rig.scheduler.abort("cancelled")
    rig.clock[0] = 2.0  # before the step loop's first turn: "late" has expired
    await rig.sink.wait("late", "cancelled", "bad", "ok")
    stats = rig.scheduler.stats
    assert stats.num_finished == {
        ("error", "DEADLINE_EXCEEDED"): 1,
        ("abort", "OK"): 1,
        ("error", "INVALID_ARGUMENT"): 1,
        ("length", "OK"): 1,
    }
    assert sum(h.count for h in stats.e2e_latency.values()) == 4
    assert stats.e2e_latency[Priority.BATCH].count == 1
    assert stats.time_to_first_token[Priority.INTERACTIVE].count == 1  # only "ok" streamed
    assert stats.constraint_prepare.count == 1
    await rig.scheduler.stop()
