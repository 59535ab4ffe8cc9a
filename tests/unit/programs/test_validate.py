"""Bad programs fail before any token with InvalidArgument naming the statement and field."""

from __future__ import annotations

import re

import pytest

from gateway.programs.core.model import Limits
from gateway.programs.core.runtime import ProgramRun
from radixmesh.errors import InvalidArgument, NotFound
from radixmesh.v1 import inference_pb2 as ipb
from radixmesh.v1 import program_pb2 as pb
from tests.fixtures.programs import runtime_deps
from tests.unit.programs.builders import (
    begin,
    call,
    compile_program,
    copies,
    fork,
    gen,
    program,
    ret,
    select,
    template,
    text,
    when,
)


class NoBackend:
    """Any request fails the test: validation must come first."""

    supports_holds = True
    supports_prompt_logprobs = True

    def submit(self, request):
        raise AssertionError(f"a request was sent: {request}")

    async def release_hold(self, hold_id):
        raise AssertionError("a hold was released")


@pytest.fixture
def deps(tiny_model_dir):
    return runtime_deps(NoBackend(), tiny_model_dir, limits=Limits(max_total_tokens=1000))


def check(deps, message, inputs=None):
    ProgramRun(compile_program(message, deps.limits), inputs or {}, deps, "bad")


BAD = [
    ("unknown variable", program(template("{nope}")), "body[0].append.template: variable 'nope' is not set"),
    ("json path into an unknown variable", program(ret(var="x.y")), "body[0].result.var: variable 'x'"),
    ("bad var name", program(text("a"), gen("1x")), "body[1].gen.var: '1x' is not a variable name"),
    ("unknown tool", program(call("nope", "r")), "body[0].call.tool: unknown tool 'nope'"),
    ("unknown role", program(text("a", "robot")), "body[0].append.role: 'robot'"),
    ("empty statement", program(pb.Statement()), "body[0]: empty statement"),
    ("append without text", program(pb.Statement(append=pb.Append(role="user"))), "body[0].append: one of text or template"),
    ("unbalanced brace", program(template("{a")), "body[0].append.template: unbalanced brace"),
    ("empty choices", program(text("a"), select("s", [])), "body[1].select.choices"),
    ("var set in one branch only", program(when("contains", "q", "x", [gen("a")], []), ret(var="a")), "body[1].result.var: variable 'a' is not set on every path"),
    ("statement after return", program(ret(template="x"), text("more")), "body[1].append: unreachable"),
    ("return in a fork", program(fork([ret(template="x")])), "body[0].fork.branches[0].body[0].result: a fork branch cannot return"),
    ("bad sampling", program(pb.Statement(gen=pb.Gen(var="a", sampling=ipb.SamplingParams(temperature=5)))), "body[0].gen.sampling.temperature"),
    ("bad json schema", program(gen("a", constraint=ipb.Constraint(json_schema='{"type": 5}'))), "body[0].gen.constraint.json_schema: not a valid JSON Schema"),
    ("bad condition regex", program(when("regex", "q", "(", [text("a")])), "body[0].branch.condition.regex.value"),
    ("n above 1", program(gen("a", n=2)), "body[0].gen.sampling.n: programs generate one choice"),
    ("fork without branches", program(pb.Statement(fork=pb.Fork())), "body[0].fork: needs branches"),
    ("fork branches and copies", program(pb.Statement(fork=pb.Fork(branches=[pb.Body()], each=pb.Body(), copies=2))), "body[0].fork: give branches, or each with copies, not both"),
    ("arg in both", program(pb.Statement(call=pb.Call(tool="calculator", var="r", args={"expression": "1"}, json_args={"expression": 1}))), "body[0].call.json_args.expression: also given in args"),
    ("unknown role part", program(pb.Statement(append=pb.Append(text="a", part=7))), "body[0].append.part: 7 is not one of 0 (whole), 1 (begin), 2 (end)"),
    ("unknown select method", program(text("a"), pb.Statement(select=pb.Select(var="s", choices=["x"], method=9))), "body[1].select.method: 9 is not one of 0 (token_length_normalized)"),
    ("unknown on_error", program(pb.Statement(call=pb.Call(tool="calculator", var="r", on_error=5))), "body[0].call.on_error: 5 is not one of 0 (fail), 1 (fallback)"),
]  # fmt: skip


@pytest.mark.parametrize("case, message, expected", BAD, ids=[case for case, _, _ in BAD])
def test_a_bad_program_names_its_statement(deps, case, message, expected):
    with pytest.raises(InvalidArgument, match=re.escape(expected)):
        check(deps, message, {"q": "x"})


@pytest.mark.parametrize(
    "message, expected",
    [
        (program(pb.Statement(gen=pb.Gen(var="a", model="big"))), "body[0].gen.model: model 'big' is not served here"),
        (program(text("a"), name="p", model="big"), "program.model: model 'big' is not served here"),
    ],
)  # fmt: skip
def test_an_unknown_model_is_not_found_naming_its_field(deps, message, expected):
    """As a plain request for a model the mesh does not serve (NOT_FOUND, HTTP 404)."""
    with pytest.raises(NotFound, match=re.escape(expected)):
        check(deps, message)


LIMITS = [
    ("statements", pb.Limits(max_statements=2), program(text("a"), text("b"), text("c")), "body[2].append: over limits.max_statements (2)"),
    ("fork width", pb.Limits(max_fork_width=2), program(copies(3, [text("a")])), "body[0].fork: 3 branches, over limits.max_fork_width (2)"),
    ("depth", pb.Limits(max_depth=2), program(when("contains", "q", "x", [when("contains", "q", "x", [text("a")])])), "body[0].branch.then[0].branch.then: nesting depth over limits.max_depth (2)"),
    ("total tokens", pb.Limits(max_total_tokens=10), program(text("a"), copies(2, [gen("a", max_tokens=6)])), "the Gens may generate 12 tokens, over limits.max_total_tokens (10)"),
]  # fmt: skip


@pytest.mark.parametrize("case, limits, message, expected", LIMITS, ids=[c for c, *_ in LIMITS])
def test_a_program_over_a_limit_is_refused(deps, case, limits, message, expected):
    message.limits.CopyFrom(limits)
    with pytest.raises(InvalidArgument, match=re.escape(expected)):
        check(deps, message, {"q": "x"})


def test_a_limit_above_the_servers_is_refused(deps):
    message = program(text("a"), limits=pb.Limits(max_total_tokens=5000))
    with pytest.raises(InvalidArgument, match=re.escape("limits.max_total_tokens: must be in (0, 1000]")):
        check(deps, message)


def test_the_servers_token_limit_holds_without_a_programs_own(deps):
    with pytest.raises(InvalidArgument, match=re.escape("over limits.max_total_tokens")):
        check(deps, program(text("a"), copies(9, [gen("a", max_tokens=128)])))


def test_variables_both_branches_set_and_fork_joins_are_known_after(deps):
    message = program(
        begin("user"),
        when("contains", "q", "x", [gen("a", max_tokens=2)], [gen("a", max_tokens=2)]),
        copies(2, [gen("b", max_tokens=2)], index_var="i"),
        when("equals", "q", "x", [ret(template="{a}{b}")], [ret(var="b.0")]),
    )
    check(deps, message, {"q": "x"})


def test_a_wall_time_above_the_servers_is_refused_in_milliseconds(deps):
    message = program(text("a"), limits=pb.Limits(max_wall_time_ms=10**9))
    with pytest.raises(InvalidArgument, match=re.escape("limits.max_wall_time_ms: must be in (0, 300000]")):
        check(deps, message)
