"""The edge's limits over HTTP: precise 4xx for the inputs that used to be 500s, 413, 429 with
Retry-After, and a huge prompt refused at once while other requests keep flowing."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from test_gateway_openai_http import ScriptedUpstream

from gateway.core.limits import MAX_CHARS_PER_TOKEN, check_input_size
from gateway.core.models import ModelRegistry
from gateway.core.request import ChatMessage, GenerateInput
from gateway.openai_http import MAX_BODY_BYTES, OpenAIHttpServer, start_http_server
from radixmesh.errors import InvalidArgument, ResourceExhausted
from radixmesh.retry_after import with_retry_after
from radixmesh.sampling import SamplingParams
from services.common.config import free_port


@pytest.fixture
async def serve(tokenizer):
    """start(upstream=None, **server options) -> (None, upstream, base URL)."""
    runners = []

    async def start(upstream=None, **kwargs):
        upstream = upstream or ScriptedUpstream(tokenizer)
        app = OpenAIHttpServer(ModelRegistry({"tiny": tokenizer}), upstream, **kwargs).build_app()
        port = free_port()
        runners.append(await start_http_server(app, "127.0.0.1", port))
        return None, upstream, f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def post(base: str, path: str, data: bytes | str) -> tuple[int, dict, dict]:
    async with aiohttp.ClientSession() as session:
        headers = {"content-type": "application/json"}
        async with session.post(f"{base}{path}", data=data, headers=headers) as response:
            return response.status, dict(response.headers), json.loads(await response.read())


def chat(content: str, **extra) -> str:
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], **extra}
    return json.dumps(body)


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (chat("hi", stop_token_ids=[1000000000000]), "stop_token_ids"),
        ('{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}', "surrogate"),
        ("[" * 100_000 + "]" * 100_000, "nests too deeply"),
    ],
)
async def test_the_old_500s_are_400s_naming_the_problem(serve, data, named):
    _, _, base = await serve()
    status, _, body = await post(base, "/v1/chat/completions", data)
    assert status == 400, body
    assert named in (body["error"]["param"] or "") + body["error"]["message"]
    assert "\n" not in body["error"]["message"]


async def test_an_oversize_body_is_413(serve):
    _, _, base = await serve()
    status, _, body = await post(base, "/v1/completions", b"x" * (MAX_BODY_BYTES + 1))
    assert status == 413 and body["error"]["code"] == "invalid_argument"


async def test_a_huge_prompt_is_refused_at_once_and_others_keep_flowing(serve, tokenizer):
    _, _, base = await serve()
    huge = json.dumps({"model": "tiny", "prompt": "a" * 10_000_000, "max_tokens": 1})
    start = time.monotonic()
    small = asyncio.create_task(
        post(base, "/v1/completions", json.dumps({"model": "tiny", "prompt": "hi"}))
    )
    status, _, body = await post(base, "/v1/completions", huge)
    assert status == 400 and body["error"]["param"] == "prompt", body
    assert "cannot fit the model's" in body["error"]["message"]
    assert (await small)[0] == 200
    assert time.monotonic() - start < 5.0  # no tokenizing of ten million characters


def test_the_size_bound_is_per_token_of_context():
    limit = 64 * MAX_CHARS_PER_TOKEN
    check_input_size(GenerateInput(prompt="a" * limit), 64)
    with pytest.raises(InvalidArgument, match=r"^messages: "):
        check_input_size(GenerateInput(messages=(ChatMessage("user", "a" * (limit + 1)),)), 64)


async def test_an_overloaded_scheduler_is_429_with_retry_after(serve, tokenizer):
    refusal = ResourceExhausted(with_retry_after("overloaded: estimated queue wait 40.0s", 9))
    _, _, base = await serve(ScriptedUpstream(tokenizer, error=refusal))
    for stream in (False, True):
        status, headers, body = await post(base, "/v1/chat/completions", chat("hi", stream=stream))
        assert status == 429 and headers["Retry-After"] == "9"
        assert body["error"]["code"] == "resource_exhausted"


async def test_a_gateway_that_is_not_serving_refuses_new_requests(serve):
    _, _, base = await serve(ready=lambda: False)
    status, _, body = await post(base, "/v1/chat/completions", chat("hi"))
    assert status == 503 and body["error"]["code"] == "unavailable"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"stop": ("x",) * 17}, "at most 16 stop strings"),
        ({"stop": ("x" * 1025,)}, "at most 1024 characters"),
        ({"stop_token_ids": (2**31,)}, "stop_token_ids"),
    ],
)
def test_stop_limits_are_the_contracts_so_grpc_and_http_share_them(fields, named):
    with pytest.raises(InvalidArgument, match=named):
        SamplingParams(**fields)


def test_error_messages_are_one_line_on_both_apis():
    from gateway.core.openai_responses import error_response
    from services.common.interceptor import one_line

    exc = InvalidArgument("response_format: the grammar does not compile:\n  line 1\n\n  line 2")
    status, body = error_response(exc)
    assert status == 400
    assert body["error"]["message"] == (
        "response_format: the grammar does not compile: | line 1 | line 2"
    )
    assert one_line(str(exc)) == body["error"]["message"]
