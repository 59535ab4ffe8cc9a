"""Compression where a client asks: gzip JSON bodies through Envoy's compressor, gzip gRPC
replies from a gateway-side interceptor for a client that sends gzip; content unchanged."""

from __future__ import annotations

import gzip
import json

import grpc
import pytest
from aiohttp import web

from gateway.compression import ENCODING_METADATA, ResponseCompressionInterceptor, asks_for_gzip
from gateway.envoy import render_envoy_config
from radixmesh.v1 import inference_pb2, inference_pb2_grpc
from tests.fixtures.envoy import FakeGateway, http_call, start_envoy

NUM_MODELS = 64


def model_ids() -> list[str]:
    return [f"tiny-llama-variant-{i:03d}-instruct" for i in range(NUM_MODELS)]


class ManyModels(inference_pb2_grpc.InferenceServicer):
    """ListModels answers a large, repetitive list (it compresses well); records metadata."""

    def __init__(self) -> None:
        self.encodings: list[str | None] = []

    async def ListModels(self, request, context):
        metadata = dict(context.invocation_metadata() or ())
        self.encodings.append(metadata.get(ENCODING_METADATA))
        cards = [inference_pb2.ModelCard(id=m, max_model_len=4096) for m in model_ids()]
        return inference_pb2.ListModelsResponse(models=cards)

    async def Generate(self, request, context):
        for word in request.prompt.split():
            yield inference_pb2.GenerateResponse(request_id="r", chunk=inference_pb2.Chunk(text=word))


class Backends(FakeGateway):
    """An OpenAI-shaped HTTP app and a gRPC server with the compression interceptor."""

    def __init__(self) -> None:
        super().__init__(ManyModels(), interceptors=[ResponseCompressionInterceptor()])

    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "owned_by": "radixmesh"} for m in model_ids()]
        return web.json_response({"object": "list", "data": data})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": "word " * 200}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(20):
            await response.write(f"data: {json.dumps({'i': i, 'text': 'word ' * 20})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture(scope="module")
def backends():
    with Backends() as started:
        yield started


@pytest.fixture(scope="module")
def port(tmp_path_factory, backends):
    envoy = start_envoy(tmp_path_factory.mktemp("envoy-gzip"), backends.address)
    yield envoy.public_port
    assert envoy.stop() == 0


def fetch(url: str, headers: dict[str, str], body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    status, got, raw = http_call("GET" if data is None else "POST", url, data, headers)
    assert status == 200, raw
    return {k.lower(): v for k, v in got.items()}, raw


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", {"stream": False})],
)
def test_a_gzip_asking_http_client_gets_the_same_json_gzipped(port, method, path, body):
    url = f"http://127.0.0.1:{port}{path}"
    plain_headers, plain = fetch(url, {}, body)
    headers, raw = fetch(url, {"Accept-Encoding": "gzip"}, body)
    assert "content-encoding" not in plain_headers
    assert headers.get("content-encoding") == "gzip"
    assert len(raw) < len(plain) / 3
    assert gzip.decompress(raw) == plain
    assert json.loads(plain)  # the body is the JSON itself


def test_event_streams_pass_uncompressed(port):
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    headers, raw = fetch(url, {"Accept-Encoding": "gzip"}, {"stream": True})
    assert "content-encoding" not in headers
    assert headers["content-type"].startswith("text/event-stream")
    assert raw.decode().count("data: ") == 21


def test_a_grpc_client_that_sends_gzip_gets_gzip_with_the_same_content(backends, tmp_path):
    envoy = start_envoy(tmp_path, backends.address)
    port = envoy.public_port
    try:
        replies = _list_models_plain_and_gzipped(port)
    finally:
        assert envoy.stop() == 0  # the access log is flushed on exit
    plain, zipped, streamed = replies
    assert zipped == plain and [m.id for m in plain.models] == model_ids()
    assert [r.chunk.text for r in streamed] == ["a", "b", "c"]
    # Envoy told the gateway which call came gzipped
    assert backends.servicer.encodings[-2:] == [None, "gzip"]
    entries = envoy.access_log()
    sent = [int(e["bytes_sent"]) for e in entries if e["path"].endswith("/ListModels")]
    assert len(sent) == 2 and sent[1] < sent[0] / 3, sent  # plain first, then gzip


def _list_models_plain_and_gzipped(port: int):
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = inference_pb2.ListModelsRequest()
        plain = stub.ListModels(request, timeout=10)
        zipped = stub.ListModels(request, timeout=10, compression=grpc.Compression.Gzip)
        streamed = list(
            stub.Generate(
                inference_pb2.GenerateRequest(prompt="a b c"),
                timeout=10,
                compression=grpc.Compression.Gzip,
            )
        )
    return plain, zipped, streamed


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ((), False),
        (((ENCODING_METADATA, ""),), False),
        (((ENCODING_METADATA, "identity"),), False),
        (((ENCODING_METADATA, "gzip"),), True),
        (((ENCODING_METADATA, "deflate, GZIP"),), True),
        ((("grpc-encoding", "gzip"),), False),  # the library strips it; Envoy's copy counts
    ],
)
def test_which_calls_ask_for_gzip(metadata, expected):
    assert asks_for_gzip(metadata) is expected


def test_render_refuses_a_negative_compression_threshold():
    from radixmesh.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="compress_min_bytes"):
        render_envoy_config(8080, 9901, ["g:1:2"], compress_min_bytes=-1)
