"""The OpenAI-compatible HTTP server on loopback, driven by the openai package's own client."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

from gateway.core.auth import Admission
from gateway.core.models import ModelRegistry
from gateway.core.prepare import PreparedRequest
from gateway.core.ratelimit import LocalRateLimiter, RateLimitConfig
from gateway.openai_http import OpenAIHttpServer, start_http_server
from radixmesh import wire
from radixmesh.errors import ResourceExhausted
from radixmesh.step import TokenLogprobs
from radixmesh.updates import RequestUpdate
from services.common.config import free_port

REPLY = "hello 😀 world. the end"


class ScriptedUpstream:
    """Answers every request with REPLY's tokens, two per update."""

    def __init__(self, tokenizer, hold_after_first=False, error=None, error_after_first=False):
        self.tokenizer = tokenizer
        self.hold = asyncio.Event() if hold_after_first else None
        self.error = error
        self.error_after_first = error_after_first
        self.submitted = []
        self.aborted = asyncio.Queue()

    async def generate(self, req_id, token_ids, sampling, **options):
        wire.sampling_to_proto(sampling)  # what the scheduler client sends must fit the wire
        request = PreparedRequest(req_id, prompt_token_ids=tuple(token_ids), sampling=sampling, **options)
        self.submitted.append(request)
        if self.error is not None and not self.error_after_first:
            yield RequestUpdate(req_id, error=self.error)
            return
        ids = self.tokenizer._hf.encode(REPLY, add_special_tokens=False)[
            : request.sampling.max_tokens
        ]
        for i in range(0, len(ids), 2):
            chunk = ids[i : i + 2]
            last = i + 2 >= len(ids)
            logprobs = [
                TokenLogprobs(t, -0.25, [(t, -0.25)] * request.sampling.top_logprobs) for t in chunk
            ]
            yield RequestUpdate(
                req_id,
                token_ids=chunk,
                logprobs=logprobs if request.sampling.logprobs else [],
                finish_reason="length" if last else None,
                num_prompt_tokens=len(request.prompt_token_ids) if i == 0 else None,
                num_cached_tokens=3 if i == 0 else None,
            )
            if self.error_after_first:
                yield RequestUpdate(req_id, error=self.error)
                return
            if self.hold is not None:
                await self.hold.wait()

    async def abort(self, req_id):
        await self.aborted.put(req_id)


@pytest.fixture
async def serve(tokenizer):
    runners = []

    async def start(upstream=None, key="none", **kwargs):
        upstream = upstream or ScriptedUpstream(tokenizer)
        app = OpenAIHttpServer(ModelRegistry({"tiny": tokenizer}), upstream, **kwargs).build_app()
        port = free_port()
        runners.append(await start_http_server(app, "127.0.0.1", port))
        base = f"http://127.0.0.1:{port}"
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
        return client, upstream, base

    yield start
    for runner in runners:
        await runner.cleanup()


async def test_chat_completion(serve, tokenizer):
    client, upstream, _ = await serve()
    reply = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=2
    )
    assert reply.id.startswith("chatcmpl-") and reply.model == "tiny"
    assert reply.choices[0].message.content == REPLY
    assert reply.choices[0].finish_reason == "length"
    n_reply = len(tokenizer._hf.encode(REPLY, add_special_tokens=False))
    assert reply.usage.completion_tokens == n_reply
    assert reply.usage.prompt_tokens == len(upstream.submitted[0].prompt_token_ids)
    assert reply.usage.prompt_tokens_details.cached_tokens == 3
    content = reply.choices[0].logprobs.content
    assert len(content) == n_reply and all(len(c.top_logprobs) == 2 for c in content)
    assert b"".join(bytes(c.bytes) for c in content).decode() == REPLY


async def test_chat_stream_with_usage(serve):
    client, _, _ = await serve()
    stream = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
        n=2,
    )
    chunks = [c async for c in stream]
    for index in (0, 1):
        parts = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert parts[0].delta.role == "assistant"
        assert "".join(p.delta.content or "" for p in parts) == REPLY
        assert parts[-1].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


async def test_completion_with_stop_and_echo(serve):
    client, upstream, _ = await serve()
    reply = await client.completions.create(
        model="tiny", prompt="say", stop=[" world"], echo=True, max_tokens=30
    )
    assert reply.choices[0].text == "say" + "hello 😀"
    assert reply.choices[0].finish_reason == "stop"
    assert await asyncio.wait_for(upstream.aborted.get(), 5) == upstream.submitted[0].req_id


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stop_string_ending_within_min_tokens_does_not_stop_the_choice(serve, tokenizer, stream):
    """As vLLM: the "o" of "hello" ends inside the first min_tokens tokens' text and is
    passed over; the next "o", after them, stops the choice."""
    client, _, _ = await serve()
    ids = tokenizer._hf.encode(REPLY, add_special_tokens=False)
    min_tokens = next(m for m in range(1, len(ids)) if "hello" in tokenizer._hf.decode(ids[:m]))
    within = len(tokenizer._hf.decode(ids[:min_tokens]))
    expected = REPLY[: REPLY.index("o", within)]  # the first "o" that ends past them
    assert expected.startswith("hello")
    kwargs = {"model": "tiny", "prompt": "say", "stop": ["o"], "max_tokens": 30}
    for extra, text in (({}, "hell"), ({"min_tokens": min_tokens}, expected)):
        reply = await client.completions.create(**kwargs, stream=stream, extra_body=extra)
        if stream:
            chunks = [c async for c in reply]
            assert "".join(c.choices[0].text for c in chunks if c.choices) == text
            assert chunks[-1].choices[0].finish_reason == "stop"
        else:
            assert reply.choices[0].text == text and reply.choices[0].finish_reason == "stop"


async def test_completion_stream_text_equals_whole(serve):
    client, _, _ = await serve()
    stream = await client.completions.create(
        model="tiny", prompt="say", stream=True, max_tokens=30, logprobs=1
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks) == REPLY
    offsets = [
        o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset
    ]
    assert offsets == sorted(offsets) and offsets[0] == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "param"),
    [
        ({"temperature": 3}, openai.BadRequestError, "temperature"),
        ({"model": "other"}, openai.NotFoundError, "model"),
        (
            {"messages": [{"role": "robot", "content": "x"}]},
            openai.BadRequestError,
            "messages[0].role",
        ),
        ({"max_tokens": 500}, openai.BadRequestError, "max_tokens"),
    ],
)
async def test_errors_carry_status_and_param(serve, kwargs, error, param):
    client, _, _ = await serve()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **kwargs}
    with pytest.raises(error) as info:
        await client.chat.completions.create(**body)
    assert info.value.param == param


async def test_upstream_overload_is_429_whole_and_streamed(serve, tokenizer):
    client, _, _ = await serve(ScriptedUpstream(tokenizer, error=ResourceExhausted("queue full")))
    with pytest.raises(openai.RateLimitError, match="queue full"):
        await client.completions.create(model="tiny", prompt="x")
    with pytest.raises(openai.RateLimitError, match="queue full"):
        await client.completions.create(model="tiny", prompt="x", stream=True)


async def test_error_after_output_started_is_a_last_event(serve, tokenizer):
    upstream = ScriptedUpstream(
        tokenizer, error=ResourceExhausted("preempted"), error_after_first=True
    )
    _, _, base = await serve(upstream)
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{base}/v1/completions", json={"prompt": "x", "stream": True}) as r,
    ):
        assert r.status == 200
        events = (await r.text()).split("\n\n")
    first_two = tokenizer.decode(tokenizer._hf.encode(REPLY, add_special_tokens=False)[:2])
    assert json.loads(events[0].removeprefix("data: "))["choices"][0]["text"] == first_two
    error = json.loads(events[-3].removeprefix("data: "))["error"]
    assert error["code"] == "resource_exhausted" and error["message"] == "preempted"
    assert events[-2] == "data: [DONE]"


async def test_api_keys_and_rate_limit(serve):
    class Clock:
        now = 0.0

        def __call__(self):
            return self.now

    limiter = LocalRateLimiter(RateLimitConfig(capacity=1, refill_per_s=1), Clock())
    client, _, _ = await serve(admission=Admission(frozenset({"sk-good"}), limiter), key="sk-bad")
    with pytest.raises(openai.AuthenticationError):
        await client.completions.create(model="tiny", prompt="x")
    good = client.with_options(api_key="sk-good")
    assert (await good.completions.create(model="tiny", prompt="x")).choices[0].text
    with pytest.raises(openai.RateLimitError, match="rate limit"):
        await good.completions.create(model="tiny", prompt="x")


async def test_client_disconnect_aborts_upstream(serve, tokenizer):
    upstream = ScriptedUpstream(tokenizer, hold_after_first=True)
    _, _, base = await serve(upstream)
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            f"{base}/v1/completions", json={"prompt": "x", "stream": True}
        )
        first = await response.content.readuntil(b"\n\n")
        assert first.startswith(b"data: ")
        response.close()  # the client goes away mid-stream
    assert await asyncio.wait_for(upstream.aborted.get(), 5) == upstream.submitted[0].req_id


async def test_models_and_health(serve):
    client, _, base = await serve(ready=lambda: False)
    assert [m.id for m in (await client.models.list()).data] == ["tiny"]
    assert (await client.models.retrieve("tiny")).id == "tiny"
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("other")
    async with aiohttp.ClientSession() as session, session.get(f"{base}/health") as r:
        assert r.status == 503


async def test_over_the_published_headroom_is_429_before_any_submit(serve, tokenizer):
    from gateway.core.capacity import CapacityGate
    from radixmesh.capacity import ModelCapacity
    from radixmesh.sampling import Priority

    gate = CapacityGate()
    gate.update([ModelCapacity("tiny", 2.0, {Priority.INTERACTIVE: 1, Priority.BATCH: 0})])
    client, upstream, base = await serve(capacity=gate)
    await client.completions.create(model="tiny", prompt="x", max_tokens=2)
    async with aiohttp.ClientSession() as session:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 2}
        async with session.post(f"{base}/v1/completions", json=body) as response:
            assert response.status == 429 and response.headers["Retry-After"] == "1"
            error = (await response.json())["error"]
    assert error["code"] == "resource_exhausted"
    assert "admits no more interactive requests" in error["message"]
    with pytest.raises(openai.RateLimitError, match="no more batch requests"):
        await client.completions.create(model="tiny", prompt="x", extra_body={"priority": "batch"})
    assert len(upstream.submitted) == 1  # the refused ones never reached the scheduler


async def test_models_report_and_requests_meet_the_context_the_executors_serve(model_folder):
    """The executors serve 24 of the model's 64 tokens (the scheduler said so): /v1/models
    reports 24, a max_tokens past it is a 400 naming max_tokens, and a chat without
    max_tokens is sent without one (the scheduler runs it to its own limit)."""
    from gateway.core.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(model_folder)
    models = ModelRegistry({"tiny": tokenizer})
    models.serve_within({"tiny": 24, "other": 8})
    upstream = ScriptedUpstream(tokenizer)
    port = free_port()
    runner = await start_http_server(OpenAIHttpServer(models, upstream).build_app(), "127.0.0.1", port)
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    try:
        listed = await client.models.list()
        card = await client.models.retrieve("tiny")
        with pytest.raises(openai.BadRequestError) as info:
            await client.completions.create(model="tiny", prompt="the quick", max_tokens=40)
        await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}]
        )
    finally:
        await client.close()
        await runner.cleanup()
    assert [(m.id, m.max_model_len) for m in listed.data] == [("tiny", 24)]
    assert card.max_model_len == 24
    assert "max_tokens: 40 plus" in str(info.value) and "context of 24 tokens" in str(info.value)
    assert [r.sampling.max_tokens for r in upstream.submitted] == [None]


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("top_k", 2**31, "must be below 2^31"),
        ("min_tokens", 2**31, "must be below 2^31"),
        ("repetition_penalty", 1e308, "inf as a 32-bit float"),
        ("top_p", 1e-50, "0.0 as a 32-bit float"),
        ("min_tokens", 100, "context of 64 tokens"),  # no max_tokens: room is the context's
    ],
)
async def test_values_past_the_wire_or_the_context_are_400s_naming_the_field(serve, field, value, says):
    client, upstream, _ = await serve()
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], extra_body={field: value}
        )
    assert info.value.body["param"] == field
    assert says in info.value.body["message"]
    assert upstream.submitted == []


async def post_raw(base: str, path: str, data: bytes) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(base + path, data=data, headers=headers) as response,
    ):
        return response.status, await response.json()


@pytest.mark.parametrize(
    ("data", "param", "says"),
    [
        (b'{"prompt": "x", "seed": ' + b"7" * 4301 + b"}", None, "more than 4300 digits"),
        (b'{"prompt": "x", "temperature": 1' + b"0" * 400 + b"}", "temperature", "too large"),
        (b'{"prompt": "x", "top_p": -1' + b"0" * 400 + b"}", "top_p", "too large"),
    ],
)
async def test_numbers_past_int_or_float_range_are_400s_not_500s(serve, data, param, says):
    _, _, base = await serve()
    status, body = await post_raw(base, "/v1/completions", data)
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == param and says in body["error"]["message"]


@pytest.mark.parametrize(
    ("schema", "param"),
    [
        (
            {"type": "object", "properties": {"my-field": {"not": {"type": "string"}}}},
            "response_format.json_schema.schema.properties.my-field.not",
        ),
        ({"$ref": "https://example.com/s.json"}, "response_format.json_schema.schema.$ref"),
    ],
)
async def test_schema_paths_with_any_characters_are_named_as_the_client_sent_them(
    serve, schema, param
):
    _, _, base = await serve()
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": True},
        },
    }
    status, reply = await post_raw(base, "/v1/chat/completions", json.dumps(body).encode())
    assert status == 400 and reply["error"]["param"] == param
    assert reply["error"]["message"].startswith(f"{param}: ")
    assert "constraint." not in reply["error"]["message"]


async def test_the_gateways_own_overload_names_no_param(serve, tokenizer):
    from gateway.core.capacity import CapacityGate
    from radixmesh.capacity import ModelCapacity
    from radixmesh.sampling import Priority

    gate = CapacityGate()
    gate.update([ModelCapacity("tiny", 2.0, {Priority.INTERACTIVE: 0})])
    _, _, base = await serve(capacity=gate)
    status, reply = await post_raw(base, "/v1/completions", b'{"prompt": "x"}')
    assert status == 429 and reply["error"]["param"] is None
    assert reply["error"]["message"].startswith("overloaded: ")


@pytest.mark.parametrize(
    ("method", "path", "status", "says"),
    [
        ("GET", "/v1/chat/completions", 405, "method GET is not allowed"),
        ("PUT", "/v1/completions", 405, "method PUT is not allowed"),
        ("GET", "/v1/nothing", 404, "no such route: GET /v1/nothing"),
        ("POST", "/v1/models", 405, "method POST is not allowed"),
    ],
)
async def test_http_errors_of_the_app_itself_are_openai_error_bodies(
    serve, method, path, status, says
):
    _, _, base = await serve()
    async with aiohttp.ClientSession() as session, session.request(method, base + path) as r:
        assert r.status == status and r.content_type == "application/json"
        error = (await r.json())["error"]
        allow = r.headers.get("Allow")
    assert says in error["message"] and error["param"] is None
    assert error["type"] == "invalid_request_error"
    if status == 405:
        assert allow in ("POST", "GET,HEAD", "HEAD,GET")


async def test_model_ids_may_hold_slashes(tokenizer):
    models = ModelRegistry({"org/model": tokenizer})
    port = free_port()
    app = OpenAIHttpServer(models, ScriptedUpstream(tokenizer)).build_app()
    runner = await start_http_server(app, "127.0.0.1", port)
    base = f"http://127.0.0.1:{port}/v1/models/"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "org/model") as r:
                found = r.status, await r.json()
            async with session.get(base + "org/other") as r:
                missing = r.status, await r.json()
    finally:
        await runner.cleanup()
    assert found == (200, {**found[1], "id": "org/model"})
    assert missing[0] == 404 and missing[1]["error"]["param"] == "model"
    assert "'org/other' is not served here" in missing[1]["error"]["message"]
