"""The rendered Envoy config against the real Envoy binary, with tiny HTTP and gRPC backends."""

from __future__ import annotations

import asyncio
import json
import sys

import grpc
import openai
import pytest
from aiohttp import web

from gateway.core.tokenizer import Tokenizer
from gateway.envoy import GatewayAddress, RateLimit, render_envoy_config
from gateway.envoy.process import validate_config
from radixmesh.errors import InvalidArgument
from radixmesh.v1 import inference_pb2, inference_pb2_grpc
from services.common.config import free_port
from services.common.health import wait_for_serving
from tests.fixtures.envoy import EdgeEnvoy, FakeGateway, http_call, start_envoy
from tests.fixtures.gateway_fakes import make_model_folder, running_fake_scheduler


class FakeInference(inference_pb2_grpc.InferenceServicer):
    """Answers Generate with two chunks and a Complete, echoing the prompt."""

    async def Generate(self, request, context):
        for i, word in enumerate(request.prompt.split()):
            yield inference_pb2.GenerateResponse(
                request_id="r1", chunk=inference_pb2.Chunk(index=0, text=word, token_ids=[i])
            )
        usage = inference_pb2.Usage(prompt_tokens=3, completion_tokens=2, cached_tokens=1)
        yield inference_pb2.GenerateResponse(
            request_id="r1",
            complete=inference_pb2.Complete(index=0, finish_reason="stop", usage=usage),
        )

    async def Tokenize(self, request, context):
        if not request.prompt:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt: must not be empty")
        return inference_pb2.TokenizeResponse(token_ids=[len(request.prompt)], max_model_len=64)


class Backends(FakeGateway):
    """The fake Inference servicer; an OpenAI route that echoes what it got."""

    def __init__(self) -> None:
        super().__init__(FakeInference())
        self.http_requests: list[tuple[str, str, dict]] = []

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.http_requests.append((request.method, request.path, body))
        return web.json_response(
            {"echo": body, "x_request_id": request.headers.get("x-request-id")}
        )


@pytest.fixture(scope="module")
def backends():
    with Backends() as b:
        yield b


def start_edge(tmp_path, backends, rate_limit: RateLimit | None) -> EdgeEnvoy:
    return start_envoy(tmp_path, backends.address, validate=True, rate_limit=rate_limit)


@pytest.fixture(scope="module")
def envoy(tmp_path_factory, backends):
    proc = start_edge(tmp_path_factory.mktemp("envoy"), backends, RateLimit(1000, 1.0))
    yield proc
    assert proc.stop() == 0


def http(method: str, url: str, body: dict | None = None) -> tuple[int, dict, bytes]:
    return http_call(method, url, None if body is None else json.dumps(body).encode())


def test_rendered_config_validates_and_bad_one_does_not(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(
        render_envoy_config(
            8080, 9901, ["gateway:50051:8000", "gateway-2:50051:8000"], rate_limit=(100, 1.0)
        )
    )
    validate_config(good)
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("codec_type: AUTO", "codec_type: SIDEWAYS"))
    with pytest.raises(InvalidArgument, match="SIDEWAYS"):
        validate_config(bad)


def test_render_rejects_bad_arguments():
    with pytest.raises(InvalidArgument, match="public_port"):
        render_envoy_config(0, 9901, ["g:1:2"])
    with pytest.raises(InvalidArgument, match="gateway_addresses"):
        render_envoy_config(8080, 9901, ["g:1"])
    with pytest.raises(InvalidArgument, match=r"rate_limit\.max_tokens"):
        render_envoy_config(8080, 9901, ["g:1:2"], rate_limit=(0, 1.0))


def test_openai_route_proxies_to_the_http_backend(envoy, backends):
    base = f"http://127.0.0.1:{envoy.public_port}"
    status, _, raw = http("POST", f"{base}/v1/chat/completions", {"model": "tiny", "messages": []})
    assert status == 200
    answer = json.loads(raw)
    assert answer["echo"] == {"model": "tiny", "messages": []}
    assert answer["x_request_id"]  # Envoy stamps a request id
    assert backends.http_requests[-1][:2] == ("POST", "/v1/chat/completions")
    status, _, raw = http("GET", f"{base}/v1/models")
    assert status == 200 and json.loads(raw)["data"][0]["id"] == "tiny"
    status, headers, raw = http("GET", f"{base}/nowhere")
    assert status == 404 and json.loads(raw)["error"]["code"] == "not_found"
    assert headers["content-type"] == "application/json"


def test_grpc_route_and_json_transcoding(envoy):
    with grpc.insecure_channel(f"127.0.0.1:{envoy.public_port}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        responses = list(stub.Generate(inference_pb2.GenerateRequest(prompt="a b"), timeout=10))
        assert [r.chunk.text for r in responses[:2]] == ["a", "b"]
        assert responses[2].complete.finish_reason == "stop"
        with pytest.raises(grpc.RpcError) as info:
            stub.Tokenize(inference_pb2.TokenizeRequest(prompt=""), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # POST /v1/generate: newline-delimited JSON, one GenerateResponse per line.
    status, _, raw = http(
        "POST", f"http://127.0.0.1:{envoy.public_port}/v1/generate", {"prompt": "x y"}
    )
    assert status == 200
    lines = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    assert [line["chunk"]["text"] for line in lines[:2]] == ["x", "y"]
    assert lines[2]["complete"]["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "cached_tokens": 1,
    }
    status, _, raw = http(
        "POST", f"http://127.0.0.1:{envoy.public_port}/v1/tokenize", {"prompt": ""}
    )
    assert status == 400 and "prompt" in raw.decode()


def test_admin_serves_prometheus_stats(envoy):
    text = envoy.admin_get("/stats/prometheus")
    assert "envoy_cluster_upstream_rq_total" in text
    assert 'envoy_cluster_health_check_success{envoy_cluster_name="gateway_grpc"}' in text


def test_rate_limit_answers_429_and_resource_exhausted(tmp_path, backends):
    envoy = start_edge(tmp_path, backends, RateLimit(max_tokens=3, fill_interval_s=3600))
    try:
        url = f"http://127.0.0.1:{envoy.public_port}/v1/models"
        results = [http("GET", url) for _ in range(4)]
        assert [status for status, _, _ in results] == [200, 200, 200, 429]
        assert results[3][1].get("x-local-rate-limit") == "true"
        assert json.loads(results[3][2])["error"]["code"] == "resource_exhausted"
        with grpc.insecure_channel(f"127.0.0.1:{envoy.public_port}") as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.Tokenize(inference_pb2.TokenizeRequest(prompt="x"), timeout=10)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        assert envoy.stop() == 0
    # The access log is flushed on exit: one JSON object per request.
    entries = envoy.access_log()
    http_entries = [e for e in entries if e["path"] == "/v1/models"]
    assert [e["status"] for e in http_entries] == [200, 200, 200, 429]
    assert all(e["method"] == "GET" and e["duration_ms"] >= 0 for e in http_entries)


async def test_whole_edge_envoy_gateway_process_fake_scheduler(tmp_path):
    """Envoy -> `python -m gateway.main` -> a fake scheduler: health checks, OpenAI, transcoding."""
    folder = make_model_folder(tmp_path / "tiny")
    tokenizer = Tokenizer.from_folder(folder)
    async with running_fake_scheduler(tokenizer) as (scheduler, scheduler_address):
        grpc_port, http_port = free_port(), free_port()
        gateway = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.main", f"--port={grpc_port}", f"--http-port={http_port}",
            f"--model={folder}", "--model-name=tiny", f"--scheduler-address={scheduler_address}",
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            await wait_for_serving(f"127.0.0.1:{grpc_port}", "", timeout=120)
            address = GatewayAddress("127.0.0.1", grpc_port, http_port)
            envoy = await asyncio.to_thread(
                start_envoy, tmp_path, address, keep_access_log=False
            )
            public_port = envoy.public_port
            try:
                clusters = await asyncio.to_thread(envoy.admin_get, "/clusters")
                flags = [
                    line.rsplit("::", 1)[1]
                    for line in clusters.splitlines()
                    if "health_flags" in line
                ]
                assert flags == ["healthy", "healthy"]
                client = openai.AsyncOpenAI(
                    base_url=f"http://127.0.0.1:{public_port}/v1", api_key="x", max_retries=0
                )
                stream = await client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
                )
                text = "".join(
                    [c.choices[0].delta.content or "" async for c in stream if c.choices]
                )
                assert text == scheduler.reply_text
                url = f"http://127.0.0.1:{public_port}/v1/generate"
                status, _, raw = await asyncio.to_thread(http, "POST", url, {"prompt": "hello"})
                lines = [json.loads(line) for line in raw.decode().splitlines()]
                assert status == 200 and lines[-1]["complete"]["finish_reason"] == "length"
                assert "".join(line["chunk"]["text"] for line in lines[:-1]) == scheduler.reply_text
            finally:
                assert envoy.stop() == 0
            gateway.terminate()
            assert await asyncio.wait_for(gateway.wait(), 30) == 0
        finally:
            if gateway.returncode is None:
                gateway.kill()
                await gateway.wait()
