"""Clients written by others against a real mesh: the openai package, the generated Python
stubs, a Node.js @grpc/grpc-js client and a plain HTTP POST through Envoy's JSON transcoding.
Greedy decoding of one prompt must give the same text on every path."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

import grpc_tools
import openai
import pytest
from e2e_mesh import API_KEY, REPO, generate

from radixmesh.v1 import inference_pb2 as pb

MAX_TOKENS = 12
QUESTION = "What is the capital of France?"
PROMPT = "The quick brown fox"


def _client(serve) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{serve.http}/v1", api_key=API_KEY, max_retries=0)


def _chat(serve, stream: bool):
    return _client(serve).chat.completions.create(
        model=serve.endpoints["model"],
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=stream,
    )


async def _grpc_text(stub, **fields) -> tuple[str, pb.Complete]:
    request = pb.GenerateRequest(
        sampling=pb.SamplingParams(max_tokens=MAX_TOKENS, temperature=0), **fields
    )
    out = await generate(stub, request)
    return out.text, out.complete


def _chat_messages() -> pb.ChatMessages:
    return pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=QUESTION)])


async def test_openai_chat_whole_and_streamed_agree_with_grpc(serve, stub):
    whole = _chat(serve, stream=False)
    streamed = list(_chat(serve, stream=True))
    text = whole.choices[0].message.content
    assert text
    assert whole.choices[0].finish_reason in ("length", "stop")
    assert whole.usage.completion_tokens <= MAX_TOKENS
    assert whole.usage.prompt_tokens > 0
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text
    assert streamed[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    grpc_text, complete = await _grpc_text(stub, messages=_chat_messages())
    assert grpc_text == text
    assert complete.usage.prompt_tokens == whole.usage.prompt_tokens


async def test_openai_completions_agree_with_grpc_and_json_transcoding(serve, stub):
    completion = _client(serve).completions.create(
        model=serve.endpoints["model"], prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0
    )
    text = completion.choices[0].text
    assert text and completion.object == "text_completion"
    grpc_text, _ = await _grpc_text(stub, prompt=PROMPT)
    assert grpc_text == text
    body = {"prompt": PROMPT, "sampling": {"max_tokens": MAX_TOKENS, "temperature": 0}}
    request = urllib.request.Request(
        f"{serve.http}/v1/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        lines = [json.loads(line) for line in response.read().decode().splitlines() if line]
    assert "".join(m["chunk"]["text"] for m in lines if "chunk" in m) == text
    assert lines[-1]["complete"]["finish_reason"] == completion.choices[0].finish_reason


@pytest.fixture(scope="session")
def node_client(tmp_path_factory) -> Path:
    """A folder with @grpc/grpc-js and @grpc/proto-loader installed by npm, and the client."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed for the Node.js gRPC client")
    folder = tmp_path_factory.mktemp("node-client")
    (folder / "package.json").write_text('{"name": "radixmesh-e2e-client", "private": true}')
    result = subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "@grpc/grpc-js", "@grpc/proto-loader"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"npm install failed:\n{result.stdout}{result.stderr}"
    shutil.copy(Path(__file__).with_name("node_client.js"), folder / "node_client.js")
    return folder


async def test_node_grpc_client_gets_the_same_text(serve, stub, node_client):
    import google.api

    include_dirs = [
        str(REPO / "protos"),
        str(Path(google.api.__path__[0]).parents[1]),  # google/api/annotations.proto
        str(Path(grpc_tools.__file__).parent / "_proto"),  # google/protobuf/*.proto
    ]
    request = {
        "messages": {"messages": [{"role": "user", "content": QUESTION}]},
        "sampling": {"max_tokens": MAX_TOKENS, "temperature": 0},
    }
    result = subprocess.run(
        ["node", "node_client.js", serve.grpc_target, API_KEY, json.dumps(request), *include_dirs],
        cwd=node_client,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert reply["code"] == 0, reply["details"]
    grpc_text, complete = await _grpc_text(stub, messages=_chat_messages())
    assert reply["text"] == grpc_text
    assert reply["finish_reason"] == complete.finish_reason
    assert int(reply["usage"]["completion_tokens"]) == complete.usage.completion_tokens
