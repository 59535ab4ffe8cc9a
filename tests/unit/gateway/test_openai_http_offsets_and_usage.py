"""/v1/completions text_offset and stream_options.continuous_usage_stats, on loopback.

The scripted model answers REPLY's tokens (the emoji is four one-byte tokens) then EOS, two
tokens per update, and scores the prompt when asked: a prompt sent as token ids may lead with
BOS, whose text, like EOS's, is not in the returned text.
"""

from __future__ import annotations

import json

import aiohttp
import pytest

from gateway.core.models import ModelRegistry
from gateway.openai_http import OpenAIHttpServer, start_http_server
from mesh.tiny_model import BOS, EOS
from radixmesh import wire
from radixmesh.step import TokenLogprobs
from radixmesh.updates import RequestUpdate
from services.common.config import free_port

REPLY = "hello 😀 world. the end"


class ScoringUpstream:
    """REPLY's tokens and EOS, two per update, with logprobs and prompt logprobs when asked."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    async def generate(self, req_id, token_ids, sampling, **options):
        wire.sampling_to_proto(sampling)  # what the scheduler client sends must fit the wire
        ids = self.tokenizer._hf.encode(REPLY, add_special_tokens=False)
        ids = [*ids, *self.tokenizer.eos_token_ids][: sampling.max_tokens]
        start = sampling.prompt_logprobs_start
        prompt_logprobs = (
            [TokenLogprobs(t, -0.5, []) for t in token_ids[start:]] if start is not None else []
        )
        for i in range(0, len(ids), 2):
            chunk = ids[i : i + 2]
            last = i + 2 >= len(ids)
            eos = chunk[-1] in self.tokenizer.eos_token_ids
            yield RequestUpdate(
                req_id,
                token_ids=chunk,
                logprobs=[TokenLogprobs(t, -0.25, []) for t in chunk] if sampling.logprobs else [],
                finish_reason=("stop" if eos else "length") if last else None,
                matched_stop_token_id=chunk[-1] if last and eos else None,
                num_prompt_tokens=len(token_ids) if i == 0 else None,
                prompt_logprobs=prompt_logprobs if i == 0 else [],
            )

    async def abort(self, req_id):
        pass


@pytest.fixture
async def base(tokenizer):
    server = OpenAIHttpServer(ModelRegistry({"tiny": tokenizer}), ScoringUpstream(tokenizer))
    port = free_port()
    runner = await start_http_server(server.build_app(), "127.0.0.1", port)
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def post(base: str, path: str, body: dict) -> tuple[int, object]:
    """The status and the JSON body, or the list of a stream's JSON events."""
    async with aiohttp.ClientSession() as session, session.post(base + path, json=body) as r:
        if r.content_type != "text/event-stream":
            return r.status, await r.json()
        frames = (await r.text()).split("\n\n")
    assert frames[-2:] == ["data: [DONE]", ""]
    return r.status, [json.loads(f.removeprefix("data: ")) for f in frames[:-2]]


def choice_logprobs(reply, streamed: bool, index: int) -> tuple[str, list[str], list[int]]:
    """One choice's text, tokens and text_offset, its chunks joined when streamed."""
    parts = [c["choices"][0] for c in reply if c["choices"]] if streamed else reply["choices"]
    parts = [p for p in parts if p["index"] == index]
    text = "".join(p["text"] for p in parts)
    tokens = [t for p in parts if p["logprobs"] for t in p["logprobs"]["tokens"]]
    offsets = [o for p in parts if p["logprobs"] for o in p["logprobs"]["text_offset"]]
    return text, tokens, offsets


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("echo", [False, True], ids=["plain", "echo"])
async def test_text_offsets_index_the_returned_text(base, tokenizer, streamed, echo):
    prompt = [tokenizer.bos_token_id, *tokenizer._hf.encode("hi", add_special_tokens=False)]
    body = {"prompt": prompt, "max_tokens": 30, "echo": echo, "logprobs": 0, "n": 2}
    status, reply = await post(base, "/v1/completions", {**body, "stream": streamed})
    assert status == 200
    for index in (0, 1):
        text, tokens, offsets = choice_logprobs(reply, streamed, index)
        assert text == ("hi" if echo else "") + REPLY
        assert tokens[: 3 if echo else 0] == ([BOS, "h", "i"] if echo else [])
        assert tokens[-1] == EOS and len(offsets) == len(tokens)
        assert offsets == sorted(offsets)
        for i, (token, offset) in enumerate(zip(tokens, offsets, strict=True)):
            if token in (BOS, EOS):  # not in the text: it stands where the next text starts
                assert offset == (offsets[i + 1] if i + 1 < len(offsets) else len(text))
            elif token == "\ufffd":  # a byte of the emoji: it stands where the emoji does
                assert text[offset] == "😀"
            else:
                assert text[offset:].startswith(token), (i, token, offset)


async def test_echo_offsets_of_a_prompt_led_by_bos(base, tokenizer):
    """BOS, "h", "i", then the answer: BOS stands at 0 with "h", the answer at 2."""
    prompt = [tokenizer.bos_token_id, *tokenizer._hf.encode("hi", add_special_tokens=False)]
    body = {"prompt": prompt, "max_tokens": 2, "echo": True, "logprobs": 0}
    _, whole = await post(base, "/v1/completions", body)
    _, chunks = await post(base, "/v1/completions", {**body, "stream": True})
    assert whole["choices"][0]["logprobs"]["text_offset"] == [0, 0, 1, 2, 7]
    assert choice_logprobs(chunks, True, 0)[2] == [0, 0, 1, 2, 7]


def usage_chunks(chunks: list[dict], index: int) -> list[dict]:
    return [c["usage"] for c in chunks if c["choices"] and c["choices"][0]["index"] == index]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_continuous_usage_counts_each_choices_tokens_so_far(base, tokenizer, path):
    """As vLLM does: every chunk of a choice carries the prompt's tokens and that choice's
    completion tokens so far; the last chunk carries the whole request's usage."""
    num_reply = len(tokenizer._hf.encode(REPLY, add_special_tokens=False)) + 1  # and EOS
    body = {
        "max_tokens": 30,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        **(
            {"messages": [{"role": "user", "content": "hi"}]}
            if "chat" in path
            else {"prompt": "hi", "echo": True}
        ),
    }
    status, chunks = await post(base, path, body)
    assert status == 200
    prompt_tokens = chunks[-1]["usage"]["prompt_tokens"]
    assert prompt_tokens > 0 and chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 2 * num_reply
    for index in (0, 1):
        usages = usage_chunks(chunks, index)
        completion = [u["completion_tokens"] for u in usages]
        # the role chunk (chat) or the echo chunk (completions), then two tokens per update
        assert completion == [0, *range(2, num_reply, 2), num_reply]
        assert all(u["prompt_tokens"] == prompt_tokens for u in usages)
        assert all(u["total_tokens"] == prompt_tokens + u["completion_tokens"] for u in usages)


async def test_without_continuous_usage_chunks_carry_no_usage(base):
    body = {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}
    _, chunks = await post(base, "/v1/completions", body)
    assert all("usage" not in c for c in chunks[:-1]) and chunks[-1]["usage"]


@pytest.mark.parametrize(
    ("options", "param", "says"),
    [
        ({"include_usage": True, "bogus": 1}, "stream_options.bogus", "unrecognized"),
        (
            {"include_usage": False, "continuous_usage_stats": True},
            "stream_options.continuous_usage_stats",
            "set false here",
        ),
    ],
)
async def test_bad_stream_options_are_400s_naming_them(base, options, param, says):
    body = {"prompt": "hi", "stream": True, "stream_options": options}
    status, reply = await post(base, "/v1/completions", body)
    assert status == 400 and reply["error"]["param"] == param
    assert says in reply["error"]["message"]
