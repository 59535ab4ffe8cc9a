"""Percentiles, Prometheus deltas and histogram quantiles, and the report's internal consistency."""

from __future__ import annotations

import random

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from mesh.loadgen.client import RequestResult
from mesh.loadgen.report import build_report, flat_metrics, format_table, percentile, stats
from mesh.loadgen.runner import LoadRun
from mesh.loadgen.scrape import (
    Endpoint,
    delta,
    histogram_delta,
    parse_endpoints,
    parse_text,
    total,
)
from mesh.loadgen.slo import parse_slo
from radixmesh.errors import InvalidArgument


@pytest.mark.parametrize("n", [1, 2, 7, 100])
def test_percentiles_match_numpy_linear_interpolation(n):
    rng = random.Random(n)
    values = [rng.expovariate(3.0) for _ in range(n)]
    for q in (0.0, 0.5, 0.9, 0.99, 1.0):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q * 100)))
    assert stats(values)["mean"] == pytest.approx(float(np.mean(values)))
    assert stats([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def snapshot(registry: CollectorRegistry, role: str) -> dict:
    return {role: parse_text(generate_latest(registry).decode(), endpoint=f"{role}-0")}


def test_counter_deltas_add_up_label_sets_and_missing_metrics_are_none():
    registry = CollectorRegistry()
    hits = Counter("radixmesh_cache_prefix_hit_tokens", "", ["executor_id"], registry=registry)
    hits.labels("a").inc(5)
    before = snapshot(registry, "cache")
    hits.labels("a").inc(7)
    hits.labels("b").inc(3)
    after = snapshot(registry, "cache")
    assert delta(before, after, "cache", "radixmesh_cache_prefix_hit_tokens_total") == 10
    assert total(after, "cache", "radixmesh_cache_prefix_hit_tokens_total", executor_id="b") == 3
    assert delta(before, after, "cache", "radixmesh_cache_nothing_total") is None
    assert delta(before, after, "scheduler", "radixmesh_cache_prefix_hit_tokens_total") is None


def test_histogram_delta_counts_only_the_run_and_its_quantiles_fall_in_the_right_bucket():
    registry = CollectorRegistry()
    buckets = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
    ttft = Histogram(
        "radixmesh_scheduler_time_to_first_token_seconds", "", buckets=buckets, registry=registry
    )
    for _ in range(50):
        ttft.observe(5.0)  # before the run: must not count
    before = snapshot(registry, "scheduler")
    rng = random.Random(0)
    run = [rng.uniform(0.0, 0.3) for _ in range(400)]
    for v in run:
        ttft.observe(v)
    after = snapshot(registry, "scheduler")
    hist = histogram_delta(
        before, after, "scheduler", "radixmesh_scheduler_time_to_first_token_seconds"
    )
    assert hist.count == 400
    assert hist.mean == pytest.approx(sum(run) / 400)
    edges = (0.0, *buckets)
    for q in (0.5, 0.9, 0.99):
        true = float(np.percentile(run, q * 100))
        i = next(i for i, b in enumerate(buckets) if true <= b)
        assert edges[i] <= hist.quantile(q) <= edges[i + 1]


def result(
    start,
    *,
    ok=True,
    ttft=0.1,
    e2e=0.5,
    out=5,
    prompt=20,
    cached=10,
    status="ok",
    chunks=None,
    **kw,
):
    r = RequestResult(start_s=start, ok=ok, status=status, ttft_s=ttft if ok else None, e2e_s=e2e)
    r.chunk_times_s = (
        chunks if chunks is not None else ([ttft, ttft + 0.1, ttft + 0.3] if ok else [])
    )
    if ok:
        r.prompt_tokens, r.completion_tokens, r.cached_tokens = prompt, out, cached
    for k, v in kw.items():
        setattr(r, k, v)
    return r


def test_report_numbers_agree_with_each_other_and_with_the_results():
    results = [
        result(0.0, e2e=0.5),
        result(0.1, e2e=0.9, ttft=0.3, priority="batch"),
        result(0.2, ok=False, status="http_429"),
        result(0.3, ok=False, status="http_429"),
        result(0.4, ok=False, status="timeout"),
        result(0.5, is_json=True, json_valid=True, out=9),
        result(0.6, is_json=True, json_valid=False, out=9),
    ]
    report = build_report(LoadRun(results, started_s=0.0, ended_s=2.0), {}, {})
    assert report["num_requests"] == 7 == report["num_ok"] + report["num_errors"]
    assert report["errors_by_status"] == {"http_429": 2, "timeout": 1}
    assert report["error_messages"] == {
        "http_429": {"(no message)": 2},
        "timeout": {"(no message)": 1},
    }
    assert report["error_rate"] == pytest.approx(3 / 7)
    assert report["request_throughput"] == pytest.approx(4 / 2.0)
    assert report["output_tokens_per_s"] == pytest.approx((5 + 5 + 9 + 9) / 2.0)
    assert report["input_tokens_per_s"] == pytest.approx(80 / 2.0)
    assert report["prefix_reuse_rate"] == pytest.approx(0.5)
    assert report["ttft_s"]["p50"] == pytest.approx(0.1)
    assert report["e2e_s"]["mean"] == pytest.approx((0.5 + 0.9 + 0.5 + 0.5) / 4)
    assert report["p99_p50_ratio"] == pytest.approx(report["e2e_s"]["p99"] / report["e2e_s"]["p50"])
    # time per output token: (e2e - ttft) / (tokens - 1)
    expected_tpot = sorted([0.4 / 4, 0.6 / 4, 0.4 / 8, 0.4 / 8])
    assert report["tpot_s"]["mean"] == pytest.approx(sum(expected_tpot) / 4)
    assert report["itl_s"]["p50"] == pytest.approx(0.15)  # gaps 0.1 and 0.2 per request
    assert report["json"]["num_requests"] == 2 and report["json"]["schema_pass_rate"] == 0.5
    assert report["by_priority"]["batch"]["num_requests"] == 1
    # not measured: null, not zero
    for key in ("server_ttft_s", "executor_step_s", "kv_cache_hit_rate", "gpu_utilization"):
        assert report[key] is None
    assert report["gpu_memory_bytes_max"] is None
    assert report["batch_size"] == {"running_mean": None, "running_max": None, "step_mean": None}
    assert "http_429" in format_table(report)


def test_the_tail_within_a_group_is_apart_from_the_mix_of_lengths():
    """A 70/30 mix of 32- and 128-token requests: over all requests p99/p50 is the long
    requests' e2e over the short ones' (4x), within each profile it is that profile's tail."""
    short = [result(i / 100, e2e=1.0 + i / 1000, group="short") for i in range(70)]
    long = [result(i / 100, e2e=4.0 + 2 * i / 1000, group="long") for i in range(30)]
    report = build_report(LoadRun(short + long, started_s=0.0, ended_s=2.0), {}, {})
    assert report["p99_p50_ratio"] == pytest.approx(4.0, rel=0.05)
    by_group = report["p99_p50_ratio_by_group"]
    assert by_group["short"] == pytest.approx(
        float(np.percentile([r.e2e_s for r in short], 99))
        / float(np.percentile([r.e2e_s for r in short], 50))
    )
    assert by_group["long"] == pytest.approx(
        float(np.percentile([r.e2e_s for r in long], 99))
        / float(np.percentile([r.e2e_s for r in long], 50))
    )
    assert report["p99_p50_ratio_within_group"] == max(by_group.values()) < 1.1
    assert (
        flat_metrics(report)["p99_p50_ratio_within_group"] == report["p99_p50_ratio_within_group"]
    )
    # a failed request is in no group's tail
    failed = build_report(LoadRun([*short, result(0.5, ok=False, group="long")], 0.0, 2.0), {}, {})
    assert set(failed["p99_p50_ratio_by_group"]) == {"short"}


def test_every_flat_metric_is_a_valid_slo_name_and_the_report_fills_it():
    report = build_report(LoadRun([result(0.0)], 0.0, 1.0), {}, {})
    flat = flat_metrics(report)
    assert parse_slo(",".join(f"{k}=1" for k in flat), set(flat))
    assert flat["ttft_p50"] == pytest.approx(0.1) and flat["error_rate"] == 0.0
    assert flat["schema_pass_rate"] is None


def test_endpoint_specs_and_roles():
    (cache, ex) = parse_endpoints(["cache=http://127.0.0.1:9100", "executor-1=http://h:9/m"])
    assert cache == Endpoint("cache", "http://127.0.0.1:9100/metrics")
    assert (ex.role, ex.url) == ("executor", "http://h:9/m")
    with pytest.raises(InvalidArgument, match="metrics_url"):
        parse_endpoints(["127.0.0.1:9100"])


def test_json_pass_rate_counts_finished_outputs_and_truncation_apart():
    results = [
        result(0.0, is_json=True, json_valid=True, finish_reason="stop"),
        result(0.1, is_json=True, json_valid=False, finish_reason="stop"),
        result(0.2, is_json=True, json_valid=False, finish_reason="length"),
        result(0.3, is_json=True, json_valid=False, finish_reason="length"),
    ]
    js = build_report(LoadRun(results, started_s=0.0, ended_s=1.0), {}, {})["json"]
    assert js["num_finished"] == 2
    assert js["schema_pass_rate"] == 0.5  # the two truncated outputs are not failures
    assert js["truncation_rate"] == 0.5
    assert js["json_decode_latency_s"] is None  # no unconstrained requests to compare with


def test_speculation_block_from_the_executor_counters():
    def snap(drafts, tokens, accepted):
        empty = frozenset({("endpoint", "executor-0")})
        return {
            "executor": {
                ("radixmesh_executor_spec_drafts_total", empty): drafts,
                ("radixmesh_executor_spec_draft_tokens_total", empty): tokens,
                ("radixmesh_executor_spec_accepted_tokens_total", empty): accepted,
            }
        }

    report = build_report(LoadRun([result(0.0)], 0.0, 1.0), snap(10, 40, 5), snap(30, 120, 65))
    spec = report["speculation"]
    assert spec["num_drafts"] == 20 and spec["acceptance_rate"] == 60 / 80
    assert spec["mean_acceptance_length"] == 1 + 60 / 20
    assert flat_metrics(report)["spec_mean_acceptance_length"] == 4.0
    assert "mean acceptance length 4.00" in format_table(report)
    quiet = build_report(LoadRun([result(0.0)], 0.0, 1.0), snap(10, 40, 5), snap(10, 40, 5))
    assert quiet["speculation"] is None and "speculation" not in format_table(quiet)


def test_kv_hit_rate_is_what_admission_served_and_the_lookup_ratio_stays_apart():
    sched, cache = CollectorRegistry(), CollectorRegistry()
    prompt = Counter("radixmesh_scheduler_prompt_tokens", "", registry=sched)
    cached = Histogram("radixmesh_scheduler_cached_prompt_tokens", "", registry=sched)
    query = Counter("radixmesh_cache_prefix_query_tokens", "", registry=cache)
    hit = Counter("radixmesh_cache_prefix_hit_tokens", "", registry=cache)
    prompt.inc(100)  # before the run: not counted
    cached.observe(50)

    def both() -> dict:
        return {**snapshot(sched, "scheduler"), **snapshot(cache, "cache")}

    before = both()
    for n in (0, 90, 90, 90):  # a group of four 100-token prompts: the first computes 90
        prompt.inc(100)
        cached.observe(n)
        query.inc(2 * 100)  # routing's match at arrival and the lease's lookup
        hit.inc(n)  # the match at arrival found nothing: the prefix was still being computed
    report = build_report(LoadRun([result(0.0)], 0.0, 1.0), before, both())
    assert report["kv_cache_hit_rate"] == pytest.approx(270 / 400)
    assert report["kv_cache_lookup_hit_rate"] == pytest.approx(270 / 800)
    assert flat_metrics(report)["kv_cache_lookup_hit_rate"] == report["kv_cache_lookup_hit_rate"]
    only_cache = build_report(
        LoadRun([result(0.0)], 0.0, 1.0), snapshot(cache, "cache"), snapshot(cache, "cache")
    )
    assert only_cache["kv_cache_hit_rate"] is None  # no increase: nothing measured


def test_executor_steps_count_the_run_s_steps_their_time_and_tokens_by_kind():
    """The executors' steps over the run, two executors added up: what an in-process run of
    the same workload is compared on (steps, their summed seconds, prefill/decode tokens)."""
    registry = CollectorRegistry()
    seconds = Histogram("radixmesh_executor_step_seconds", "", ["executor_id"], registry=registry)
    tokens = Counter("radixmesh_executor_tokens", "", ["executor_id", "kind"], registry=registry)
    seconds.labels("e0").observe(9.0)  # before the run: not counted
    tokens.labels("e0", "prefill").inc(1000)
    before = snapshot(registry, "executor")
    for executor, step_s, prefill, decode in (("e0", 0.25, 512, 3), ("e1", 0.5, 0, 7)):
        seconds.labels(executor).observe(step_s)
        tokens.labels(executor, "prefill").inc(prefill)
        tokens.labels(executor, "decode").inc(decode)
    report = build_report(LoadRun([result(0.0)], 0.0, 1.0), before, snapshot(registry, "executor"))
    steps = report["executor_steps"]
    assert steps["count"] == 2 and steps["seconds"] == pytest.approx(0.75)
    assert steps["tokens"] == {"prefill": 512, "extend": None, "decode": 10}
    assert build_report(LoadRun([result(0.0)], 0.0, 1.0), {}, {})["executor_steps"] is None


def test_a_report_keeps_each_status_first_distinct_error_texts_with_their_counts():
    def failed(status, error):
        r = result(0.0, ok=False, status=status)
        r.error = error
        return r

    results = [failed("RESOURCE_EXHAUSTED", f"queue full: {n} waiting; retry after {n % 3} s")
               for n in range(5)]  # fmt: skip
    results += [failed("RESOURCE_EXHAUSTED", f"plan {n}: sequences exceed max_num_seqs (512)")
                for n in range(2)]  # fmt: skip
    results += [failed("RESOURCE_EXHAUSTED", text) for text in ("a", "b", "c")]
    results += [failed("UNAVAILABLE", "executor gone"), result(0.1)]
    report = build_report(LoadRun(results, started_s=0.0, ended_s=1.0), {}, {})
    assert report["error_messages"] == {
        "RESOURCE_EXHAUSTED": {
            "queue full: N waiting; retry after N s": 5,  # numbers masked: one text
            "plan N: sequences exceed max_num_seqs (N)": 2,
            "a": 1,  # the third distinct text; "b" and "c" are past the limit
        },
        "UNAVAILABLE": {"executor gone": 1},
    }
    assert "  UNAVAILABLE: executor gone (1)" in format_table(report).splitlines()
