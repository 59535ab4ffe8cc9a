"""A Fork's branches do not prefill the context again: counted from the run's own usage
(prompt tokens minus cached ones, per statement), the context's whole pages are computed
once, by one branch, in the step that starts them all; each other branch takes them in
place, copies the context's last partial page from that branch's in the same step, and
computes only its own text: the branches compute exactly their unique positions. The
select after the join finds the context's pages cached, and its choices share their
common text the same way, each computing only the last shared position (its logits score
the choice) beside its own tokens."""

from __future__ import annotations

from gateway.programs.core import events as ev
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

PAGE_SIZE = 4  # the engine fixture's
NUM_BRANCHES = 4


def unique_positions(prompts: list[tuple[int, ...]]) -> int:
    """Distinct token positions over the prompts (a trie's size)."""
    trie: dict = {}
    size = 0
    for prompt in prompts:
        node = trie
        for token in prompt:
            if token not in node:
                node[token] = {}
                size += 1
            node = node[token]
    return size


async def test_a_forks_branches_compute_the_context_once_counted_from_usage(deps, backend):
    message = program(
        text("Solve the problem step by step, thinking of several approaches first.\n"),
        text("Problem: the train leaves at nine and the bus at ten; which is first?\n"),
        copies(NUM_BRANCHES, [template("Thought {i}: "), gen("thought", max_tokens=3)], index_var="i"),
        template("Thoughts: {thought}\nThe best is number "),
        select("best", [str(i) for i in range(NUM_BRANCHES)]),
    )
    events = [e async for e in ProgramRun(compile_program(message), {}, deps, "f").events()]
    result = events[-1]
    assert isinstance(result, ev.ProgramResult)
    branches = [r for r in backend.requests if r.group_id.startswith("f/fork/")]
    choices = [r for r in backend.requests if r.group_id.startswith("f/select/")]
    assert len(branches) == NUM_BRANCHES and len(choices) == NUM_BRANCHES
    prompts = [r.prompt_token_ids for r in branches]
    common = min(num_common_tokens(list(prompts[0]), list(p)) for p in prompts[1:])
    shared = common // PAGE_SIZE * PAGE_SIZE
    assert shared >= 8 * PAGE_SIZE  # the context spans many pages

    fork_usage = [u.usage for u in result.usage if ".fork" in u.statement]
    assert len(fork_usage) == NUM_BRANCHES
    cached = sorted(u.cached_tokens for u in fork_usage)
    # one computes it; the others take its whole pages in place and copy the rest of the
    # common text from its partial page, in the same step
    assert common > shared
    assert cached[0] == 0 and cached[1:] == [common] * (NUM_BRANCHES - 1), cached
    computed = sum(u.prompt_tokens - u.cached_tokens for u in fork_usage)
    assert computed == len(prompts[0]) + sum(len(p) - common for p in prompts[1:])
    assert computed == unique_positions(prompts)

    (select_usage,) = [u.usage for u in result.usage if u.statement.endswith(".select")]
    context = num_common_tokens(list(choices[0].prompt_token_ids), list(prompts[0]))
    cached_context = context // PAGE_SIZE * PAGE_SIZE  # the branches committed its pages
    assert select_usage.cached_tokens >= NUM_BRANCHES * cached_context > 0
    select_computed = select_usage.prompt_tokens - select_usage.cached_tokens
    new_positions = unique_positions([r.prompt_token_ids for r in choices]) - cached_context
    # each choice but the one computing them takes the choices' shared whole pages and
    # copies the rest of their common text but its last position, whose logits score it
    assert select_computed - new_positions <= NUM_BRANCHES - 1
