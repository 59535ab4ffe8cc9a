"""Multi-step decode plans: one plan for up to k decode steps when nothing else changes.

A plan's steps cost the scheduler and the executor Python work and a stream
message each way; while the batch only decodes, k steps can share one plan.
The executor runs them back to back and answers each step as it ends (so
tokens stream as before), ending a sequence early on EOS, a stop token id,
max_tokens, the context limit or its grammar's end.

A plan gets k > 1 only when the step would change nothing else: nothing
waits in the queue (so nothing is admitted; a request arriving meanwhile is
admitted by the next plan, at most k steps later), every running sequence
decodes in it (no prefill chunk, no preemption, no failure; one whose last
steps are already in flight, its results still to come, has nothing to plan
and does not count), and no row
could verify a draft (speculative decoding at this batch size, or
jump-forward on a constrained row: those plans stay one step each). A
speculating executor whose switch declines the batch says for how many more
steps (`StepResult.undrafted_steps`, up to its next probe): meanwhile its
decodes are offered no drafts and plans run several steps again, the probe's
step offered drafts in a plan of its own (draft_offers.py). Pages
for each sequence's k tokens (fewer when its max_tokens or the context limit
comes first) are leased up front, with room for the drafts a step still in
flight may keep (`draft_slacks`: the steps planned while a probe runs start
wherever its verification leaves the sequence); those a sequence does not
reach go back with its lease when it ends.

Stop strings are matched where the text is, at the edge (the gateway cuts the
text exactly and aborts the request); an abort that arrives while a plan
runs goes out at once in a plan of its own (`abort_req_ids`), and the
executor skips the sequence from its next step. The lease's end commits only
the tokens the scheduler has received (their KV is written), never the
positions the plan had reserved past them.
"""

from __future__ import annotations

import asyncio

from radixmesh.step import RunningSequence, StepPlan
from services.scheduler.core.budget import StepBudget
from services.scheduler.core.executor_state import ExecutorState
from services.scheduler.core.leases import Leases
from services.scheduler.core.request import Request


def decodes_left(req: Request, max_model_len: int) -> int:
    """Decode steps req may still run after those planned (max_tokens, context limit)."""
    expected = req.num_expected_tokens
    left = max_model_len - expected
    if (max_tokens := req.sampling.max_tokens) is not None:
        left = min(left, max_tokens - (expected - len(req.prompt_token_ids)))
    return max(0, left)


def may_run_steps(
    ex: ExecutorState, running_seqs: list[RunningSequence], num_new: int, budget: StepBudget
) -> bool:
    """Whether a plan of these running sequences (and `num_new` admissions) changes
    nothing but one decode token per sequence, so that more of its steps can follow."""
    if num_new or len(ex.queue) or not running_seqs or budget.preempted_req_ids or budget.failed:
        return False
    info = ex.info
    if len(running_seqs) != len(ex.running) and len(running_seqs) != sum(
        1 for r in ex.running.values() if r.prefilling or decodes_left(r, info.max_model_len)
    ):
        return False  # a running request waits for pages or budget
    if ex.offers_drafts_at(len(running_seqs)):
        return False  # rows could verify drafts: one step per plan
    for seq in running_seqs:
        if seq.num_scheduled_tokens != 1 or seq.num_draft_tokens:
            return False
        req = ex.running[seq.req_id]
        if req.prefilling or (info.max_forced_tokens and req.constraint is not None):
            return False
    return True


def offers_no_drafts(ex: ExecutorState, num_decodes: int) -> bool:
    """A speculating executor's switch declines the batch's next step (draft_offers.py):
    its decodes are offered no drafts, so the plan changes nothing but one token per
    sequence and may run several steps."""
    return ex.speculates_at(num_decodes) and ex.drafts.undrafted_ahead() > 0


def draft_slacks(ex: ExecutorState) -> tuple[int, int]:
    """Per [no constraint, constraint]: the tokens that steps in flight, not yet answered,
    may have added to a sequence past the position the scheduler has planned: the draft
    cap for each step in flight that was offered drafts (its verification may keep them
    all), and with jump-forward a forced run's most for each step in flight. A sequence's
    pages must cover its planned tokens plus this."""
    drafted = max(ex.info.max_draft_tokens, 0) * ex.drafts.num_offered_in_flight
    return drafted, max(drafted, ex.info.max_forced_tokens * ex.num_in_flight)


def max_steps_per_plan(ex: ExecutorState, num_decodes: int, k: int) -> int:
    """The most steps the next plan may run: k, or while the switch declines, no more than
    the steps it still declines (the step after them is offered drafts, and probes)."""
    if offers_no_drafts(ex, num_decodes):
        return min(k, ex.drafts.undrafted_ahead())
    return k


async def extend_to_steps(
    ex: ExecutorState, leases: Leases, running_seqs: list[RunningSequence], max_steps: int
) -> int:
    """Turn a planned decode step (see `may_run_steps`) into a plan of up to `max_steps`:
    lease each sequence's pages for its further tokens and advance its planned position.
    Returns the plan's num_steps (1, changing nothing, when a lease cannot grow)."""
    max_model_len = ex.info.max_model_len
    reqs = [ex.running[seq.req_id] for seq in running_seqs]
    extra = [min(max_steps - 1, decodes_left(req, max_model_len)) for req in reqs]
    num_steps = 1 + max(extra, default=0)
    if num_steps == 1:
        return 1
    slacks = draft_slacks(ex)  # a probe in flight may have kept its drafts
    grows = (
        leases.grow(ex, r, r.num_computed_tokens + n + slacks[r.constraint is not None])
        for r, n in zip(reqs, extra, strict=True)
    )
    grown = await asyncio.gather(*grows)
    if not all(grown):  # the pool is short: one step (the pages leased stay for later)
        return 1
    for seq, req, n in zip(running_seqs, reqs, extra, strict=True):
        if req.num_unsent_pages:
            num_pages = len(req.page_table)
            seq.appended_page_ids.extend(req.page_table[num_pages - req.num_unsent_pages :])
            req.num_unsent_pages = 0
        req.num_computed_tokens += n
    return num_steps


def abort_plan(ex: ExecutorState, decode_steps_per_plan: int) -> StepPlan | None:
    """While a multi-step plan has more than the next step to run: a plan that only
    aborts the sequences just dropped (aborts, deadlines), so the executor skips them
    from its next step; one such plan in flight at a time. No preemption drops
    between plans: these leases ended with at most the KV of the tokens already
    received committed (`Leases.cut`), which the steps before have written."""
    if decode_steps_per_plan == 1 or ex.num_in_flight < 2:
        return None  # the drops go with the next plan, before the step after next
    if not ex.dropped_req_ids or ex.abort_plan_step_id:
        return None
    plan = StepPlan(ex.next_step_id, abort_req_ids=ex.dropped_req_ids)
    ex.next_step_id += 1
    ex.dropped_req_ids = []
    return plan
