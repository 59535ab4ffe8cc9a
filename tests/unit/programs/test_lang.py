"""The Python frontend against a real Programs servicer (in-process gRPC over the engine):
compiled and interactive modes give the same results; sync, streaming and batch forms."""

from __future__ import annotations

import asyncio
import re

import grpc
import pytest

from gateway.programs.server import ProgramsServicer
from radixmesh.lang import (
    Client,
    ProgramFailed,
    assistant,
    gen,
    program,
    select,
    system,
    text,
    tool,
    user,
)
from radixmesh.v1 import program_pb2 as pb
from radixmesh.v1 import program_pb2_grpc
from services.common.interceptor import ErrorInterceptor

ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 12}},
    "required": ["answer"],
    "additionalProperties": False,
}


@program
def triage(s, query):
    s += system("You route support requests.")
    s += user(query)
    s += assistant(select("route", ["retrieve", "chat"]))
    if s["route"] == "retrieve":
        s += tool("retrieve", query=query, k=2, out="docs")
        s += user("Answer from: {docs.0.text}")
    s += assistant(gen("answer", max_tokens=24, json_schema=ANSWER))
    return s["answer"]


@program
def seed(s, query):
    s += system("You help customers.")
    if "检索" in query:
        s += tool("retrieve", query=query, k=1, out="docs")
        s += user(f"Documents: {s['docs']}\nQuestion: {query}")
        s += assistant(gen("answer", max_tokens=24, json_schema=ANSWER))
        return s["answer"]
    s += user(query)
    s += assistant(gen("reply", max_tokens=6))
    forks = s.fork(2, index_var="i")
    for f in forks:
        f += text("Option {i}")
        f += gen("option", max_tokens=3)
    forks.join()
    return s["option"]


@pytest.fixture
async def client(deps):
    server = grpc.aio.server(interceptors=[ErrorInterceptor()])
    program_pb2_grpc.add_ProgramsServicer_to_server(ProgramsServicer(deps), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield Client(f"127.0.0.1:{port}")
    await server.stop(None)


def test_compiled_mode_turns_python_ifs_into_if_statements():
    compiled = seed.compile()
    kinds = [s.WhichOneof("kind") for s in compiled.body]
    assert kinds == ["append", "branch"]
    branch = compiled.body[1].branch
    assert branch.condition.contains.var == "query" and branch.condition.contains.value == "检索"
    assert branch.then[0].call.args["query"] == "{query}"
    assert branch.then[1].append.template == "Documents: {docs}\nQuestion: {query}"
    assert [s.WhichOneof("kind") for s in branch.otherwise][-2:] == ["fork", "result"]


@pytest.mark.parametrize("query", ["请检索退款政策 refund", "hello, where is my parcel"])
@pytest.mark.parametrize("fn", [seed, triage], ids=["seed", "triage"])
async def test_interactive_and_compiled_modes_give_the_same_results(client, fn, query):
    compiled = await fn.arun(client=client, query=query)
    interactive = await fn.arun(client=client, mode="interactive", query=query)
    assert interactive.value == compiled.value
    assert interactive.variables == compiled.variables
    assert [u["completion_tokens"] for u in interactive.usage] == [
        u["completion_tokens"] for u in compiled.usage
    ]


async def test_the_seed_branches_on_its_query(client):
    retrieval = await seed.arun(client=client, query="检索 refund")
    assert set(retrieval.value) == {"answer"} and retrieval["docs"][0]["id"] == "refunds"
    chat = await seed.arun(client=client, query="hello")
    assert "docs" not in chat.variables and len(chat.value) == 2


async def test_streaming_yields_text_deltas_then_the_result(client):
    events = [e async for e in seed.astream(client=client, query="hello")]
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[-1] == "result" and "text" in kinds and "branch" in kinds
    reply = "".join(e.text.text for e in events if e.WhichOneof("event") == "text" and e.text.var == "reply")
    result = await seed.arun(client=client, query="hello")
    assert reply == result["reply"]


async def test_the_sync_forms_and_run_batch(client):
    queries = [{"query": q} for q in ("检索 refund", "hello", "检索 shipping", "bye")]
    batch = await asyncio.to_thread(seed.run_batch, queries, concurrency=2, client=client)
    one_by_one = [await seed.arun(client=client, **q) for q in queries]
    assert [r.value for r in batch] == [r.value for r in one_by_one]
    single = await asyncio.to_thread(lambda: seed.run(client=client, query="hello"))
    assert single.value == one_by_one[1].value
    streamed = await asyncio.to_thread(lambda: list(seed.run(client=client, stream=True, query="bye")))
    assert streamed[-1].result.value_json


async def test_a_bad_program_fails_with_the_statement_named(client):
    @program
    def bad(s):
        s += user("{nowhere}")

    with pytest.raises(ProgramFailed, match=r"INVALID_ARGUMENT: body\[0\]\.append\.template"):
        await bad.arun(client=client)
    with pytest.raises(ProgramFailed, match=r"INVALID_ARGUMENT: statement\[0\]\.append\.template"):
        await bad.arun(client=client, mode="interactive")


async def test_a_session_that_closes_releases_its_holds(client, deps, engine):
    released = asyncio.Event()
    release = deps.backend.release_hold

    async def release_and_signal(hold_id: str) -> None:
        await release(hold_id)
        released.set()

    deps.backend.release_hold = release_and_signal
    async with client.session(pb.SessionStart()) as session:
        for statement in (text("Hello.") + gen("a", max_tokens=3)).statements:
            await session.run(statement)
        assert sum(s.num_locked_pages for s in engine.cache_stats()) > 0  # the context is held
    await asyncio.wait_for(released.wait(), 30)
    assert sum(s.num_locked_pages for s in engine.cache_stats()) == 0


async def test_a_session_must_start_with_a_start_and_then_send_statements(client):
    async with grpc.aio.insecure_channel(client.target) as channel:
        stub = program_pb2_grpc.ProgramsStub(channel)
        call = stub.Session(iter([pb.SessionRequest(statement=text("hi").statements[0])]))
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call.read()
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "the first request must be a start" in error.value.details()
        twice = [pb.SessionRequest(start=pb.SessionStart()), pb.SessionRequest(start=pb.SessionStart())]
        call = stub.Session(iter(twice))
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call.read()
        assert "statement[0]: expected a statement, got a second start" in error.value.details()
        empty = [pb.SessionRequest(start=pb.SessionStart()), pb.SessionRequest()]
        call = stub.Session(iter(empty))
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call.read()
        assert "statement[0]: expected a statement, got an empty request" in error.value.details()


async def test_run_refuses_an_unknown_priority_and_an_over_limit_request(client):
    async with grpc.aio.insecure_channel(client.target) as channel:
        stub = program_pb2_grpc.ProgramsStub(channel)
        request = pb.RunProgramRequest(program=pb.Program(body=text("hi").statements), priority=9)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.Run(request).read()
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        over = pb.RunProgramRequest(
            program=pb.Program(body=text("hi").statements, limits=pb.Limits(max_fork_width=10**6))
        )
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.Run(over).read()
        assert "limits.max_fork_width: must be in (0, 16]" in error.value.details()


@program
def checked_branches(s, query):
    s += user(query)
    forks = s.fork(2, index_var="i")
    for f in forks:
        f += text("Draft {i}: ")
        f += gen("draft", max_tokens=3)
        if f["draft"].matches("[aeiou]"):
            f += gen("more", max_tokens=2)
        else:
            f += text(" (no vowel)")
    forks.join()
    return s["draft"]


@program
def nested_forks(s, query):
    s += user(query)
    outer = s.fork(2, index_var="i")
    for o in outer:
        o += text("Plan {i}: ")
        inner = o.fork(2, index_var="j")
        for f in inner:
            f += text("step {j} ")
            f += gen("step", max_tokens=2)
        if query == "go":
            o += gen("summary", max_tokens=2)
    outer.join()
    return s["step"]


def test_an_if_inside_fork_branches_compiles_into_each_branch():
    (_, fork_statement, _) = checked_branches.compile().body
    fork = fork_statement.fork
    assert len(fork.branches) == 2 and fork.index_var == "i"
    for branch in fork.branches:  # the other iteration's if is left out of each branch
        assert [s.WhichOneof("kind") for s in branch.body] == ["append", "gen", "branch"]
        then, otherwise = branch.body[2].branch.then, branch.body[2].branch.otherwise
        assert branch.body[2].branch.condition.regex.var == "draft"
        assert [s.gen.var for s in then] == ["more"]
        assert [s.append.text for s in otherwise] == [" (no vowel)"]


def test_forks_nest_and_an_if_on_an_input_lands_in_each_outer_branch():
    (_, fork_statement, _) = nested_forks.compile().body
    for branch in fork_statement.fork.branches:
        kinds = [s.WhichOneof("kind") for s in branch.body]
        assert kinds == ["append", "fork", "branch"]
        inner = branch.body[1].fork
        assert inner.index_var == "j" and [b.body[1].gen.var for b in inner.branches] == ["step", "step"]
        assert branch.body[2].branch.condition.equals.var == "query"


async def test_an_if_on_a_branch_variable_runs_compiled(client):
    result = await checked_branches.arun(client=client, query="Write two drafts.")
    drafts = result["draft"]
    assert len(drafts) == 2
    vowels = [re.search("[aeiou]", d) is not None for d in drafts]
    taken = [e.branch.then for e in result.events if e.WhichOneof("event") == "branch"]
    assert sorted(taken) == sorted(vowels)  # each branch decided on its own draft
    assert ("more" in result.variables) == any(vowels), (drafts, result.variables)


@program
def first_branch_differs(s, query):
    s += user(query)
    forks = s.fork(3, index_var="i")
    for f in forks:
        f += gen("draft", max_tokens=2)
        if f["i"] == "0":
            f += gen("more", max_tokens=2)
        else:
            f += text(" (plain)")
    forks.join()


async def test_branches_take_their_own_way_and_both_modes_agree(client):
    compiled = await first_branch_differs.arun(client=client, query="Three drafts.")
    taken = [e.branch.then for e in compiled.events if e.WhichOneof("event") == "branch"]
    assert sorted(taken) == [False, False, True]
    more = compiled["more"]
    assert more[0] != "" and more[1:] == ["", ""]
    interactive = await first_branch_differs.arun(client=client, mode="interactive", query="Three drafts.")
    assert interactive.variables == compiled.variables


async def test_an_if_on_a_branch_variable_is_refused_interactively(client):
    with pytest.raises(TypeError, match="an if on 'draft' inside fork branches"):
        await checked_branches.arun(client=client, mode="interactive", query="Write two drafts.")


@pytest.mark.parametrize("query", ["go", "stop"])
async def test_nested_forks_give_the_same_results_in_both_modes(client, query):
    compiled = await nested_forks.arun(client=client, query=query)
    interactive = await nested_forks.arun(client=client, mode="interactive", query=query)
    assert compiled.variables == interactive.variables
    steps = compiled["step"]
    assert len(steps) == 2 and all(isinstance(s, list) and len(s) == 2 for s in steps)
    assert ("summary" in compiled.variables) == (query == "go")


def test_paths_through_several_ifs_merge_into_nested_ifs():
    @program
    def nested(s, a, b):
        if a == "1":
            s += text("A")
        if b.contains("2"):
            s += text("B")
        return s["a"]

    body = nested.compile().body
    assert [s.WhichOneof("kind") for s in body] == ["branch"]
    then, otherwise = body[0].branch.then, body[0].branch.otherwise
    assert then[0].append.text == "A" and then[1].branch.condition.contains.value == "2"
    assert otherwise[0].branch.then[0].append.text == "B"
    assert [s.WhichOneof("kind") for s in otherwise[0].branch.otherwise] == ["result"]


def test_an_if_taken_inside_a_fork_on_an_input_becomes_an_if_after_the_join():
    @program
    def after(s, query):
        forks = s.fork(2)
        for f in forks:
            f += gen("a", max_tokens=2)
        if query == "x":
            s += text("after")

    fork, branch = after.compile().body
    assert [len(b.body) for b in fork.fork.branches] == [1, 1]
    assert branch.branch.condition.equals.var == "query"
    assert [s.append.text for s in branch.branch.then] == ["after"] and not branch.branch.otherwise


def test_an_if_on_a_branch_variable_that_decides_statements_after_the_join_is_refused():
    @program
    def leaky(s, query):
        forks = s.fork(2)
        for f in forks:
            f += gen("a", max_tokens=2)
        if forks[0]["a"] == "yes":
            s += text("after")

    with pytest.raises(TypeError, match="an if on 'a', a fork branch's variable, decides statements after the join"):
        leaky.compile()


def never(**_):
    return asyncio.Event().wait()  # a tool that never answers


@program
def stuck(s, q):
    s += user(q)
    s += tool("stuck", out="r")
    s += assistant(gen("after", max_tokens=2))
    return s["after"]


@pytest.fixture
async def stuck_client(deps):
    """A server whose tool `stuck` never answers (its own timeout: 300 s)."""
    from gateway.programs.core.tools import Tool

    deps.tools.register(Tool("stuck", never, timeout_s=300))
    server = grpc.aio.server(interceptors=[ErrorInterceptor()])
    program_pb2_grpc.add_ProgramsServicer_to_server(ProgramsServicer(deps), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(None)


@pytest.mark.parametrize("mode", ["compiled", "interactive"])
async def test_the_client_timeout_bounds_the_whole_program_in_both_modes(stuck_client, mode):
    client = Client(stuck_client, timeout_s=0.5)
    with pytest.raises(ProgramFailed) as info:
        await asyncio.wait_for(stuck.arun(client=client, mode=mode, q="hi"), 30)
    assert info.value.code == "DEADLINE_EXCEEDED"


@pytest.mark.parametrize("timeout_s", [-1, 0, 0.0, float("nan"), float("inf"), True, "1"])
def test_a_client_timeout_that_is_not_a_positive_finite_number_is_refused(timeout_s):
    with pytest.raises(ValueError, match=r"^timeout_s: must be None or a finite number of seconds > 0, got "):
        Client("127.0.0.1:1", timeout_s=timeout_s)


def test_a_client_timeout_of_none_or_a_positive_number_is_kept():
    assert Client("127.0.0.1:1").timeout_s is None
    assert Client("127.0.0.1:1", timeout_s=2).timeout_s == 2
    assert Client("127.0.0.1:1", timeout_s=0.25).timeout_s == 0.25
