"""A redaction plugin over the tiny model's output, through both public APIs: gRPC
Generate (always streamed) and the OpenAI-compatible HTTP server (whole and SSE). No
chunk ever carries redacted text, and the text sent equals the model's output redacted."""

from __future__ import annotations

import json
import re

import aiohttp
import grpc
import pytest

from gateway.core.models import ModelRegistry
from gateway.openai_http import OpenAIHttpServer, start_http_server
from gateway.programs.core.plugins import PluginChain, RegexRedaction
from gateway.server import InferenceServicer
from radixmesh.sampling import Priority, SamplingParams
from radixmesh.v1 import inference_pb2, inference_pb2_grpc
from services.common.config import free_port

PROMPT = "Tell me a number."
MAX_TOKENS = 24


class EngineUpstream:
    """The gateway's Upstream over the in-process engine."""

    def __init__(self, engine) -> None:
        self.engine = engine

    async def generate(
        self,
        req_id,
        token_ids,
        sampling=None,
        *,
        constraint=None,
        model="",
        priority=Priority.INTERACTIVE,
        deadline_unix_ms=0,
    ):
        stream = await self.engine.generate(
            list(token_ids), sampling, constraint=constraint, model=model, priority=priority, req_id=req_id
        )
        async for update in stream:
            yield update

    async def abort(self, req_id) -> None:
        self.engine.abort(req_id)


class Shout:
    """A post_response plugin that cannot stream."""

    def post_response(self, value):
        return value.upper() if isinstance(value, str) else value


@pytest.fixture
async def plain_output(engine, tokenizer) -> str:
    done = await engine.complete(
        tokenizer.encode_prompt(PROMPT), SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    )
    return tokenizer.decode(done.token_ids)


@pytest.fixture
def secret(plain_output) -> str:
    """A piece of the model's greedy output that comes back several times."""
    word = plain_output.strip()[:4]
    assert plain_output.count(word) >= 2, plain_output
    return word


def redaction(secret: str) -> RegexRedaction:
    return RegexRedaction([re.escape(secret)], max_match_chars=len(secret))


async def grpc_generate(engine, tokenizer, chain: PluginChain) -> list[inference_pb2.GenerateResponse]:
    servicer = InferenceServicer(
        ModelRegistry({tokenizer.name: tokenizer}), EngineUpstream(engine), plugins=chain
    )
    server = grpc.aio.server()
    inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            request = inference_pb2.GenerateRequest(
                prompt=PROMPT,
                sampling=inference_pb2.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0),
            )
            return [r async for r in stub.Generate(request)]
    finally:
        await server.stop(None)


async def test_grpc_generate_streams_the_redacted_text(engine, tokenizer, plain_output, secret):
    responses = await grpc_generate(engine, tokenizer, PluginChain((redaction(secret),)))
    chunks = [r.chunk for r in responses if r.WhichOneof("response") == "chunk"]
    assert len(chunks) > 1  # streamed as it comes, not held to the end
    assert all(secret not in c.text and not c.token_ids for c in chunks)
    assert "".join(c.text for c in chunks) == plain_output.replace(secret, "[redacted]")
    (complete,) = [r.complete for r in responses if r.WhichOneof("response") == "complete"]
    assert complete.finish_reason == "length" and complete.usage.completion_tokens == MAX_TOKENS


async def test_grpc_generate_with_a_plugin_that_cannot_stream_sends_the_text_whole(
    engine, tokenizer, plain_output, secret
):
    responses = await grpc_generate(engine, tokenizer, PluginChain((redaction(secret), Shout())))
    chunks = [r.chunk for r in responses if r.WhichOneof("response") == "chunk"]
    assert [c.text for c in chunks] == [plain_output.replace(secret, "[redacted]").upper()]
    assert responses[-1].WhichOneof("response") == "complete"


@pytest.fixture
async def openai_url(engine, tokenizer, secret):
    server = OpenAIHttpServer(
        ModelRegistry({tokenizer.name: tokenizer}),
        EngineUpstream(engine),
        plugins=PluginChain((redaction(secret),)),
    )
    port = free_port()
    runner = await start_http_server(server.build_app(), "127.0.0.1", port)
    yield f"http://127.0.0.1:{port}/v1/completions"
    await runner.cleanup()


async def test_openai_whole_completion_is_redacted_without_logprobs(openai_url, plain_output, secret):
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 1}
    async with aiohttp.ClientSession() as session, session.post(openai_url, json=body) as response:
        assert response.status == 200, await response.text()
        answer = await response.json()
    (choice,) = answer["choices"]
    assert choice["text"] == plain_output.replace(secret, "[redacted]")
    assert choice["logprobs"] is None  # its tokens would spell the text before redaction
    assert answer["usage"]["completion_tokens"] == MAX_TOKENS


async def test_openai_streamed_completion_never_sends_the_secret(openai_url, plain_output, secret):
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    texts = []
    async with aiohttp.ClientSession() as session, session.post(openai_url, json=body) as response:
        assert response.status == 200
        async for line in response.content:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            texts.append(json.loads(line[6:])["choices"][0]["text"])
    assert len([t for t in texts if t]) > 1
    assert all(secret not in t for t in texts)
    assert "".join(texts) == plain_output.replace(secret, "[redacted]")
