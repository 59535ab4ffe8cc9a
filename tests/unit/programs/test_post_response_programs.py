"""post_response plugins on programs: what a program sends out (text deltas, variables
set, tool arguments, the result's variables and value) is rewritten, while the run's own
context and variables keep the model's text."""

from __future__ import annotations

import dataclasses
import re

from gateway.programs.core import events as ev
from gateway.programs.core.plugins import PluginChain, RegexRedaction
from gateway.programs.core.runtime import ProgramRun
from tests.unit.programs.builders import call, compile_program, gen, program, ret, text

PROMPT = "Tell me a number."


async def run_with(deps, chain: PluginChain, message) -> tuple[ProgramRun, list]:
    deps = dataclasses.replace(deps, plugins=chain)
    run = ProgramRun(compile_program(message), {}, deps, "p")
    return run, [e async for e in run.events()]


def seed_message():
    return program(
        text(PROMPT),
        gen("answer", max_tokens=24),
        call("calculator", "sum", args={"expression": "1 + 1"}),
        ret(var="answer"),
    )


async def secret_of(deps) -> tuple[str, str]:
    _, events = await run_with(deps, PluginChain(), seed_message())
    raw = events[-1].variables["answer"]
    word = raw.strip()[:4]
    assert raw.count(word) >= 2, raw
    return raw, word


async def test_a_streaming_redaction_rewrites_everything_a_program_sends(deps):
    raw, secret = await secret_of(deps)
    chain = PluginChain((RegexRedaction([re.escape(secret)], max_match_chars=len(secret)),))
    run, events = await run_with(deps, chain, seed_message())
    deltas = [e.text for e in events if isinstance(e, ev.TextDelta)]
    assert len(deltas) > 1 and all(secret not in d for d in deltas)
    redacted = raw.replace(secret, "[redacted]")
    assert "".join(deltas) == redacted
    (var_set,) = [e for e in events if isinstance(e, ev.VarSet) and e.var == "answer"]
    assert var_set.value == redacted
    result = events[-1]
    assert result.value == redacted and result.variables["answer"] == redacted
    assert run.scope.variables["answer"] == raw  # the run itself keeps the model's text
    assert secret in run.scope.context.text


async def test_a_plugin_that_cannot_stream_leaves_only_the_whole_value(deps):
    raw, _ = await secret_of(deps)

    class Shout:
        def post_response(self, value):
            return value.upper() if isinstance(value, str) else value

    _, events = await run_with(deps, PluginChain((Shout(),)), seed_message())
    assert not [e for e in events if isinstance(e, ev.TextDelta)]  # no text before the rewrite
    (var_set,) = [e for e in events if isinstance(e, ev.VarSet) and e.var == "answer"]
    assert var_set.value == raw.upper() and events[-1].value == raw.upper()


async def test_a_session_statement_reports_rewritten_variables(deps):
    raw, secret = await secret_of(deps)
    chain = PluginChain((RegexRedaction([re.escape(secret)], max_match_chars=len(secret)),))
    deps = dataclasses.replace(deps, plugins=chain)
    session = ProgramRun(compile_program(program()), {}, deps, "sess")
    first, second = compile_program(program(text(PROMPT), gen("answer", max_tokens=24))).body
    assert [type(e) for e in [e async for e in session.run_statement(first)]] == [ev.StatementDone]
    done = [e async for e in session.run_statement(second)][-1]
    assert isinstance(done, ev.StatementDone)
    assert done.variables == {"answer": raw.replace(secret, "[redacted]")}
    assert session.scope.variables["answer"] == raw
