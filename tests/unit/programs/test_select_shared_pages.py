"""A Select whose choices share pages past the held context: one forward, the shared
pages computed once, and every choice's scores equal to the scores of that choice run
alone (services/scheduler/core/groups.py)."""

from __future__ import annotations

import math

from gateway.programs.core import events as ev
from gateway.programs.core.runtime import ProgramRun
from radixmesh.sampling import SamplingParams
from tests.unit.programs.builders import compile_program, gen, program, select, text
from tests.unit.programs.test_select_one_step import (
    PAGE_SIZE,
    computed_in_plan_by_another,
    record_plans,
)

CHOICES = [
    "refund the whole order and close the ticket",
    "refund the whole order but keep the ticket open",
    "chat",
]


def unique_positions(seqs) -> set[tuple[int, ...]]:
    """Each computed position as the tokens up to and including it: two sequences that
    compute the same prefix's position count once."""
    return {
        tuple(s.token_ids[: p + 1])
        for s in seqs
        for p in range(s.num_computed_tokens, s.num_computed_tokens + s.num_scheduled_tokens)
    }


def full_pages(seqs) -> dict[tuple[int, ...], int]:
    """Each whole page a sequence computes (as the tokens up to its end), and by how many."""
    counts: dict[tuple[int, ...], int] = {}
    for s in seqs:
        end = s.num_computed_tokens + s.num_scheduled_tokens
        first = -(-s.num_computed_tokens // PAGE_SIZE)
        for k in range(first, end // PAGE_SIZE):
            key = tuple(s.token_ids[: (k + 1) * PAGE_SIZE])
            counts[key] = counts.get(key, 0) + 1
    return counts


async def run_select(engine, backend, deps):
    plans = record_plans(engine)
    message = program(
        text("Route this request, please: the parcel I ordered last week is late.\n"),
        gen("note", max_tokens=5),
        select("route", CHOICES),
    )
    events = [e async for e in ProgramRun(compile_program(message), {}, deps, "sel").events()]
    scores = next(e for e in events if isinstance(e, ev.SelectScores))
    scoring = [r for r in backend.requests if r.sampling.max_tokens == 0]
    ids = {r.req_id for r in scoring}
    started = [p for p in plans if ids & {s.req_id for s in p.new_seqs}]
    return scores, scoring, started


async def test_shared_pages_past_the_context_are_computed_once_in_the_selects_one_step(
    engine, backend, deps
):
    _, scoring, started = await run_select(engine, backend, deps)
    assert len(started) == 1  # one forward for the whole select
    seqs = [s for s in started[0].new_seqs if s.req_id in {r.req_id for r in scoring}]
    assert len(seqs) == len(CHOICES)
    computed = sum(s.num_scheduled_tokens for s in seqs)
    unique = len(unique_positions(seqs))
    # the two refund choices share more than a page past the context: the second takes
    # those pages from the first and recomputes at most the page where they part
    assert sum(computed_in_plan_by_another(started[0], s) for s in seqs) == 1
    # no whole page is computed twice; a choice recomputes at most the page where it
    # parts from another (its logits there are its own)
    assert max(full_pages(seqs).values()) == 1
    assert unique < computed <= unique + PAGE_SIZE * (len(CHOICES) - 1)
    # without the sharing each choice computes from its scoring start's page on
    alone = sum(
        len(r.prompt_token_ids) - (r.sampling.prompt_logprobs_start - 1) // PAGE_SIZE * PAGE_SIZE
        for r in scoring
    )
    assert computed <= alone - PAGE_SIZE


async def test_each_choices_scores_equal_the_scores_of_that_choice_scored_alone(
    engine, backend, deps
):
    scores, scoring, _ = await run_select(engine, backend, deps)
    for request, score in zip(scoring, scores.scores, strict=True):
        start = request.sampling.prompt_logprobs_start
        alone = await engine.complete(
            list(request.prompt_token_ids),
            SamplingParams(max_tokens=0, temperature=0.0, prompt_logprobs_start=start),
        )
        assert len(alone.prompt_logprobs) == len(request.prompt_token_ids) - start
        total = sum(entry.logprob for entry in alone.prompt_logprobs)
        assert [e.token_id for e in alone.prompt_logprobs] == list(request.prompt_token_ids[start:])
        assert math.isclose(score.logprob_sum, total, abs_tol=1e-4), (score.choice, total)
