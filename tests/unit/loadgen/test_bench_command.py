"""`radixmesh bench` end to end against the fake OpenAI server and its metrics endpoint."""

from __future__ import annotations

import json
from concurrent import futures

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mesh.cli import main
from radixmesh.v1 import inference_pb2, inference_pb2_grpc
from services.common.config import free_port


def bench(tmp_path, url, *extra, name="report"):
    out = tmp_path / f"{name}.json"
    argv = [
        "bench",
        *("--target", url, "--quiet", "--output", str(out)),
        *("--metrics-url", f"cache={url}/metrics", "--metrics-url", f"scheduler={url}/metrics"),
        *("--sample-interval", "0.05"),
        *extra,
    ]
    code = main(argv)
    return code, (json.loads(out.read_text()) if out.exists() else None)


def counter_value(fake, name: str) -> float:
    from prometheus_client import generate_latest

    for family in text_string_to_metric_families(generate_latest(fake.registry).decode()):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise KeyError(name)


SMALL = ("--system-prompt-len", "40", "--question-len", "5", "--output-len", "4")


def test_shared_prefix_run_reports_every_field_and_a_high_hit_rate(tmp_path, threaded_fake):
    with threaded_fake(reply_words=4, token_delay_s=0.002) as (fake, url):
        code, report = bench(
            tmp_path, url, "--workload", "shared-prefix", "--groups", "2", "--prompts-per-group",
            "4", *SMALL, "--num-requests", "16", "--concurrency", "4", "--warmup", "2",
            "--plot", str(tmp_path / "plots"),
        )  # fmt: skip
        hits = counter_value(fake, "radixmesh_cache_prefix_hit_tokens_total")
        queries = counter_value(fake, "radixmesh_cache_prefix_query_tokens_total")
        num_bodies = len(fake.bodies)
    assert code == 0
    assert num_bodies == 18 and report["num_requests"] == 16 == report["num_ok"]
    assert report["config"]["model"] == "fake-model"
    assert report["kv_cache_hit_rate"] > 0.6
    # every request after warmup saw its prefix counted by the fake; both ratios say the same
    assert report["kv_cache_hit_rate"] == pytest.approx(report["prefix_reuse_rate"])
    assert report["total_input_tokens"] < queries and report["total_cached_tokens"] < hits
    assert report["server_ttft_s"]["mean"] == pytest.approx(0.002)
    assert report["ttft_s"]["p50"] >= 0.002
    assert 1 <= report["batch_size"]["running_max"] <= 4
    assert report["gpu_utilization"] is None and report["gpu_memory_bytes_max"] is None
    assert report["output_tokens_per_s"] == pytest.approx(16 * 4 / report["duration_s"])
    plots = sorted(p.rsplit("/", 1)[1] for p in report["plots"])
    assert plots == ["latency_cdf.png", "queue_depth.png", "throughput.png"]
    for path in report["plots"]:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_random_prompts_reuse_far_less_than_shared_prefixes(tmp_path, threaded_fake):
    with threaded_fake() as (_fake, url):
        _, shared = bench(
            tmp_path, url, "--workload", "shared-prefix", *SMALL, "--num-requests", "16", name="s"
        )
    with threaded_fake() as (_fake, url):
        _, rand = bench(
            tmp_path,
            url,
            "--workload",
            "random",
            "--input-len",
            "45",
            "--num-requests",
            "16",
            name="r",
        )
    assert rand["kv_cache_hit_rate"] < 0.2 < 0.6 < shared["kv_cache_hit_rate"]


def test_json_run_validates_outputs_against_the_schema(tmp_path, threaded_fake):
    with threaded_fake(bad_json_every=4) as (fake, url):
        code, report = bench(
            tmp_path, url, "--workload", "json", "--num-requests", "8", "--input-len", "5"
        )
    assert code == 0
    assert all("response_format" in b for b in fake.bodies)
    assert report["json"]["num_requests"] == 8
    assert report["json"]["schema_pass_rate"] == pytest.approx(0.75)


def test_slo_misses_exit_nonzero_and_are_listed(tmp_path, threaded_fake, capsys):
    with threaded_fake(fail_every=5) as (_fake, url):
        code, report = bench(
            tmp_path, url, "--num-requests", "10", "--input-len", "5",
            "--slo", "ttft_p99=10s,error_rate=0.01,ttft_p50=1us",
        )  # fmt: skip
    assert code == 1
    assert [(s["metric"], s["passed"]) for s in report["slo"]] == [
        ("ttft_p99", True),
        ("error_rate", False),
        ("ttft_p50", False),
    ]
    assert report["errors_by_status"] == {"http_429": 2}
    assert "SLO FAIL  error_rate" in capsys.readouterr().out


def test_slo_met_exits_zero(tmp_path, threaded_fake):
    with threaded_fake() as (_fake, url):
        code, report = bench(
            tmp_path,
            url,
            "--num-requests",
            "4",
            "--input-len",
            "5",
            "--slo",
            "e2e_p99=30s,error_rate=0",
        )
    assert code == 0 and all(s["passed"] for s in report["slo"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--slo", "nope=1"], "--slo: unknown metric 'nope'"),
        (["--concurrency", "0"], "--concurrency: must be >= 1, got 0"),
        (["--num-requests", "0"], "--num-requests: must be >= 1, got 0"),
        (["--duration", "-1"], "--duration: must be > 0, got -1.0"),
        (["--turns", "0"], "--turns: must be >= 1, got 0"),
        (["--workload", "mix", "--mix", "70%tiny"], "--mix: unknown profile 'tiny'"),
        (["--profile", "short=8"], "--profile: expected name=in:out, got 'short=8'"),
        (["--metrics-url", "localhost:9"], "--metrics-url: expected name=http://host:port"),
        (["--baseline-alpha", "1"], "--baseline-alpha: must be in (0, 1), got 1.0"),
        (["--baseline-min-change", "-0.5"], "--baseline-min-change: must be >= 0, got -0.5"),
        (["--target", "notaurl"], "--target: expected a URL such as http://127.0.0.1:8080, got 'notaurl'"),
        (["--target", "127.0.0.1:9"], "--target: expected a URL such as http://127.0.0.1:8080, got '127.0.0.1:9'"),
        (["--target", "http://127.0.0.1:99999"], "--target: expected a URL such as http://127.0.0.1:8080"),
        (["--api", "grpc", "--target", "nohost"], "--target: expected a URL such as 127.0.0.1:8080, got 'nohost'"),
        (["--workload", "program", "--target", "notaurl"], "--target: expected a URL such as 127.0.0.1:8080, got 'notaurl'"),
        (["--workload", "program", "--num-requests", "-1"], "--num-requests: must be >= 1, got -1"),
        (["--workload", "program", "--program-repeats", "0"], "--program-repeats: must be >= 1, got 0"),
        (["--workload", "program", "--program-modes", "x"], "--program-modes: 'x' is not one of server, client"),
        (["--workload", "program", "--output-len", "0"], "--output-len: must be >= 1, got 0"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(tmp_path, flags, message, capsys):
    code, report = bench(tmp_path, "http://127.0.0.1:9", *flags)
    assert (code, report) == (2, None)
    err = capsys.readouterr().err
    assert err.startswith(f"radixmesh bench: {message}") and err.count("\n") == 1, err


def test_no_successful_request_exits_3(tmp_path, threaded_fake, capsys):
    with threaded_fake(fail_every=1) as (_fake, url):
        code, report = bench(tmp_path, url, "--num-requests", "3", "--input-len", "5")
    assert code == 3
    assert report["num_ok"] == 0 and report["errors_by_status"] == {"http_429": 3}
    assert report["error_rate"] == 1.0 and report["ttft_s"]["p50"] is None
    assert "no request succeeded" in capsys.readouterr().err


def test_an_unreachable_target_exits_3_naming_it_and_the_reason(tmp_path, capsys):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    code, report = bench(tmp_path, url, "--num-requests", "1")
    assert (code, report) == (3, None)
    assert capsys.readouterr().err == (
        f"radixmesh bench: cannot list the models at {url}/v1/models: "
        f"cannot connect to 127.0.0.1:{port}: connection refused\n"
    )


@pytest.mark.parametrize(
    "flags",
    [["--api", "grpc"], ["--workload", "program", "--program-repeats", "1"]],
    ids=["grpc", "program"],
)
def test_an_unreachable_grpc_target_fails_at_once_naming_it_and_the_reason(tmp_path, capsys, flags):
    port = free_port()
    code, report = bench(tmp_path, f"http://127.0.0.1:{port}", "--num-requests", "1", *flags)
    assert (code, report) == (3, None)
    out = capsys.readouterr()
    assert out.err == f"radixmesh bench: cannot connect to 127.0.0.1:{port}: connection refused\n"
    assert "errors" not in out.out  # no table of failed rows


class RefusingInference(inference_pb2_grpc.InferenceServicer):
    """Lists a model, refuses every generation: a gateway whose executors are all gone."""

    def ListModels(self, request, context):
        return inference_pb2.ListModelsResponse(models=[inference_pb2.ModelCard(id="tiny")])

    def Generate(self, request, context):
        context.abort(grpc.StatusCode.UNAVAILABLE, "no executor serves model 'tiny'")


def test_a_program_run_where_nothing_succeeds_exits_3_with_the_first_error(tmp_path, capsys):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    inference_pb2_grpc.add_InferenceServicer_to_server(RefusingInference(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        code, _ = bench(
            tmp_path, f"http://127.0.0.1:{port}", "--workload", "program",
            "--programs", "select", "--program-modes", "client", "--num-requests", "2",
            "--concurrency", "1",
        )  # fmt: skip
    finally:
        server.stop(None)
    assert code == 3
    assert capsys.readouterr().err == (
        f"radixmesh bench: no program succeeded at 127.0.0.1:{port}: "
        "UNAVAILABLE: no executor serves model 'tiny'\n"
    )
