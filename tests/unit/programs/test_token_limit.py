"""limits.max_total_tokens counts what its name says: the prompt tokens a program's
statements prefill (those found cached cost nothing) plus the tokens they generate,
enforced while the program runs (RESOURCE_EXHAUSTED naming the statement past it)."""

from __future__ import annotations

import re

import pytest

from gateway.programs.core import events as ev
from gateway.programs.core.context import start_tokens
from gateway.programs.core.runtime import ProgramRun
from radixmesh.errors import ResourceExhausted
from radixmesh.v1 import program_pb2 as pb
from tests.unit.programs.builders import compile_program, gen, program, select, text


async def run_all(deps, message) -> tuple[ProgramRun, list]:
    run = ProgramRun(compile_program(message), {}, deps, "t")
    return run, [e async for e in run.events()]


async def test_the_count_is_prompt_tokens_prefilled_plus_generated(deps, tokenizer):
    message = program(
        text("Count me: a prompt of a few dozen tokens about parcels and invoices.\n"),
        gen("a", max_tokens=4),
        text(" Then more.\n"),
        select("pick", ["yes", "no"]),
        gen("b", max_tokens=3),
    )
    run, events = await run_all(deps, message)
    usage = events[-1].usage
    processed = sum(u.usage.prompt_tokens - u.usage.cached_tokens for u in usage)
    generated = sum(u.usage.completion_tokens for u in usage)
    assert run.num_tokens == processed + generated
    first = usage[0].usage
    assert first.cached_tokens == 0 and first.prompt_tokens > 10
    # the held context is not counted again: later statements prefill only what is new
    assert usage[2].usage.cached_tokens > 0
    assert run.num_tokens < sum(u.usage.prompt_tokens + u.usage.completion_tokens for u in usage)
    # the prompt counts, not only the generated tokens
    assert run.num_tokens > generated + first.prompt_tokens - 1


async def test_a_program_past_the_limit_fails_at_the_statement_that_passed_it(deps, tokenizer):
    prompt = "Over the limit: a fresh prompt about late parcels, wrong invoices and refunds.\n"
    num_prompt = len(start_tokens(tokenizer) + tokenizer.encode_text(prompt))
    limit = num_prompt + 2  # the prompt and two generated tokens fit; the third does not
    message = program(text(prompt), gen("a", max_tokens=8), limits=pb.Limits(max_total_tokens=limit))
    run = ProgramRun(compile_program(message), {}, deps, "over")
    seen = []
    with pytest.raises(ResourceExhausted) as failed:
        async for event in run.events():
            seen.append(event)
    expected = (
        f"body[1].gen: the program has processed {limit + 1} tokens (prompt tokens prefilled plus"
        f" generated), over limits.max_total_tokens ({limit})"
    )
    assert str(failed.value) == expected
    assert not any(isinstance(e, ev.ProgramResult) for e in seen)
    assert run.num_tokens == limit + 1


async def test_the_prefill_alone_can_pass_the_limit(deps, tokenizer):
    prompt = "A prompt longer than the whole budget of this program, on purpose.\n"
    message = program(text(prompt), gen("a", max_tokens=4), limits=pb.Limits(max_total_tokens=8))
    with pytest.raises(ResourceExhausted, match=re.escape("body[1].gen: the program has processed")):
        await run_all(deps, message)


async def test_a_program_within_the_limit_runs_to_its_end(deps, tokenizer):
    prompt = "Within the limit: yet another prompt, never seen before by this cache.\n"
    num_prompt = len(start_tokens(tokenizer) + tokenizer.encode_text(prompt))
    limit = num_prompt + 4
    message = program(text(prompt), gen("a", max_tokens=4), limits=pb.Limits(max_total_tokens=limit))
    run, events = await run_all(deps, message)
    assert isinstance(events[-1], ev.ProgramResult)
    assert run.num_tokens == limit  # exactly at the limit is allowed
