"""Property-based fuzz of the public request shapes: HTTP bodies and gRPC GenerateRequests.

Whatever the client sends, the gateway answers with a 2xx or a precise 4xx (gRPC: a
status other than INTERNAL/UNKNOWN) within a deadline, and an error's message is one
line. The gateway runs on a loop thread of its own (tests/fixtures/loop_thread.py) in front
of a scripted scheduler.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_gateway_openai_http import ScriptedUpstream

from gateway.core.models import ModelRegistry
from gateway.openai_http import OpenAIHttpServer, start_http_server
from gateway.server import InferenceServicer
from radixmesh.v1 import inference_pb2, inference_pb2_grpc
from services.common.config import free_port
from tests.fixtures.loop_thread import on_loop_thread
from tests.fixtures.runtime import running_runtime

DEADLINE_S = 10.0
FIELDS = (
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "top_k", "n", "stream", "stream_options", "stop", "stop_token_ids", "seed",
    "logprobs", "top_logprobs", "echo", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "ignore_eos", "min_tokens", "priority", "response_format",
    "session_id", "logit_bias", "user", "tools",
)  # fmt: skip
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["tiny", "user", "assistant", "system", "json_object", "\ud800", ""]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "tool", "x"])},
        optional={"content": values, "name": values},
    ),
    max_size=3,
)
bodies = st.dictionaries(
    st.one_of(st.sampled_from(FIELDS), st.text(max_size=10)), values, max_size=8
).flatmap(
    lambda body: st.fixed_dictionaries(
        {}, optional={"messages": messages, "model": st.just("tiny")}
    ).map(lambda extra: {**body, **extra})
)


@dataclass(frozen=True)
class Gateway:
    http_port: int
    grpc_address: str


@contextlib.asynccontextmanager
async def gateway_server(tokenizer) -> AsyncIterator[Gateway]:
    """The HTTP server and the gRPC servicer over a scripted upstream."""
    models = ModelRegistry({"tiny": tokenizer})
    upstream = ScriptedUpstream(tokenizer)
    http_port = free_port()
    runner = await start_http_server(OpenAIHttpServer(models, upstream).build_app(), "127.0.0.1", http_port)
    servicer = InferenceServicer(models, upstream)

    def register(server):
        inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)

    try:
        async with running_runtime(register, ["radixmesh.v1.Inference"]) as runtime:
            yield Gateway(http_port, runtime.address)
    finally:
        await runner.cleanup()


@pytest.fixture(scope="module")
def gateway(tokenizer):
    with on_loop_thread(lambda: gateway_server(tokenizer)) as gateway:
        yield gateway


def post(port: int, path: str, data: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data, method="POST",
        headers={"content-type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=DEADLINE_S) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def check_http(status: int, raw: bytes, sent: object) -> None:
    assert status < 500, (status, raw[:500], sent)
    if status >= 400:
        message = json.loads(raw)["error"]["message"]
        assert message and "\n" not in message, (message, sent)


@SETTINGS
@given(body=bodies, path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_http_bodies_never_get_a_5xx(gateway, body, path):
    data = json.dumps(body).encode("utf-8", "surrogatepass")
    status, raw = post(gateway.http_port, path, data)
    check_http(status, raw, body)


@SETTINGS
@given(raw=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_raw_bytes_never_get_a_5xx(gateway, raw):
    status, reply = post(gateway.http_port, "/v1/chat/completions", raw)
    check_http(status, reply, raw)


sampling = st.builds(
    inference_pb2.SamplingParams,
    max_tokens=st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
    temperature=st.one_of(st.none(), st.floats(width=32)),
    top_p=st.one_of(st.none(), st.floats(width=32)),
    top_k=st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
    n=st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
    stop=st.lists(st.text(max_size=8), max_size=3),
    stop_token_ids=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3),
)
requests = st.builds(
    inference_pb2.GenerateRequest,
    model=st.sampled_from(["", "tiny", "other"]),
    prompt=st.one_of(st.none(), st.text(max_size=60)),
    sampling=st.one_of(st.none(), sampling),
    priority=st.integers(0, 5),
    request_id=st.one_of(st.just(""), st.text(max_size=20)),
)
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED}


@SETTINGS
@given(request=requests)
def test_grpc_requests_never_get_internal(gateway, request):
    with grpc.insecure_channel(gateway.grpc_address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        try:
            for _ in stub.Generate(request, timeout=DEADLINE_S):
                pass
        except grpc.RpcError as exc:
            assert exc.code() not in BAD, (exc.code(), exc.details(), request)
            assert "\n" not in (exc.details() or ""), exc.details()
