"""A session_id continues a conversation: the cache service keeps its tokens between turns."""

from __future__ import annotations

import uuid

import openai
from e2e_mesh import API_KEY, AUTH, generate

from radixmesh.v1 import inference_pb2 as pb

PAGE_SIZE = 16  # the executor's default
GREEDY = pb.SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


async def _generate(stub, **fields) -> tuple[list[int], pb.Complete]:
    out = await generate(stub, pb.GenerateRequest(sampling=GREEDY, **fields))
    return out.token_ids, out.complete


async def _tokens(stub, prompt: str) -> list[int]:
    reply = await stub.Tokenize(pb.TokenizeRequest(prompt=prompt), metadata=AUTH)
    return list(reply.token_ids)


async def test_session_turns_continue_the_conversation(stub):
    session_id = f"e2e-{uuid.uuid4().hex}"
    first_prompt = "Once upon a time there was a little fox who lived in a quiet forest " * 2
    second_prompt = " and then"
    first_ids = await _tokens(stub, first_prompt)
    second_ids = await _tokens(stub, second_prompt)
    bos = first_ids[0]
    assert second_ids[0] == bos  # the tokenizer adds BOS; a continued session drops it

    first_out, first_done = await _generate(stub, prompt=first_prompt, session_id=session_id)
    assert first_done.usage.prompt_tokens == len(first_ids)
    second_out, second_done = await _generate(stub, prompt=second_prompt, session_id=session_id)

    history = [*first_ids, *first_out, *second_ids[1:]]
    assert second_done.usage.prompt_tokens == len(history)
    # The second turn ran over the first turn's tokens: its prefix came from the KV cache,
    # in whole pages of PAGE_SIZE tokens.
    assert len(first_ids) >= 2 * PAGE_SIZE
    assert second_done.usage.cached_tokens >= len(first_ids) // PAGE_SIZE * PAGE_SIZE
    # ...and it is the same continuation as sending the whole history as token ids.
    expected_out, _ = await _generate(stub, token_ids=pb.TokenIds(ids=history))
    assert second_out == expected_out


async def test_sessions_are_separate(stub):
    a, b = f"e2e-{uuid.uuid4().hex}", f"e2e-{uuid.uuid4().hex}"
    await _generate(stub, prompt="Once upon a time", session_id=a)
    _, fresh = await _generate(stub, prompt="Once upon a time", session_id=b)
    assert fresh.usage.prompt_tokens == len(await _tokens(stub, "Once upon a time"))


async def test_openai_requests_continue_a_session_with_the_session_id_extension(serve, stub):
    client = openai.OpenAI(base_url=f"{serve.http}/v1", api_key=API_KEY, max_retries=0)
    session = {"session_id": f"e2e-{uuid.uuid4().hex}"}
    first = client.completions.create(
        model="", prompt="Once upon a time", max_tokens=5, temperature=0, extra_body=session
    )
    second = client.completions.create(
        model="", prompt=" and then", max_tokens=5, temperature=0, extra_body=session
    )
    new_ids = (await _tokens(stub, " and then"))[1:]  # without BOS
    expected = first.usage.prompt_tokens + first.usage.completion_tokens + len(new_ids)
    assert second.usage.prompt_tokens == expected
