"""The status page's points: what changed between two scrapes of the mesh's metrics."""

from __future__ import annotations

import pytest

from mesh.loadgen.scrape import Endpoint, parse_text
from mesh.observe.status import executors, series_point

SCHEDULER = """
# TYPE radixmesh_scheduler_time_to_first_token_seconds histogram
radixmesh_scheduler_time_to_first_token_seconds_bucket{{priority="interactive",le="0.1"}} {ttft_n}
radixmesh_scheduler_time_to_first_token_seconds_bucket{{priority="interactive",le="+Inf"}} {ttft_n}
radixmesh_scheduler_time_to_first_token_seconds_count{{priority="interactive"}} {ttft_n}
radixmesh_scheduler_time_to_first_token_seconds_sum{{priority="interactive"}} {ttft_sum}
# TYPE radixmesh_scheduler_finished_requests_total counter
radixmesh_scheduler_finished_requests_total{{finish_reason="stop",code="OK"}} {ok}
radixmesh_scheduler_finished_requests_total{{finish_reason="error",code="UNAVAILABLE"}} {errors}
# TYPE radixmesh_scheduler_generation_tokens_total counter
radixmesh_scheduler_generation_tokens_total {tokens}
# TYPE radixmesh_scheduler_running_requests gauge
radixmesh_scheduler_running_requests{{executor_id="exec-0",model="m"}} 3
radixmesh_scheduler_waiting_requests{{executor_id="exec-0",model="m"}} 1
radixmesh_scheduler_executor_healthy{{executor_id="exec-0",model="m"}} 1
"""
CACHE = """
# TYPE radixmesh_cache_prefix_hit_tokens_total counter
radixmesh_cache_prefix_hit_tokens_total{{executor_id="exec-0"}} {hit}
# TYPE radixmesh_cache_prefix_query_tokens_total counter
radixmesh_cache_prefix_query_tokens_total{{executor_id="exec-0"}} {query}
"""


def snapshot(**v: float) -> dict:
    return {
        "scheduler": parse_text(SCHEDULER.format(**v), "scheduler"),
        "cache": parse_text(CACHE.format(**v), "cache"),
    }


def test_a_point_is_the_increase_between_two_scrapes():
    before = snapshot(ttft_n=10, ttft_sum=1.0, ok=9, errors=1, tokens=100, hit=50, query=100)
    after = snapshot(ttft_n=14, ttft_sum=1.8, ok=12, errors=2, tokens=180, hit=110, query=200)
    point = series_point(before, after, dt_s=2.0, t_s=7.0)
    assert point["ttft_s"] == pytest.approx(0.2)
    assert point["requests_per_s"] == pytest.approx(2.0)
    assert point["output_tokens_per_s"] == pytest.approx(40.0)
    assert point["error_rate"] == pytest.approx(0.25)
    assert point["hit_rate"] == pytest.approx(0.6)
    assert (point["running"], point["waiting"], point["t"]) == (3.0, 1.0, 7.0)
    assert point["tpot_s"] is None  # not exported here: null, never 0


def test_executors_join_the_scheduler_gauges_and_the_gpu_gauges_by_index():
    snap = snapshot(ttft_n=1, ttft_sum=1, ok=1, errors=0, tokens=1, hit=1, query=1)
    snap["executor"] = parse_text(
        "# TYPE radixmesh_executor_gpu_utilization_ratio gauge\n"
        "radixmesh_executor_gpu_utilization_ratio 0.75\n",
        "executor-0",
    )
    rows = executors(snap, [Endpoint("executor-0", "http://x/metrics")])
    assert rows[0]["executor_id"] == "exec-0" and rows[0]["healthy"] is True
    assert rows[0]["gpu_utilization"] == 0.75 and rows[0]["gpu_temperature_celsius"] is None
    assert rows[0]["running_requests"] == 3.0
