"""The runtime over the in-process engine: a program's outputs equal the same steps done
by hand with plain requests on the same tokens (greedy), forks equal their branches run
separately, the context is held between statements, and every hold ends with the run."""

from __future__ import annotations

import contextlib

import pytest

from gateway.programs.core import events as ev
from gateway.programs.core.context import start_tokens
from gateway.programs.core.runtime import ProgramRun
from radixmesh.sampling import SamplingParams
from tests.unit.programs.builders import (
    begin,
    compile_program,
    copies,
    end,
    fork,
    gen,
    program,
    ret,
    template,
    text,
    when,
)

SYSTEM = "You route support requests."


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0)


async def run(deps, message, inputs=None, run_id="p") -> tuple[list, ev.ProgramResult]:
    events = [e async for e in ProgramRun(compile_program(message), inputs or {}, deps, run_id).events()]
    assert isinstance(events[-1], ev.ProgramResult)
    return events, events[-1]


def strip_eos(ids: list[int], tokenizer) -> list[int]:
    return ids[:-1] if ids and ids[-1] in tokenizer.eos_token_ids else ids


def usage_of(result: ev.ProgramResult, statement: str) -> ev.Usage:
    return next(u.usage for u in result.usage if u.statement == statement)


async def test_two_gens_equal_plain_requests_on_the_same_tokens_and_the_second_is_cached(
    deps, engine, tokenizer
):
    message = program(
        text(SYSTEM, "system"),
        template("{query}", "user"),
        begin("assistant"),
        gen("a"),
        end("assistant"),
        text("Say more.", "user"),
        begin("assistant"),
        gen("b"),
        ret(template="{a}|{b}"),
    )
    events, result = await run(deps, message, {"query": "where is my order"})

    prompt_a = start_tokens(tokenizer) + tokenizer.encode_text(
        f"<|system|>\n{SYSTEM}<|eos|>\n<|user|>\nwhere is my order<|eos|>\n<|assistant|>\n"
    )
    a = await engine.complete(prompt_a, greedy(6))
    prompt_b = (
        prompt_a
        + strip_eos(a.token_ids, tokenizer)
        + tokenizer.encode_text("<|eos|>\n<|user|>\nSay more.<|eos|>\n<|assistant|>\n")
    )
    b = await engine.complete(prompt_b, greedy(6))

    a_text = tokenizer.decode(a.token_ids)
    b_text = tokenizer.decode(b.token_ids)
    assert result.variables["a"] == a_text
    assert result.variables["b"] == b_text
    assert result.value == f"{a_text}|{b_text}"
    deltas = "".join(e.text for e in events if isinstance(e, ev.TextDelta) and e.var == "a")
    assert deltas == a_text
    assert usage_of(result, "body[3].gen").prompt_tokens == len(prompt_a)
    second = usage_of(result, "body[7].gen")
    assert second.prompt_tokens == len(prompt_b)
    # the context before the second Gen was held: all but its last page came from the cache
    page = 4
    assert second.cached_tokens >= (len(prompt_a) + len(a.token_ids) - 1) // page * page - page


async def test_fork_branches_equal_the_branches_run_separately(deps, engine, tokenizer):
    branch = [template("Option {i}:"), gen("idea", max_tokens=5)]
    message = program(text("Ideas for a name."), copies(3, branch, index_var="i"), ret(var="idea"))
    _, result = await run(deps, message)

    context = start_tokens(tokenizer) + tokenizer.encode_text("Ideas for a name.")
    expected = []
    for i in range(3):
        done = await engine.complete(context + tokenizer.encode_text(f"Option {i}:"), greedy(5))
        expected.append(tokenizer.decode(done.token_ids))
    assert result.value == expected
    assert result.variables["idea"] == expected
    # the branches ran on the parent's tokens: their prompts share them
    branch_requests = [r for r in deps.backend.requests if r.hold_id.startswith("p/body[1].fork/")]
    assert len({r.hold_id for r in branch_requests}) == 3
    assert all(r.prompt_token_ids[: len(context)] == tuple(context) for r in branch_requests)


async def test_fixed_branches_join_every_variable_as_a_list(deps):
    message = program(
        text("Hello."),
        fork([text(" A"), gen("x", max_tokens=2)], [text(" B"), gen("y", max_tokens=2)]),
        ret(var="x"),
    )
    _, result = await run(deps, message)
    assert len(result.value) == 2 and result.value[1] == ""
    assert result.variables["y"][0] == "" and isinstance(result.variables["y"][1], str)


@pytest.mark.parametrize("query, taken", [("请检索退款政策", True), ("hello there", False)])
async def test_if_takes_the_branch_its_condition_names_and_equals_plain_requests(
    deps, engine, tokenizer, query, taken
):
    message = program(
        template("{query}", "user"),
        when(
            "contains",
            "query",
            "检索",
            then=[text("Retrieve.", "system"), begin("assistant"), gen("answer")],
            otherwise=[text("Chat.", "system"), begin("assistant"), gen("answer")],
        ),
        ret(var="answer"),
    )
    events, result = await run(deps, message, {"query": query})

    assert [e.then for e in events if isinstance(e, ev.BranchTaken)] == [taken]
    system = "Retrieve." if taken else "Chat."
    prompt = start_tokens(tokenizer) + tokenizer.encode_text(
        f"<|user|>\n{query}<|eos|>\n<|system|>\n{system}<|eos|>\n<|assistant|>\n"
    )
    done = await engine.complete(prompt, greedy(6))
    assert result.value == tokenizer.decode(done.token_ids)


async def test_every_hold_is_released_when_the_program_ends(deps, engine):
    message = program(text("Hello."), gen("a"), copies(2, [gen("b", max_tokens=3)]), gen("c"))
    await run(deps, message)
    assert set(deps.backend.released) == {r.hold_id for r in deps.backend.requests if r.hold_id}
    assert sum(s.num_locked_pages for s in engine.cache_stats()) == 0


async def test_a_client_that_goes_away_mid_gen_releases_the_programs_holds(deps, engine):
    message = program(text("Hello."), gen("a", max_tokens=3), gen("b", max_tokens=200, ignore_eos=True))
    events = ProgramRun(compile_program(message), {}, deps, "gone").events()
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, ev.TextDelta) and event.var == "b":
                break  # the client disconnects while b is generating
    assert deps.backend.released == ["gone/ctx"]
    assert sum(s.num_locked_pages for s in engine.cache_stats()) == 0
    assert sum(s.num_leases for s in engine.cache_stats()) == 0
