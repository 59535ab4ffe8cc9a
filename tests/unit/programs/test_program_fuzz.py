"""Property-based fuzz of the Programs API: whatever program a client sends, Run ends with
its events or a precise status (never INTERNAL, UNKNOWN or a deadline), its message one
line. The servicer runs over the in-process engine of the tiny model, on a thread of its
own (tests/fixtures/loop_thread.py), so the programs that are valid run for real."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gateway.programs.core.model import Limits
from gateway.programs.server import ProgramsServicer
from mesh.engine import Engine, EngineConfig
from radixmesh.v1 import inference_pb2 as ipb
from radixmesh.v1 import program_pb2 as pb
from radixmesh.v1 import program_pb2_grpc
from services.common.interceptor import ErrorInterceptor
from services.executor.core.grammar import GrammarConfig, GrammarService
from tests.fixtures.loop_thread import on_loop_thread
from tests.fixtures.programs import EngineBackend, runtime_deps

DEADLINE_S = 30.0
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED}
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

names = st.sampled_from(["a", "b", "q", "", "1x", "a.b", "x y", "é"])
texts = st.one_of(
    st.sampled_from(["hi ", "", "{a}", "{q}", "{{", "}", "{nope}", "{a.b}", "{a[0]}", "\x00"]),
    st.text(max_size=12),
)
counts = st.one_of(st.integers(-1, 6), st.sampled_from([2**31 - 1, 5000]))
sampling = st.builds(
    ipb.SamplingParams,
    max_tokens=st.one_of(st.none(), counts),
    min_tokens=st.one_of(st.none(), st.integers(0, 8)),
    temperature=st.one_of(st.none(), st.sampled_from([0.0, 0.7, 3.0, float("nan")])),
    top_k=st.one_of(st.none(), st.integers(-3, 4)),
    n=st.one_of(st.none(), st.integers(0, 3)),
    stop=st.lists(texts, max_size=2),
)
appends = st.builds(
    lambda content, template, role, part: pb.Statement(
        append=pb.Append(**{"template" if template else "text": content}, role=role, part=part)
    ),
    texts,
    st.booleans(),
    st.sampled_from(["", "user", "assistant", "system", "robot"]),
    st.integers(0, 8),
)
gens = st.builds(
    lambda var, s, regex: pb.Statement(
        gen=pb.Gen(var=var, sampling=s, constraint=ipb.Constraint(regex=regex) if regex else None)
    ),
    names,
    sampling,
    st.sampled_from(["", "[a-z]{1,3}", "("]),
)
selects = st.builds(
    lambda var, choices, method: pb.Statement(
        select=pb.Select(var=var, choices=choices, method=method)
    ),
    names,
    st.lists(texts, max_size=4),
    st.integers(0, 9),
)
calls = st.builds(
    lambda tool, var, args, timeout_ms, on_error: pb.Statement(
        call=pb.Call(tool=tool, var=var, args=args, timeout_ms=timeout_ms, on_error=on_error)
    ),
    st.sampled_from(["calculator", "retrieve", "nope", ""]),
    names,
    st.dictionaries(st.sampled_from(["expression", "query", "k", "x"]), texts, max_size=2),
    st.sampled_from([0, 1, 2**32 - 1]),
    st.integers(0, 5),
)
returns = st.builds(
    lambda var, template, schema: pb.Statement(
        result=pb.Return(**({"var": var} if template is None else {"template": template}),
                         output_schema=schema)
    ),
    names,
    st.one_of(st.none(), texts),
    st.sampled_from(["", "{", '{"type": "string"}', '{"type": "object", "required": ["z"]}']),
)  # fmt: skip
leaves = st.one_of(appends, appends, gens, selects, calls, returns)


def _containers(inner):
    bodies = st.lists(inner, max_size=3)
    forks = st.one_of(
        st.lists(bodies, max_size=3).map(
            lambda branches: pb.Statement(fork=pb.Fork(branches=[pb.Body(body=b) for b in branches]))
        ),
        st.builds(
            lambda body, copies, index_var: pb.Statement(
                fork=pb.Fork(each=pb.Body(body=body), copies=copies, index_var=index_var)
            ),
            bodies,
            st.sampled_from([0, 1, 3, 2000]),
            names,
        ),
    )
    ifs = st.builds(
        lambda kind, var, value, negate, then, otherwise: pb.Statement(
            branch=pb.If(
                condition=pb.Condition(**{kind: pb.VarValue(var=var, value=value)}, negate=negate)
                if kind else pb.Condition(negate=negate),
                then=then,
                otherwise=otherwise,
            )
        ),
        st.sampled_from(["contains", "equals", "regex", None]),
        names,
        st.sampled_from(["a", "", "(", ".*"]),
        st.booleans(),
        bodies,
        bodies,
    )  # fmt: skip
    return st.one_of(forks, ifs)


statements = st.recursive(leaves, _containers, max_leaves=8)
requests = st.builds(
    lambda name, model, body, inputs, request_id: pb.RunProgramRequest(
        program=pb.Program(name=name, model=model, body=body),
        inputs=inputs,
        request_id=request_id,
    ),
    st.sampled_from(["", "p"]),
    st.sampled_from(["", "nope"]),
    st.lists(statements, max_size=5),
    st.dictionaries(st.sampled_from(["q", "a", "1x"]), texts, max_size=2),
    st.sampled_from(["", "r"]),
)


# Programs of the same shapes drawn from a vocabulary that mostly validates, so that most
# of them run: forks, selects, tool calls and ifs over the engine for real.
plain_texts = st.sampled_from(["Hello. ", "Q: ", "A: ", "x"])
runnable_leaves = st.one_of(
    st.builds(
        lambda text, role: pb.Statement(append=pb.Append(text=text, role=role)),
        plain_texts,
        st.sampled_from(["", "user", "assistant"]),
    ),
    st.builds(
        lambda var, max_tokens, temperature: pb.Statement(
            gen=pb.Gen(var=var, sampling=ipb.SamplingParams(max_tokens=max_tokens, temperature=temperature))
        ),
        st.sampled_from(["a", "b"]),
        st.integers(1, 4),
        st.sampled_from([0.0, 0.7]),
    ),
    st.builds(
        lambda var, choices, method: pb.Statement(select=pb.Select(var=var, choices=choices, method=method)),
        st.sampled_from(["a", "b"]),
        st.lists(st.sampled_from(["yes", "no", "maybe", "y"]), min_size=1, max_size=4, unique=True),
        st.integers(0, 2),
    ),
    st.builds(
        lambda on_error: pb.Statement(
            call=pb.Call(tool="calculator", var="c", args={"expression": "1+2"}, on_error=on_error, fallback="0")
        ),
        st.integers(0, 1),
    ),
)  # fmt: skip


def _runnable_containers(inner):
    bodies = st.lists(inner, min_size=1, max_size=3)
    return st.one_of(
        st.lists(bodies, min_size=1, max_size=3).map(
            lambda branches: pb.Statement(fork=pb.Fork(branches=[pb.Body(body=b) for b in branches]))
        ),
        st.builds(
            lambda body, copies: pb.Statement(fork=pb.Fork(each=pb.Body(body=body), copies=copies, index_var="i")),
            bodies,
            st.integers(1, 3),
        ),
        st.builds(
            lambda value, then, otherwise: pb.Statement(
                branch=pb.If(condition=pb.Condition(contains=pb.VarValue(var="q", value=value)), then=then, otherwise=otherwise)
            ),
            st.sampled_from(["x", "z"]),
            bodies,
            bodies,
        ),
    )  # fmt: skip


runnable = st.lists(st.recursive(runnable_leaves, _runnable_containers, max_leaves=6), min_size=1, max_size=4).map(
    lambda body: pb.RunProgramRequest(program=pb.Program(body=[pb.Statement(append=pb.Append(text="Start. ")), *body]), inputs={"q": "x"})
)  # fmt: skip


@contextlib.asynccontextmanager
async def programs_server(model_dir) -> AsyncIterator[str]:
    """The Programs servicer over an in-process engine; its address."""
    grammar = GrammarService.from_model_dir(model_dir, config=GrammarConfig(compile_timeout_s=60))
    config = EngineConfig.for_model(
        str(model_dir), device="cpu", page_size=4, num_pages=256, max_num_seqs=32
    )
    engine = Engine(config, grammar=grammar)
    await engine.start()
    deps = runtime_deps(EngineBackend(engine), model_dir, limits=Limits(max_total_tokens=256))
    server = grpc.aio.server(interceptors=[ErrorInterceptor()])
    program_pb2_grpc.add_ProgramsServicer_to_server(ProgramsServicer(deps), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)
        await engine.stop()
        grammar.close(wait=True)


@pytest.fixture(scope="module")
def address(tiny_model_dir):
    with on_loop_thread(lambda: programs_server(tiny_model_dir)) as address:
        yield address


def run(address, request) -> None:
    """Run one program; its status, or that it ended with a result or an error event."""
    with grpc.insecure_channel(address) as channel:
        stub = program_pb2_grpc.ProgramsStub(channel)
        try:
            events = list(stub.Run(request, timeout=DEADLINE_S))
        except grpc.RpcError as exc:
            event(exc.code().name)
            assert exc.code() not in BAD, (exc.code(), exc.details(), request)
            assert "\n" not in (exc.details() or ""), exc.details()
        else:
            last = events[-1].WhichOneof("event") if events else None
            event(f"ran, ended with {last}")
            assert last in ("result", "error"), (last, request)  # a run says how it ended


@SETTINGS
@given(request=requests)
def test_programs_never_get_internal(address, request):
    run(address, request)


@SETTINGS
@given(request=runnable)
def test_programs_that_run_end_with_a_result_or_an_error(address, request):
    run(address, request)


@pytest.mark.parametrize(
    "request_, code, expected",
    [
        (pb.RunProgramRequest(), grpc.StatusCode.INVALID_ARGUMENT, "program: required"),
        (pb.RunProgramRequest(program=pb.Program(name="p")), grpc.StatusCode.INVALID_ARGUMENT, "program.body: empty"),
        (
            pb.RunProgramRequest(program=pb.Program(body=[pb.Statement(append=pb.Append(text="a"))], model="nope")),
            grpc.StatusCode.NOT_FOUND,
            "program.model: model 'nope' is not served here",
        ),
    ],
    ids=["no program", "empty body", "unknown model"],
)
def test_a_run_without_a_program_or_for_an_unknown_model_is_refused_naming_the_field(
    address, request_, code, expected
):
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as raised:
        list(program_pb2_grpc.ProgramsStub(channel).Run(request_, timeout=DEADLINE_S))
    assert raised.value.code() == code
    assert raised.value.details().startswith(expected), raised.value.details()
