"""Runtime edges: JSON variables addressed by path, stop strings, the wall-time limit,
output schemas, and a session's statements checked against what is set so far."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from gateway.programs.core import events as ev
from gateway.programs.core.runtime import ProgramRun
from radixmesh.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument
from radixmesh.v1 import inference_pb2 as ipb
from radixmesh.v1 import program_pb2 as pb
from tests.fixtures.programs import runtime_deps
from tests.unit.programs.builders import compile_program, gen, program, ret, template, text, when

TICKET = {
    "type": "object",
    "properties": {"category": {"enum": ["billing", "shipping"]}},
    "required": ["category"],
    "additionalProperties": False,
}


async def run(deps, message, inputs=None) -> list:
    return [e async for e in ProgramRun(compile_program(message), inputs or {}, deps, "e").events()]


async def test_a_json_gen_is_a_value_addressed_by_path(deps):
    message = program(
        text("Ticket: my invoice is wrong.\n"),
        gen("ticket", max_tokens=16, constraint=ipb.Constraint(json_schema=json.dumps(TICKET))),
        when(
            "equals",
            "ticket.category",
            "billing",
            then=[ret(template="billing team: {ticket.category}")],
            otherwise=[ret(template="shipping team: {ticket.category}")],
        ),
    )
    events = await run(deps, message)
    ticket = events[-1].variables["ticket"]
    assert ticket["category"] in ("billing", "shipping")
    taken = next(e.then for e in events if isinstance(e, ev.BranchTaken))
    assert taken == (ticket["category"] == "billing")
    assert events[-1].value == f"{ticket['category']} team: {ticket['category']}"


async def test_a_stop_string_ends_the_gen_and_the_context_holds_the_text_before_it(deps, engine, tokenizer):
    from radixmesh.sampling import SamplingParams

    prompt = tokenizer.encode_prompt("Hello.")
    plain = await engine.complete(prompt, SamplingParams(max_tokens=12, temperature=0.0))
    text_out = tokenizer.decode(plain.token_ids)
    # a stop string whose first match starts past the output's beginning
    start = next(k for k in range(1, len(text_out) - 2) if text_out.index(text_out[k : k + 3]) == k)
    stop = text_out[start : start + 3]
    message = program(text("Hello."), gen("a", max_tokens=12, stop=[stop]), ret(var="a"))
    run_ = ProgramRun(compile_program(message), {}, deps, "stop")
    events = [e async for e in run_.events()]
    assert events[-1].value == text_out[: text_out.index(stop)]
    assert run_.scope.context.text == "Hello." + events[-1].value


class Stalled:
    """A scheduler that never answers (for the wall-time limit)."""

    supports_holds = True
    supports_prompt_logprobs = True

    def __init__(self) -> None:
        self.released: list[str] = []

    async def submit(self, request):
        await asyncio.Event().wait()
        yield  # pragma: no cover

    async def release_hold(self, hold_id: str) -> None:
        self.released.append(hold_id)


async def test_a_program_past_its_wall_time_ends_with_deadline_exceeded(tiny_model_dir):
    backend = Stalled()
    deps = runtime_deps(backend, tiny_model_dir)
    message = program(text("Hi."), gen("a"), limits=pb.Limits(max_wall_time_ms=50))
    with pytest.raises(DeadlineExceeded, match=re.escape("program: ran past max_wall_time (0.05 s)")):
        await run(deps, message)
    assert backend.released == ["e/ctx"]


async def test_a_value_that_breaks_the_output_schema_fails_the_program(deps):
    schema = json.dumps({"type": "object", "required": ["answer"]})
    with pytest.raises(FailedPrecondition, match=re.escape("body[0].result.output_schema: 'answer' is a required property")):
        await run(deps, program(ret(template='{{"other": 1}}', output_schema=schema)))
    with pytest.raises(FailedPrecondition, match=re.escape("body[0].result.output_schema: the value is not JSON")):
        await run(deps, program(ret(template="plain words", output_schema=schema)))
    events = await run(deps, program(ret(template='{{"answer": "{q}"}}', output_schema=schema)), {"q": "yes"})
    assert events[-1].value == {"answer": "yes"}


async def test_a_session_checks_each_statement_against_the_variables_set_so_far(deps):
    session = ProgramRun(compile_program(program()), {"q": "hi"}, deps, "sess")
    from gateway.programs.convert import statement_from_proto

    first = statement_from_proto(template("{q} there"), "statement[0]")
    events = [e async for e in session.run_statement(first)]
    assert isinstance(events[-1], ev.StatementDone) and not events[-1].returned
    second = statement_from_proto(gen("a", max_tokens=3), "statement[1]")
    done = [e async for e in session.run_statement(second)][-1]
    assert set(done.variables) == {"a"}
    bad = statement_from_proto(template("{b}"), "statement[2]")
    with pytest.raises(InvalidArgument, match=re.escape("statement[2].append.template: variable 'b'")):
        [e async for e in session.run_statement(bad)]
    last = statement_from_proto(ret(template="{a}"), "statement[3]")
    events = [e async for e in session.run_statement(last)]
    assert isinstance(events[-2], ev.ProgramResult) and events[-1].returned
    assert events[-2].value == done.variables["a"]
    await session.release_holds()
