"""Programs through `radixmesh serve`: the seed example from Python (radixmesh.lang) and
Node.js (one Programs/Run call), the JSON route through Envoy, bad programs refused.

The retrieval branch runs the tool and answers under the JSON schema; a repeated query
is answered from the tool result cache; the answer's cached_tokens show the context
built by the statements before it was not prefilled again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc_tools
import jsonschema
import pytest
from e2e_mesh import API_KEY, REPO
from google.protobuf import json_format

from radixmesh.lang import Client, ProgramFailed, program, user
from radixmesh.v1 import program_pb2 as pb

sys.path.insert(0, str(REPO / "examples" / "programs"))
import seed

SEED_JSON = REPO / "examples" / "programs" / "seed_program.json"
ANSWER = json.loads((REPO / "examples" / "programs" / "answer_schema.json").read_text())
PAGE_SIZE = 16  # radixmesh serve's default on CPU


@pytest.fixture
def client(serve) -> Client:
    return Client(serve.grpc_target, api_key=API_KEY)


def events_of(result, kind: str) -> list:
    return [getattr(e, kind) for e in result.events if e.WhichOneof("event") == kind]


def test_the_shipped_program_json_is_what_the_python_example_compiles_to():
    shipped = json_format.ParseDict(json.loads(SEED_JSON.read_text()), pb.Program())
    assert shipped == seed.handle_user_query.compile()


async def test_the_seed_takes_the_retrieval_branch_caches_the_tool_and_keeps_its_context(client):
    query = "请检索退款政策 refund"
    first = await seed.handle_user_query.arun(client=client, query=query, history="")
    assert [b.then for b in events_of(first, "branch")] == [True]
    jsonschema.validate(first.value, ANSWER)
    assert first["docs"][0]["id"] == "refunds"
    assert [t.cached for t in events_of(first, "tool_finished")] == [False]
    search, answer = first.usage
    # the answer's prompt starts with the context the search Gen saw: served from the cache
    assert answer["prompt_tokens"] > search["prompt_tokens"] + search["completion_tokens"]
    assert answer["cached_tokens"] >= (search["prompt_tokens"] // PAGE_SIZE) * PAGE_SIZE > 0

    again = await seed.handle_user_query.arun(client=client, query=query, history="")
    assert [t.cached for t in events_of(again, "tool_finished")] == [True]
    assert again.value == first.value  # greedy, and the same retrieval
    assert again.usage[0]["cached_tokens"] > 0  # the second program reuses the first's KV


async def test_another_query_takes_the_chat_branch(client):
    result = await seed.handle_user_query.arun(client=client, query="hello", history="hi")
    assert [b.then for b in events_of(result, "branch")] == [False]
    assert events_of(result, "tool_started") == []
    jsonschema.validate(result.value, ANSWER)


async def test_interactive_mode_gives_the_compiled_result(client):
    query = "检索 shipping"
    compiled = await seed.handle_user_query.arun(client=client, query=query, history="")
    interactive = await seed.handle_user_query.arun(
        client=client, mode="interactive", query=query, history=""
    )
    assert interactive.value == compiled.value
    assert interactive.variables == compiled.variables


async def test_a_bad_program_is_invalid_argument_naming_the_statement(client):
    @program
    def bad(s):
        s += user("{missing}")

    with pytest.raises(ProgramFailed, match=r"INVALID_ARGUMENT: body\[0\]\.append\.template"):
        await bad.arun(client=client)


def _post(serve, path: str, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(
        serve.http + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {API_KEY}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_the_json_route_runs_a_program_and_streams_its_events(serve, client):
    body = {"program": json.loads(SEED_JSON.read_text()), "inputs": {"query": "hello", "history": ""}}
    status, text = _post(serve, "/v1/programs/run", body)
    assert status == 200, text
    events = [json.loads(line) for line in text.splitlines() if line]
    assert "result" in events[-1]
    expected = await seed.handle_user_query.arun(client=client, query="hello", history="")
    assert json.loads(events[-1]["result"]["value_json"]) == expected.value

    bad = {"program": {"body": [{"append": {"template": "{nope}"}}]}}
    status, text = _post(serve, "/v1/programs/run", bad)
    assert status == 400 and "body[0].append.template" in text


@pytest.fixture(scope="session")
def node_modules(tmp_path_factory) -> Path:
    """examples/node's dependencies installed by npm into a folder of their own."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed for the Node.js example")
    folder = tmp_path_factory.mktemp("node-example")
    shutil.copy(REPO / "examples" / "node" / "package.json", folder / "package.json")
    result = subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"npm install failed:\n{result.stdout}{result.stderr}"
    return folder / "node_modules"


async def test_the_node_example_runs_the_seed_in_one_call(serve, client, node_modules):
    import google.api

    includes = [
        str(Path(google.api.__path__[0]).parents[1]),
        str(Path(grpc_tools.__file__).parent / "_proto"),
    ]
    query = "请检索保修 warranty"
    argv = ["node", str(REPO / "examples" / "node" / "seed.js"), serve.grpc_target, query]
    argv += ["--api-key", API_KEY]
    for folder in includes:
        argv += ["--include", folder]
    result = subprocess.run(
        argv,
        env={**os.environ, "NODE_PATH": str(node_modules)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert reply["code"] == 0, reply["details"]
    assert reply["retrieval_branch"] is True
    jsonschema.validate(reply["result"], ANSWER)
    python = await seed.handle_user_query.arun(client=client, query=query, history="")
    assert reply["result"] == python.value


async def _locked_pages(serve) -> int:
    from services.cache.client import CacheClient

    address = next(s["address"] for s in serve.endpoints["services"] if s["name"] == "cache")
    async with CacheClient(address) as cache:
        return sum(p.num_locked_pages for p in await cache.stats())


async def test_a_program_whose_client_goes_away_gives_its_pages_back(serve):
    import asyncio

    import grpc

    from radixmesh.v1 import inference_pb2 as ipb
    from radixmesh.v1 import program_pb2_grpc

    before = await _locked_pages(serve)
    long = ipb.SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
    message = pb.Program(
        body=[
            pb.Statement(append=pb.Append(text="Hello there, " * 8)),
            pb.Statement(gen=pb.Gen(var="a", sampling=ipb.SamplingParams(max_tokens=4))),
            pb.Statement(gen=pb.Gen(var="b", sampling=long)),
        ],
        limits=pb.Limits(max_total_tokens=500),
    )
    async with grpc.aio.insecure_channel(serve.grpc_target) as channel:
        call = program_pb2_grpc.ProgramsStub(channel).Run(
            pb.RunProgramRequest(program=message), metadata=(("authorization", f"Bearer {API_KEY}"),)
        )
        async for event in call:
            if event.WhichOneof("event") == "text" and event.text.var == "b":
                break  # b is generating on the held context of a
        held = await _locked_pages(serve)
        call.cancel()
    assert held > before
    for _ in range(300):  # across processes there is no event to await: read the pool
        if await _locked_pages(serve) == before:
            break
        await asyncio.sleep(0.1)
    assert await _locked_pages(serve) == before


async def test_a_programs_gens_equal_plain_generate_calls_on_the_same_tokens(serve, stub, client):
    from e2e_mesh import AUTH, generate

    from radixmesh.lang import gen, text
    from radixmesh.v1 import inference_pb2 as ipb

    first, second = "Hello there, tell me a story.", " And then what happened?"

    @program
    def two_turns(s):
        s += text(first)
        s += gen("a", max_tokens=8)
        s += text(second)
        s += gen("b", max_tokens=8)

    result = await two_turns.arun(client=client)

    async def tokens(prompt: str) -> list[int]:
        reply = await stub.Tokenize(ipb.TokenizeRequest(prompt=prompt), metadata=AUTH)
        return list(reply.token_ids)

    greedy = ipb.SamplingParams(max_tokens=8, temperature=0)
    prompt_a = await tokens(first)
    a = await generate(stub, ipb.GenerateRequest(token_ids=ipb.TokenIds(ids=prompt_a), sampling=greedy))
    bos, *second_ids = await tokens(second)  # Tokenize puts <|bos|> (0) first
    assert bos == prompt_a[0] == 0
    output_a = a.token_ids[:-1] if a.token_ids[-1:] == [1] else a.token_ids  # 1: <|eos|>
    prompt_b = prompt_a + output_a + second_ids
    b = await generate(stub, ipb.GenerateRequest(token_ids=ipb.TokenIds(ids=prompt_b), sampling=greedy))
    assert (result["a"], result["b"]) == (a.text, b.text)
    assert result.usage[1]["prompt_tokens"] == len(prompt_b)


async def test_select_through_the_mesh_picks_the_best_scored_choice(client):
    from radixmesh.lang import assistant, select, system

    @program
    def route(s, query):
        s += system("You route support requests.")
        s += user(query)
        s += assistant(select("route", ["retrieve documents", "chat"]))
        return s["route"]

    compiled = await route.arun(client=client, query="where is my parcel")
    interactive = await route.arun(client=client, mode="interactive", query="where is my parcel")
    (scores,) = events_of(compiled, "select")
    best = max(scores.scores, key=lambda c: c.score)
    assert compiled.value == best.choice == interactive.value
    assert all(c.num_tokens >= 1 and c.logprob_sum < 0 for c in scores.scores)
    (again,) = events_of(interactive, "select")
    assert [round(c.logprob_sum, 3) for c in again.scores] == [
        round(c.logprob_sum, 3) for c in scores.scores
    ]
