"""After a Fork's join, the statement that continues the context does not compute the
context again, not even its last partial page: that page's tokens sit at the start of a
whole page of each branch (the branches went on writing past the context), and the cache
grants a copy of that page's agreeing slots (services/cache/core/radix.py, copy_source)."""

from __future__ import annotations

from gateway.programs.core.runtime import ProgramRun
from services.scheduler.core.groups import num_common_tokens
from tests.unit.programs.builders import (
    compile_program,
    copies,
    gen,
    program,
    select,
    template,
    text,
)
from tests.unit.programs.test_select_one_step import record_plans

PAGE_SIZE = 4  # the engine fixture's


async def test_the_select_after_a_join_finds_the_whole_context_cached(engine, deps, backend):
    plans = record_plans(engine)
    message = program(
        text("Solve the problem step by step, thinking of several approaches first.\n"),
        text("Problem: the train leaves at nine and the bus at ten; which is first?\n"),
        copies(3, [template("Thought {i}: "), gen("thought", max_tokens=6)], index_var="i"),
        template("Thoughts: {thought}\nThe best is number "),
        select("best", ["0", "1", "2"]),
    )
    async for _ in ProgramRun(compile_program(message), {}, deps, "j").events():
        pass
    branches = [r for r in backend.requests if r.group_id.startswith("j/fork/")]
    choices = {r.req_id: r for r in backend.requests if r.group_id.startswith("j/select/")}
    context = min(
        num_common_tokens(list(c.prompt_token_ids), list(b.prompt_token_ids))
        for c in choices.values()
        for b in branches
    )
    # the context ends inside a page, which every branch wrote on past it
    assert context % PAGE_SIZE and all(len(b.prompt_token_ids) > context + 1 for b in branches)
    started = [s for p in plans for s in p.new_seqs if s.req_id in choices]
    assert len(started) == len(choices)
    first = min(started, key=lambda s: s.num_computed_tokens)
    # whole pages in place and the context's last partial page copied from a branch's page
    assert first.num_computed_tokens >= context
    assert first.page_copy is not None and first.page_copy.num_tokens >= context % PAGE_SIZE
