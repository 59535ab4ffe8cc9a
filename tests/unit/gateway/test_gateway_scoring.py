"""Prompt scoring through the gateway's plain APIs, over the in-process engine on a real model.

OpenAI `/v1/completions` with `echo` and `logprobs` (and `max_tokens: 0`) reports the
prompt tokens' log probabilities, the first one null; `Inference/Generate` carries them
in the first Chunk, or in Complete when no token is generated. The values are checked
against transformers' full forward of the same tiny model.
"""

from __future__ import annotations

import aiohttp
import grpc
import pytest
import torch
import transformers

from gateway.core.models import ModelRegistry
from gateway.core.tokenizer import Tokenizer
from gateway.openai_http import OpenAIHttpServer, start_http_server
from gateway.server import InferenceServicer
from mesh.engine import Engine, EngineConfig
from mesh.tiny_model import write_tiny_model
from radixmesh.v1 import inference_pb2, inference_pb2_grpc
from services.common.config import free_port
from tests.fixtures.runtime import running_runtime

PROMPT = "the quick brown fox"


class EngineUpstream:
    """The gateway's Upstream over an in-process engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def generate(self, req_id, token_ids, sampling=None, **options):
        options.pop("deadline_unix_ms", None)
        stream = await self.engine.generate(list(token_ids), sampling, req_id=req_id, **options)
        async for update in stream:
            yield update

    async def abort(self, req_id: str) -> None:
        self.engine.abort(req_id)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("scoring-tiny"))


@pytest.fixture(scope="module")
def tokenizer(model_dir) -> Tokenizer:
    return Tokenizer.from_folder(model_dir)


@pytest.fixture(scope="module")
def reference(model_dir):
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def logprobs(token_ids: list[int]) -> list[float]:
        with torch.no_grad():
            rows = torch.log_softmax(hf(torch.tensor([token_ids])).logits[0].float(), -1)
        return [rows[p - 1, token_ids[p]].item() for p in range(1, len(token_ids))]

    return logprobs


@pytest.fixture
async def upstream(model_dir):
    config = EngineConfig.for_model(
        str(model_dir), device="cpu", page_size=4, num_pages=128, model_name="tiny"
    )
    async with Engine(config) as engine:
        yield EngineUpstream(engine)


@pytest.fixture
async def http(upstream, tokenizer):
    app = OpenAIHttpServer(ModelRegistry({"tiny": tokenizer}), upstream).build_app()
    port = free_port()
    runner = await start_http_server(app, "127.0.0.1", port)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
        yield session
    await runner.cleanup()


async def complete(session, **body):
    async with session.post("/v1/completions", json={"model": "tiny", **body}) as response:
        return response.status, await response.json()


async def test_echo_with_logprobs_and_max_tokens_0_scores_the_prompt(http, tokenizer, reference):
    status, body = await complete(
        http, prompt=PROMPT, echo=True, logprobs=2, max_tokens=0, temperature=0
    )
    assert status == 200, body
    (choice,) = body["choices"]
    assert (choice["text"], choice["finish_reason"]) == (PROMPT, "length")
    prompt_ids = tokenizer.encode_prompt(PROMPT)
    lp = choice["logprobs"]
    assert lp["tokens"] == [tokenizer.token_text(t) for t in prompt_ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:] == pytest.approx(reference(prompt_ids), abs=2e-4)
    assert all(len(top) <= 2 for top in lp["top_logprobs"][1:])
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    assert body["usage"]["completion_tokens"] == 0


async def test_echo_with_logprobs_continues_into_the_completion(http, tokenizer, reference):
    status, body = await complete(
        http, prompt=PROMPT, echo=True, logprobs=0, max_tokens=3, temperature=0, ignore_eos=True
    )
    assert status == 200, body
    (choice,) = body["choices"]
    prompt_ids = tokenizer.encode_prompt(PROMPT)
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(prompt_ids) + 3
    assert lp["tokens"][: len(prompt_ids)] == [tokenizer.token_text(t) for t in prompt_ids]
    assert PROMPT + "".join(lp["tokens"][len(prompt_ids) :]) == choice["text"]
    assert lp["token_logprobs"][1 : len(prompt_ids)] == pytest.approx(
        reference(prompt_ids), abs=2e-4
    )


async def test_streamed_echo_with_logprobs_equals_the_whole(http):
    body = {"prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 4, "temperature": 0}
    _, whole = await complete(http, **body)
    async with http.post("/v1/completions", json={"model": "tiny", "stream": True, **body}) as r:
        events = [line[6:] async for line in r.content if line.startswith(b"data: ")]
    import json

    chunks = [json.loads(e) for e in events if e.strip() != b"[DONE]"]
    choices = [c["choices"][0] for c in chunks]
    assert "".join(c["text"] for c in choices) == whole["choices"][0]["text"]
    tokens = [t for c in choices if c["logprobs"] for t in c["logprobs"]["tokens"]]
    assert tokens == whole["choices"][0]["logprobs"]["tokens"]
    assert choices[0]["text"] == PROMPT and choices[0]["logprobs"]["token_logprobs"][0] is None


async def test_max_tokens_0_without_echo_is_refused_naming_the_field(http):
    status, body = await complete(http, prompt=PROMPT, max_tokens=0)
    assert status == 400 and body["error"]["param"] == "max_tokens"


async def test_generate_carries_prompt_logprobs_in_the_chunk_or_the_complete(
    upstream, tokenizer, reference
):
    servicer = InferenceServicer(ModelRegistry({"tiny": tokenizer}), upstream)

    def register(server):
        inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)

    prompt_ids = tokenizer.encode_prompt(PROMPT)
    async def run(stub, **sampling):
        request = inference_pb2.GenerateRequest(
            prompt=PROMPT,
            sampling=inference_pb2.SamplingParams(
                temperature=0, prompt_logprobs_start=2, **sampling
            ),
        )
        return [r async for r in stub.Generate(request, timeout=30)]

    async with (
        running_runtime(register, ["radixmesh.v1.Inference"]) as runtime,
        grpc.aio.insecure_channel(runtime.address) as channel,
    ):
        stub = inference_pb2_grpc.InferenceStub(channel)
        scored = await run(stub, max_tokens=0)
        generated = await run(stub, max_tokens=2, ignore_eos=True)
    (complete,) = [r.complete for r in scored]
    assert complete.finish_reason == "length" and complete.usage.completion_tokens == 0
    expected = reference(prompt_ids)[1:]  # positions 2, 3, ...
    assert [p.sampled.token_id for p in complete.prompt_logprobs] == prompt_ids[2:]
    got = [p.sampled.logprob for p in complete.prompt_logprobs]
    assert got == pytest.approx(expected, abs=2e-4)
    chunks = [r.chunk for r in generated if r.HasField("chunk")]
    assert [p.sampled.logprob for p in chunks[0].prompt_logprobs] == pytest.approx(
        expected, abs=2e-4
    )
    assert all(not c.prompt_logprobs for c in chunks[1:])
    assert not generated[-1].complete.prompt_logprobs
