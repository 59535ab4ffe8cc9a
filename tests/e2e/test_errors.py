"""Bad input and missing keys through the whole mesh: each gets its status and a message
naming the field, on the OpenAI HTTP API and on gRPC (overload: test_serve_redis.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import pytest
from e2e_mesh import API_KEY, AUTH

from radixmesh.v1 import inference_pb2 as pb

CONTEXT = 2048  # the tiny model's max_position_embeddings
LONG_PROMPT = "hello world " * CONTEXT  # more tokens than the context holds


def _post(serve, path: str, body: bytes, key: str | None = API_KEY) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(f"{serve.http}{path}", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


OPENAI_ERROR = {
    400: ("invalid_request_error", "invalid_argument"),
    401: ("authentication_error", "unauthenticated"),
    404: ("invalid_request_error", "not_found"),
}
"""HTTP status -> the OpenAI error body's (type, code)."""


def _chat(**fields) -> bytes:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/v1/chat/completions", _chat(model="no-such-model"), 404, "model"),
        ("/v1/chat/completions", _chat(max_tokens=-1), 400, "max_tokens"),
        ("/v1/chat/completions", _chat(max_tokens=10**6), 400, "max_tokens"),
        ("/v1/chat/completions", _chat(temperature="hot"), 400, "temperature"),
        ("/v1/chat/completions", _chat(n="two"), 400, "n"),
        ("/v1/chat/completions", _chat(messages=[]), 400, "messages"),
        ("/v1/chat/completions", _chat(messages=[{"role": "robot", "content": "x"}]), 400, "role"),
        ("/v1/completions", json.dumps({"prompt": LONG_PROMPT}).encode(), 400, "prompt"),
        ("/v1/completions", b'{"prompt": "caf\xc3", "max_tokens": 2}', 400, "UTF-8"),
        ("/v1/completions", b'{"prompt": ', 400, "JSON"),
    ],
)
def test_bad_http_input_gets_its_status_and_names_the_field(serve, path, body, status, field):
    code, reply = _post(serve, path, body)
    assert code == status, reply
    error = reply["error"]
    assert field in f"{error['message']} {error.get('param')}"
    # OpenAI's own types: an unknown model is an invalid request too (404, code not_found)
    assert (error["type"], error["code"]) == OPENAI_ERROR[status]


def test_missing_api_key_is_401(serve):
    code, reply = _post(serve, "/v1/chat/completions", _chat(), key=None)
    assert code == 401
    assert "API key" in reply["error"]["message"]
    assert (reply["error"]["type"], reply["error"]["code"]) == OPENAI_ERROR[401]


@pytest.mark.parametrize(
    ("fields", "code", "field"),
    [
        ({"prompt": "hi", "model": "no-such-model"}, grpc.StatusCode.NOT_FOUND, "model"),
        (
            {"prompt": "hi", "sampling": pb.SamplingParams(max_tokens=-3)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "max_tokens",
        ),
        ({"prompt": LONG_PROMPT}, grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
        (
            {"messages": pb.ChatMessages(messages=[])},
            grpc.StatusCode.INVALID_ARGUMENT,
            "messages",
        ),
        ({"token_ids": pb.TokenIds(ids=[10**7])}, grpc.StatusCode.INVALID_ARGUMENT, "prompt[0]"),
    ],
)
async def test_bad_grpc_input_gets_its_status(stub, fields, code, field):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in stub.Generate(pb.GenerateRequest(**fields), metadata=AUTH):
            pass
    assert info.value.code() == code
    assert field in info.value.details()
