"""`radixmesh serve --speculative ngram`: through Envoy, the gateway, the scheduler and the
executor service, greedy outputs equal the speculation-off mesh's, and the response's usage
reports the drafts (OpenAI JSON extension and gRPC)."""

from __future__ import annotations

import json
import urllib.request

import grpc
import pytest
from e2e_mesh import API_KEY, generate, start_serve, stop_serve

from radixmesh.v1 import inference_pb2 as pb
from radixmesh.v1 import inference_pb2_grpc

PROMPTS = [
    "one two three four one two three four one two three four one two",
    "def f(x):\n    return x + 1\n\ndef f(x):\n    return x + 1\n\ndef f(",
    "the cat sat on the mat; the cat sat on the mat; the cat",
    "A quick brown fox",
]


@pytest.fixture(scope="module")
def spec_serve(tmp_path_factory):
    mesh = start_serve(
        tmp_path_factory.mktemp("serve-spec"), "--api-key", API_KEY, "--speculative", "ngram"
    )
    yield mesh
    stop_serve(mesh)


def complete_json(mesh, prompt: str) -> dict:
    body = json.dumps({"model": "", "prompt": prompt, "max_tokens": 24, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"{mesh.http}/v1/completions",
        data=body,
        headers={"content-type": "application/json", "authorization": f"Bearer {API_KEY}"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_greedy_outputs_equal_speculation_off_and_usage_reports_the_drafts(serve, spec_serve):
    plain = [complete_json(serve, p) for p in PROMPTS]
    spec = [complete_json(spec_serve, p) for p in PROMPTS]
    assert [r["choices"][0]["text"] for r in spec] == [r["choices"][0]["text"] for r in plain]
    assert all("speculation" not in r["usage"] for r in plain)
    reported = [r["usage"]["speculation"] for r in spec if "speculation" in r["usage"]]
    assert reported, "no request verified a draft"
    for usage in reported:
        assert usage["num_draft_tokens"] >= usage["num_accepted_tokens"] >= 0
        assert usage["mean_acceptance_length"] == pytest.approx(
            1 + usage["num_accepted_tokens"] / usage["num_drafts"], abs=1e-4
        )


async def test_grpc_complete_carries_the_speculation(spec_serve):
    async with grpc.aio.insecure_channel(spec_serve.grpc_target) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = pb.GenerateRequest(
            prompt=PROMPTS[0], sampling=pb.SamplingParams(max_tokens=24, temperature=0.0)
        )
        out = await generate(stub, request)
    assert out.complete.usage.completion_tokens == len(out.token_ids)
    assert out.complete.usage.HasField("speculation")
    assert out.complete.usage.speculation.num_drafts > 0


def executor_metrics(mesh) -> str:
    (port,) = [s["metrics_port"] for s in mesh.endpoints["services"] if s["name"] == "executor-0"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def test_the_speculation_switch_is_on_the_executors_metrics(serve, spec_serve):
    """A drafting executor shows its switch (decisions and probe interval) on /metrics; one
    with speculation off shows none."""
    complete_json(spec_serve, PROMPTS[0])
    page = executor_metrics(spec_serve)
    for decision in ("declined", "probe", "plain_probe"):
        assert f'radixmesh_executor_spec_switch_steps_total{{decision="{decision}"}}' in page
    assert "radixmesh_executor_spec_probe_interval_steps " in page
    assert "radixmesh_executor_spec_switch_steps" not in executor_metrics(serve)
