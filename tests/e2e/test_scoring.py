"""Prompt scoring through `radixmesh serve`: the openai package's echo + logprobs and the
gRPC API's prompt_logprobs agree, across Envoy, the gateway, the scheduler and the executor."""

from __future__ import annotations

import openai
import pytest
from e2e_mesh import API_KEY, AUTH, generate

from radixmesh.v1 import inference_pb2 as pb

PROMPT = "The quick brown fox jumps over the lazy dog"


async def test_echo_logprobs_with_max_tokens_0_equal_generate_prompt_logprobs(serve, stub):
    client = openai.OpenAI(base_url=f"{serve.http}/v1", api_key=API_KEY, max_retries=0)
    completion = client.completions.create(
        model=serve.endpoints["model"], prompt=PROMPT, echo=True, logprobs=1, max_tokens=0
    )
    (choice,) = completion.choices
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert completion.usage.completion_tokens == 0
    lp = choice.logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    request = pb.GenerateRequest(
        prompt=PROMPT, sampling=pb.SamplingParams(max_tokens=0, prompt_logprobs_start=1)
    )
    out = await generate(stub, request)
    scored = out.complete.prompt_logprobs
    assert len(scored) == len(lp.tokens) - 1 == out.complete.usage.prompt_tokens - 1
    assert [p.sampled.logprob for p in scored] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)
    assert [p.sampled.token for p in scored] == lp.tokens[1:]


async def test_a_prompt_scored_twice_is_served_from_the_cache_only_up_to_its_start(serve, stub):
    """Scoring from position k: the cache never serves position k - 1, so the second run
    of the same prompt computes the scored rows again and gives the same numbers."""
    sampling = pb.SamplingParams(max_tokens=1, temperature=0, prompt_logprobs_start=6)
    request = pb.GenerateRequest(prompt=PROMPT, sampling=sampling)
    runs = []
    for _ in range(2):
        responses = [r async for r in stub.Generate(request, metadata=AUTH)]
        chunks = [r.chunk for r in responses if r.HasField("chunk")]
        runs.append(([p.sampled.logprob for p in chunks[0].prompt_logprobs], responses[-1]))
    (first, _), (again, last) = runs
    assert last.complete.usage.cached_tokens <= 5
    assert first and first == pytest.approx(again, abs=1e-5)
