"""A Select's scoring requests are submitted together and run in one scheduler step, over
the context the statements before it hold: every choice is one new sequence of the same
step plan, its cached prefix is the held context, and it runs no further step. Choices
that share a full page past the context share it within that step: one of them computes
it, the others reference its pages in the same plan (services/scheduler/core/groups.py)."""

from __future__ import annotations

from gateway.programs.core import events as ev
from gateway.programs.core.runtime import ProgramRun
from radixmesh.step import StepPlan
from tests.unit.programs.builders import compile_program, gen, program, select, text

PAGE_SIZE = 4  # the engine fixture's


def record_plans(engine) -> list[StepPlan]:
    """Every step plan the scheduler core sends to the (in-process) executor."""
    plans: list[StepPlan] = []
    for state in engine.scheduler._executors.values():
        submit = state.port.submit

        def recording(plan: StepPlan, submit=submit) -> None:
            plans.append(plan)
            submit(plan)

        state.port.submit = recording
    return plans


def computed_in_plan_by_another(plan: StepPlan, seq) -> bool:
    """seq's cached prefix past the held context is computed in `plan` by another new
    sequence: same tokens on the same pages, from a position before it."""
    num_pages = seq.num_computed_tokens // PAGE_SIZE
    for other in plan.new_seqs:
        if (
            other.req_id != seq.req_id
            and other.num_computed_tokens < seq.num_computed_tokens
            and other.num_computed_tokens + other.num_scheduled_tokens >= seq.num_computed_tokens
            and other.page_ids[:num_pages] == seq.page_ids[:num_pages]
            and other.token_ids[: seq.num_computed_tokens] == seq.token_ids[: seq.num_computed_tokens]
        ):
            return True
    return False


async def select_steps(
    engine, backend, deps, choices: list[str], shared: bool = False
) -> tuple[list[StepPlan], set[str], int]:
    """Run gen then select; the plans that start the select's scoring requests, their ids,
    and the length of the Gen's prompt (held when the select runs). With `shared`, a
    choice may start past its scoring start where another choice of the plan computes
    the pages before."""
    plans = record_plans(engine)
    message = program(
        text("Route this request, please: the parcel I ordered last week is late.\n"),
        gen("note", max_tokens=5),
        select("route", choices),
    )
    events = [e async for e in ProgramRun(compile_program(message), {}, deps, "one").events()]
    assert isinstance(events[-1], ev.ProgramResult)
    scoring = [r for r in backend.requests if r.sampling.max_tokens == 0]
    assert len(scoring) == len(choices)  # one score-only request per choice
    ids = {r.req_id for r in scoring}
    started = [p for p in plans if ids & {s.req_id for s in p.new_seqs}]
    later = [p for p in plans if started and p.step_id > started[-1].step_id]
    assert not any(ids & {s.req_id for s in p.running_seqs} for p in later)  # one step each
    held = len(next(r for r in backend.requests if r.sampling.max_tokens == 5).prompt_token_ids)
    for plan in started:
        for seq in plan.new_seqs:
            if seq.req_id in ids:
                request = next(r for r in scoring if r.req_id == seq.req_id)
                # the cached prefix is the held context (its whole pages), and the rest of the
                # prompt (the Gen's output and the choice) runs in this one step
                assert seq.num_computed_tokens >= (held // PAGE_SIZE) * PAGE_SIZE > 0
                if not shared or seq.num_computed_tokens < request.sampling.prompt_logprobs_start:
                    assert seq.num_computed_tokens < request.sampling.prompt_logprobs_start
                else:
                    assert computed_in_plan_by_another(plan, seq)
                assert seq.num_computed_tokens + seq.num_scheduled_tokens == len(request.prompt_token_ids)
    return started, ids, held


async def test_a_selects_choices_run_in_one_step_over_the_held_context(engine, backend, deps):
    choices = ["chat", "escalate to a human", "billing", "yes"]  # no two share a first token
    started, ids, _ = await select_steps(engine, backend, deps, choices)
    assert len(started) == 1
    assert ids <= {s.req_id for s in started[0].new_seqs}


async def test_choices_sharing_a_leading_page_still_run_in_one_step(engine, backend, deps):
    choices = ["refund the order", "refund part of it", "chat", "yes"]
    started, ids, _ = await select_steps(engine, backend, deps, choices, shared=True)
    assert len(started) == 1, [sorted(s.req_id for s in p.new_seqs) for p in started]
    assert ids <= {s.req_id for s in started[0].new_seqs}
    # the two "refund" choices share a page: one of them took it from the other
    assert any(computed_in_plan_by_another(started[0], s) for s in started[0].new_seqs)
