"""`radixmesh bench --client-processes N` and the Poisson-rate sweep with goodput."""

from __future__ import annotations

import json
import math

import pytest

from mesh.cli import main
from mesh.loadgen.client import RequestResult
from mesh.loadgen.goodput import (
    format_sweep,
    goodput,
    meets,
    parse_rates,
    request_bounds,
    summarize_sweep,
    sweep_point,
)
from mesh.loadgen.processes import merge_runs, shard_load
from mesh.loadgen.report import build_report
from mesh.loadgen.runner import LoadConfig, LoadRun
from mesh.loadgen.slo import parse_slo
from radixmesh.errors import InvalidArgument


def bench(tmp_path, url, *extra, name="report"):
    out = tmp_path / f"{name}.json"
    code = main(["bench", "--target", url, "--quiet", "--output", str(out), *extra])
    return code, (json.loads(out.read_text()) if out.exists() else None)


def test_shards_split_concurrency_budget_warmup_and_rate():
    load = LoadConfig(concurrency=10, request_rate=30.0, num_requests=7, warmup=5, seed=3)
    shards = [shard_load(load, i, 3) for i in range(3)]
    assert [s.concurrency for s in shards] == [4, 3, 3]
    assert [s.num_requests for s in shards] == [3, 2, 2]
    assert [s.warmup for s in shards] == [2, 2, 1]
    assert [s.request_rate for s in shards] == [10.0, 10.0, 10.0]
    assert len({s.seed for s in shards}) == 3  # independent arrival streams
    unbounded = shard_load(LoadConfig(concurrency=4, num_requests=None, duration_s=5), 1, 2)
    assert math.isinf(unbounded.request_rate) and unbounded.num_requests is None


@pytest.mark.parametrize(
    ("load", "count", "message"),
    [
        (LoadConfig(concurrency=2), 3, "concurrency of at least 3"),
        (LoadConfig(concurrency=8, num_requests=2), 4, "num_requests >= 4"),
        (LoadConfig(concurrency=8), 0, r"must be in \[1, 256\]"),
    ],
)
def test_a_load_too_small_to_split_names_the_flag(load, count, message):
    with pytest.raises(InvalidArgument, match=f"client_processes: .*{message}"):
        shard_load(load, 0, count)


def _result(start: float, e2e: float, ttft: float = 0.01, ok: bool = True) -> RequestResult:
    return RequestResult(start_s=start, ok=ok, e2e_s=e2e, ttft_s=ttft, completion_tokens=3)


def test_merged_percentiles_are_of_the_merged_samples_not_averaged():
    fast = LoadRun([_result(0.0, 0.1 * (i + 1)) for i in range(9)], 10.0, 12.0)
    slow = LoadRun([_result(0.0, 5.0)], 10.5, 20.0)
    merged = merge_runs([fast, slow])
    assert (merged.started_s, merged.ended_s) == (10.0, 20.0)
    report = build_report(merged, {}, {})
    assert report["num_requests"] == 10
    # ten samples: p50 between the 5th and 6th fastest; the mean of the two p50s is 2.75
    assert report["e2e_s"]["p50"] == pytest.approx(0.55)
    assert report["e2e_s"]["p99"] == pytest.approx(0.9 + 0.91 * (5.0 - 0.9))
    assert report["request_throughput"] == pytest.approx(1.0)


def test_two_client_processes_send_the_same_scripts_as_one(tmp_path, threaded_fake):
    flags = ("--workload", "random", "--input-len", "6", "--output-len", "3")
    flags += ("--num-requests", "12", "--concurrency", "4", "--seed", "5")
    with threaded_fake(reply_words=3) as (fake, url):
        code1, one = bench(tmp_path, url, *flags, name="one")
        single = sorted(json.dumps(b["messages"]) for b in fake.bodies)
        fake.bodies.clear()
        code2, two = bench(tmp_path, url, *flags, "--client-processes", "2", name="two")
        spread = sorted(json.dumps(b["messages"]) for b in fake.bodies)
    assert code1 == code2 == 0
    assert two["config"]["client_processes"] == 2 and two["num_ok"] == 12 == one["num_ok"]
    assert spread == single
    assert two["total_output_tokens"] == one["total_output_tokens"] == 36
    assert two["goodput"] == pytest.approx(two["request_throughput"])  # no latency bound


def test_a_sweep_reports_goodput_per_offered_rate(tmp_path, threaded_fake):
    flags = ("--workload", "random", "--input-len", "4", "--output-len", "2")
    flags += ("--num-requests", "8", "--concurrency", "4", "--request-rate", "20,40")
    with threaded_fake(reply_words=2) as (_, url):
        code, report = bench(tmp_path, url, *flags, "--slo", "ttft_p99=5s,e2e_p99=10s")
        missed, unmet = bench(tmp_path, url, *flags, "--slo", "ttft_p99=1us", name="missed")
    assert code == 0
    sweep = report["sweep"]
    assert [p["offered_rate"] for p in sweep["points"]] == [20.0, 40.0]
    assert all(
        p["slo_met"] and p["goodput"] > 0 and p["num_requests"] == 8 for p in sweep["points"]
    )
    assert sweep["max_rate_meeting_slo"] == 40.0
    assert sweep["request_bounds_s"] == {"ttft": 5.0, "e2e": 10.0}
    assert missed == 1
    assert unmet["sweep"]["max_rate_meeting_slo"] is None
    assert [p["goodput"] for p in unmet["sweep"]["points"]] == [0.0, 0.0]


def test_goodput_counts_requests_within_every_bound():
    bounds = request_bounds(parse_slo("ttft_p99=0.5s,ttft_p50=0.2s,e2e_p99=2s,error_rate=1%",
                                      {"ttft_p99", "ttft_p50", "e2e_p99", "error_rate"}))  # fmt: skip
    assert bounds == {"ttft": 0.2, "e2e": 2.0}  # the tightest bound of each latency
    results = [
        _result(0, 1.0, ttft=0.1),
        _result(0, 1.0, ttft=0.3),  # TTFT over
        _result(0, 3.0, ttft=0.1),  # e2e over
        _result(0, 1.0, ttft=0.1, ok=False),
        RequestResult(start_s=0, ok=True, e2e_s=1.0, ttft_s=None),  # no output: no TTFT
    ]
    assert [meets(r, bounds) for r in results] == [True, False, False, False, False]
    assert goodput(results, 2.0, bounds) == 0.5
    assert goodput(results, 2.0, {}) == 2.0  # every successful request


@pytest.mark.parametrize(
    ("text", "expected"),
    [("inf", (math.inf,)), ("12.5", (12.5,)), ("10, 20,40", (10.0, 20.0, 40.0))],
)
def test_rates_parse(text, expected):
    assert parse_rates(text) == expected


@pytest.mark.parametrize("text", ["0", "-1", "fast", "40,20", "", "nan"])
def test_bad_rates_name_the_flag(text):
    with pytest.raises(InvalidArgument, match="request_rate"):
        parse_rates(text)


def test_bad_rates_and_processes_exit_2(tmp_path, capsys):
    assert main(["bench", "--target", "http://127.0.0.1:1", "--request-rate", "x"]) == 2
    assert capsys.readouterr().err.startswith("radixmesh bench: --request-rate: ")
    argv = ["bench", "--target", "http://127.0.0.1:1", "--concurrency", "2"]
    assert main([*argv, "--client-processes", "4"]) == 2
    assert "--client-processes: 4 processes need a concurrency" in capsys.readouterr().err


def test_goodput_and_the_sweep_count_the_time_held_for_a_slot():
    bounds = {"ttft": 0.5}
    sent_on_time = _result(0, 1.0, ttft=0.3)
    held = _result(0, 1.0, ttft=0.3)
    held.held_s = 0.4  # arrived 0.4 s before its send: 0.7 s to its first token
    assert meets(sent_on_time, bounds) and not meets(held, bounds)
    report = {"request_throughput": 90.0, "num_requests": 100, "error_rate": 0.0}
    on_time = sweep_point(100.0, {**report, "held_share": 0.0}, 90.0, True)
    held_back = sweep_point(200.0, {**report, "held_share": 0.3}, 90.0, True)
    assert on_time["slo_met"] and on_time["offered"]
    assert not held_back["slo_met"] and not held_back["offered"]  # latencies from the send
    assert summarize_sweep([on_time, held_back], bounds)["max_rate_meeting_slo"] == 100.0
    assert "not offered: 30% held" in format_sweep(summarize_sweep([held_back], bounds))
