"""`radixmesh bench` against the real `radixmesh serve` (tiny model, CPU) of the e2e session.

Runs stay under the fixture's per-key rate limit (Poisson arrivals at 3/s
against 5/s with a burst of 20), so the other e2e tests keep their bucket.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
import pytest
from e2e_mesh import API_KEY
from prometheus_client.parser import text_string_to_metric_families

from mesh.cli import main

REPO = Path(__file__).resolve().parents[2]
COMMON = ("--num-requests", "6", "--concurrency", "3", "--request-rate", "3", "--quiet")
COMMON += ("--sample-interval", "0.05", "--output-len", "8")
PREFIX = ("--system-prompt-len", "60", "--question-len", "6")
WORKLOADS = {
    "random": ("--workload", "random", "--input-len", "66"),
    "mix": ("--workload", "mix", "--profile", "short=10:4", "--profile", "long=60:8"),
    "shared-prefix": (
        "--workload",
        "shared-prefix",
        "--groups",
        "1",
        "--prompts-per-group",
        "6",
        *PREFIX,
    ),
    "multi-turn": ("--workload", "multi-turn", "--turns", "3", *PREFIX),
    "multi-turn-sessions": ("--workload", "multi-turn", "--turns", "3", "--use-sessions", *PREFIX),
    "json": ("--workload", "json", "--input-len", "12", "--json-max-tokens", "200"),
    "grpc-batch": ("--api", "grpc", "--batch-fraction", "1", "--input-len", "20"),
}
LATENCIES = ("ttft_s", "e2e_s", "tpot_s", "itl_s")
FIELDS = (
    *LATENCIES,
    *("config", "duration_s", "num_requests", "num_ok", "num_errors", "errors_by_status"),
    *("error_rate", "request_throughput", "input_tokens_per_s", "output_tokens_per_s"),
    *("total_input_tokens", "total_output_tokens", "total_cached_tokens", "p99_p50_ratio"),
    *("server_ttft_s", "executor_step_s", "batch_size", "gpu_utilization", "gpu_memory_bytes_max"),
    *("kv_cache_hit_rate", "prefix_reuse_rate", "json", "by_priority"),
)


@pytest.fixture(scope="module")
def mesh_info(serve, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bench") / "endpoints.json"
    path.write_text(json.dumps(serve.endpoints))
    return path


@pytest.fixture(scope="module")
def run_bench(serve, mesh_info, tmp_path_factory):
    """run_bench(*flags) -> (exit code, report dict)."""
    folder = tmp_path_factory.mktemp("reports")

    def run(*flags: str) -> tuple[int, dict]:
        out = folder / f"report-{len(list(folder.iterdir()))}.json"
        argv = [
            "bench",
            "--target",
            serve.http,
            "--api-key",
            API_KEY,
            "--mesh-info",
            str(mesh_info),
        ]
        code = main([*argv, "--output", str(out), *COMMON, *flags])
        return code, json.loads(out.read_text())

    return run


@pytest.fixture(scope="module")
def reports(run_bench) -> dict[str, dict]:
    """Each workload run once, in order; the tests below read them."""
    out = {}
    for name, flags in WORKLOADS.items():
        code, report = run_bench(*flags)
        assert code == 0, (name, report["errors_by_status"])
        out[name] = report
    return out


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_report_field_is_present_and_consistent(reports, name):
    report = reports[name]
    assert set(FIELDS) <= set(report)
    assert report["num_requests"] == report["num_ok"] == 6 and report["error_rate"] == 0
    assert report["errors_by_status"] == {}
    for key in LATENCIES:
        block = report[key]
        assert 0 < block["p50"] <= block["p90"] <= block["p99"], key
    assert report["ttft_s"]["p50"] <= report["e2e_s"]["p50"]
    assert report["p99_p50_ratio"] >= 1
    duration = report["duration_s"]
    assert report["output_tokens_per_s"] == pytest.approx(report["total_output_tokens"] / duration)
    assert report["request_throughput"] == pytest.approx(6 / duration)
    assert 0 <= report["total_cached_tokens"] < report["total_input_tokens"]
    assert 0 <= report["kv_cache_hit_rate"] <= 1 and 0 <= report["prefix_reuse_rate"] <= 1
    assert report["batch_size"]["step_mean"] >= 1  # from the executor's histograms
    assert 0 < report["executor_step_s"]["mean"] < report["e2e_s"]["mean"]
    assert report["gpu_utilization"] is None and report["gpu_memory_bytes_max"] is None  # CPU
    assert report["config"]["metrics_errors"] == {}


def test_shared_prefix_hits_the_cache_far_more_than_random_prompts(reports):
    shared, rand = reports["shared-prefix"], reports["random"]
    assert shared["kv_cache_hit_rate"] > 0.5
    assert shared["kv_cache_hit_rate"] > rand["kv_cache_hit_rate"] + 0.3
    assert shared["prefix_reuse_rate"] > rand["prefix_reuse_rate"] + 0.3


def test_sessions_rebuild_the_conversation_on_the_server_from_exact_tokens(reports):
    with_sessions, without = reports["multi-turn-sessions"], reports["multi-turn"]
    # only the new turn is sent, yet the server runs the whole conversation
    ratio = with_sessions["total_input_tokens"] / without["total_input_tokens"]
    assert 0.8 < ratio < 1.25
    # the stored tokens are the ones generated, so the prefix is reused further than when
    # the client resends the replies as text (re-tokenized, they may differ)
    assert with_sessions["prefix_reuse_rate"] > without["prefix_reuse_rate"]


def test_json_outputs_pass_the_schema_and_grpc_batch_requests_are_counted(reports):
    js = reports["json"]["json"]
    assert js["num_requests"] == 6 and js["schema_pass_rate"] == 1.0
    assert reports["random"]["json"] is None
    assert set(reports["grpc-batch"]["by_priority"]) == {"batch"}
    assert reports["grpc-batch"]["config"]["api"] == "grpc"


def test_an_slo_that_cannot_be_met_exits_nonzero(run_bench):
    code, report = run_bench("--input-len", "10", "--slo", "error_rate=0,ttft_p50=1us")
    assert code == 1
    assert [(s["metric"], s["passed"]) for s in report["slo"]] == [
        ("error_rate", True),
        ("ttft_p50", False),
    ]


async def test_every_metric_the_running_mesh_exports_is_documented(serve):
    documented = set(
        re.findall(r"^\| `(radixmesh_[a-z0-9_]+)`", (REPO / "docs/metrics.md").read_text(), re.M)
    )
    exported = set()
    async with aiohttp.ClientSession() as session:
        for service in serve.endpoints["services"]:
            if not service.get("metrics_port"):
                continue
            async with session.get(f"http://127.0.0.1:{service['metrics_port']}/metrics") as r:
                text = await r.text()
            for family in text_string_to_metric_families(text):
                if family.name.startswith("radixmesh_"):
                    suffix = "_total" if family.type == "counter" else ""
                    exported.add(family.name + suffix)
    assert exported, "no radixmesh metrics scraped"
    # prometheus_client's creation-time samples of counters and histograms: X_created
    undocumented = {
        name
        for name in exported - documented
        if not (name.endswith("_created") and {name[:-8], name[:-8] + "_total"} & documented)
    }
    assert not undocumented, f"add to docs/metrics.md: {sorted(undocumented)}"
