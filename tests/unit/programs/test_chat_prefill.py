"""A conversation's turns over its held context compute only their own tokens: each turn
continues the context the turn before left held, which ends inside a page; its partial
last page is kept and copied, so, counted from the run's own usage (prompt tokens minus
cached ones, per statement), the program prefills exactly its unique positions (those
decoding did not compute)."""

from __future__ import annotations

import itertools

from gateway.programs.core import events as ev
from gateway.programs.core.runtime import ProgramRun
from tests.unit.programs.builders import compile_program, gen, program, template, text
from tests.unit.programs.test_fork_prefill import unique_positions

NUM_TURNS = 4


async def test_each_turn_computes_only_what_the_turn_before_did_not(deps, backend):
    body = [text("A helpful assistant answers the user's questions in a few words.\n")]
    for turn in range(NUM_TURNS):
        body += [
            template(f"User: question number {turn} about the weather\nAssistant: "),
            gen(f"a{turn}", max_tokens=5 + turn, ignore_eos=True),
            text("\n"),
        ]
    events = [e async for e in ProgramRun(compile_program(program(*body)), {}, deps, "c").events()]
    result = events[-1]
    assert isinstance(result, ev.ProgramResult)
    prompts = [r.prompt_token_ids for r in backend.requests]
    assert len(prompts) == NUM_TURNS
    usage = [u.usage for u in result.usage if u.statement.endswith(".gen")]
    assert len(usage) == NUM_TURNS
    assert usage[0].cached_tokens == 0
    for before, turn in itertools.pairwise(usage):
        # the turn before's prompt and answer are cached but the answer's last token,
        # never fed back: whole pages in place and the partial last page copied
        assert turn.cached_tokens == before.prompt_tokens + before.completion_tokens - 1
    computed = sum(u.prompt_tokens - u.cached_tokens for u in usage)
    # a prompt's positions, less the answers' tokens a later prompt carries that decoding
    # computed (all but each answer's last)
    decoded = sum(u.completion_tokens - 1 for u in usage[:-1])
    assert computed == unique_positions(prompts) - decoded
