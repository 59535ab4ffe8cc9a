"""bench/host_overhead.py: short runs of both parts measure every decode step of the run
and every token of every stream."""

from __future__ import annotations

import asyncio
import importlib

import pytest


@pytest.mark.parametrize("k", [1, 3])
def test_the_scheduler_part_times_results_and_plans_per_step(k: int) -> None:
    bench = importlib.import_module("bench.host_overhead")
    row = asyncio.run(bench.scheduler_run(batch=4, output_len=20, prompt_len=8, k=k))
    # every request's 20 tokens came out: the steps between the first fifth and last tenth
    assert row["steps"] >= 20 - 20 // 5 - 20 // 10 - 2
    assert row["host_us"] > 0 and row["results_us"] > 0
    assert row["deliver_us"] > 0
    assert row["plan_us"] > 0 if k == 1 else row["plan_us"] >= 0


@pytest.mark.parametrize("api", ["openai", "grpc"])
def test_the_gateway_part_streams_every_token_of_every_request(api: str) -> None:
    bench = importlib.import_module("bench.host_overhead")
    row = asyncio.run(bench.gateway_run(batch=3, output_len=6, api=api))
    assert row["steps"] == 6  # each step went out once all three requests had written it
    assert row["bytes"] > 0 and row["us_per_token"] > 0 and row["us_per_request"] > 0


def test_the_wire_part_times_both_ends_of_a_columnar_result() -> None:
    bench = importlib.import_module("bench.host_overhead")
    row = bench.wire_run(batch=8, iters=3, rounds=2)
    assert row["columnar"] == 1.0  # the gRPC port's reading was timed
    assert row["executor_us"] > 0 and row["parse_us"] > 0 and row["read_us"] > 0
    assert row["bytes"] > 8 * 30  # every row's request id went out


def test_the_request_part_times_a_chat_request_and_its_parts() -> None:
    bench = importlib.import_module("bench.host_overhead")
    row = bench.request_run(iters=3, rounds=1)
    assert row["request_us"] > row["template_us"] > 0 and row["tokenize_us"] > 0


@pytest.mark.parametrize("per_message", [1, 3])
def test_the_stream_part_reads_every_row_over_grpc(per_message: int) -> None:
    bench = importlib.import_module("bench.host_overhead")
    row = asyncio.run(bench.stream_run(batch=6, steps=5, per_message=per_message))  # 6 rows each
    assert row["us_per_step"] > 0 and row["wall_us_per_step"] >= 0
