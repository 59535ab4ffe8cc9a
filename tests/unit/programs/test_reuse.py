"""Reuse across requests: a later program that needs a tool result an earlier one computed
gets it from the result cache, and the KV of the text that result produced from the radix
tree (its Gen's prompt starts as a cache hit through the tool's text)."""

from __future__ import annotations

import json

from gateway.programs.core import events as ev
from gateway.programs.core.runtime import ProgramRun
from radixmesh.v1 import program_pb2 as pb
from tests.unit.programs.builders import call, compile_program, gen, program, template, text

PAGE_SIZE = 4  # the engine fixture's


def answer(question: str, name: str) -> pb.Program:
    return program(
        text("You answer support questions from the documents.\n"),
        call("retrieve", "docs", args={"query": "{topic}"}, json_args={"k": 2}),
        template("Documents: {docs}\n"),
        text(question),
        gen("answer", max_tokens=3),
        name=name,
    )


async def run(deps, message: pb.Program, run_id: str) -> list[ev.Event]:
    inputs = {"topic": "refund policy"}
    events = [e async for e in ProgramRun(compile_program(message), inputs, deps, run_id).events()]
    assert isinstance(events[-1], ev.ProgramResult)
    return events


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


async def test_a_later_program_reuses_the_tool_result_and_the_kv_of_its_text(deps, backend, tokenizer):
    first = await run(deps, answer("How long does a refund take?\n", "refund-time"), "first")
    second = await run(deps, answer("Can I get a refund in cash?\n", "refund-cash"), "second")
    assert [e.cached for e in first if isinstance(e, ev.ToolFinished)] == [False]
    assert [e.cached for e in second if isinstance(e, ev.ToolFinished)] == [True]
    assert first[-1].variables["docs"] == second[-1].variables["docs"]
    first_gen, second_gen = [r for r in backend.requests if r.sampling.max_tokens == 3]
    shared = common_prefix(first_gen.prompt_token_ids, second_gen.prompt_token_ids)
    docs_text = json.dumps(first[-1].variables["docs"], ensure_ascii=False)
    assert shared > len(tokenizer.encode_text(docs_text))  # the tool's text is in the shared part
    (cold,) = [u.usage for u in first[-1].usage if u.statement.endswith(".gen")]
    (warm,) = [u.usage for u in second[-1].usage if u.statement.endswith(".gen")]
    assert warm.cached_tokens >= shared // PAGE_SIZE * PAGE_SIZE
    assert cold.cached_tokens < shared // PAGE_SIZE * PAGE_SIZE  # the first one prefilled it
