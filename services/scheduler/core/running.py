"""Running sequences in a step: decodes first, then the next chunks of prefills.

A running sequence costs one token per decode, or a chunk of its prompt while
it prefills. With an executor that speculates (`ExecutorInfo.max_draft_tokens`)
and no more decodes than its `max_speculative_batch_size`, a decode may also
verify that many draft tokens: they take from the step's token budget what
the step's decodes and prefills (and waiting prompts, with a slot free) leave, and
the pages cover them where the pool has them to spare. With jump-forward
(`ExecutorInfo.max_forced_tokens`) a constrained decode may verify that many at
any batch size (the tokens its grammar forces). A verifying step may
produce up to 1 + k tokens, which the scheduler learns from the result; until
then every plan's pages also cover k more tokens per step in flight. When its page table needs to grow and the pool is short, the
lowest-priority, latest-arrived running request not yet in this step gives its
pages back (possibly the sequence itself).
"""

from __future__ import annotations

import asyncio
from collections import deque

from radixmesh.errors import ResourceExhausted
from radixmesh.step import RunningSequence
from services.scheduler.core.budget import StepBudget
from services.scheduler.core.executor_state import ExecutorState
from services.scheduler.core.leases import Leases
from services.scheduler.core.multi_step import draft_slacks, offers_no_drafts
from services.scheduler.core.preemption import pick_victim, victim_order
from services.scheduler.core.request import Request


def wants_decode(req: Request, max_model_len: int) -> bool:
    """Whether another decode can still produce a token the executor will keep."""
    if req.prefilling or not req.on_executor:
        return False
    expected = req.num_expected_tokens
    max_tokens = req.sampling.max_tokens
    num_outputs = expected - len(req.prompt_token_ids)
    return expected < max_model_len and (max_tokens is None or num_outputs < max_tokens)


async def schedule_running(
    ex: ExecutorState, leases: Leases, budget: StepBudget, *, fast: bool = True
) -> list[RunningSequence]:
    """This step's share of every running sequence, decodes first (see the module's doc).

    With `fast`, a sequence whose page table already covers its step is planned without
    the page work (growing the table, making room) that only one crossing a page boundary
    or out of reserved pages needs; `fast=False` sends every sequence through it. Both
    build the same plans (the page work is a no-op on such a sequence)."""
    decodes: list[Request] = []
    prefills: list[Request] = []
    for r in ex.running.values():
        (prefills if r.prefilling else decodes).append(r)
    decodes.sort(key=victim_order)
    prefills.sort(key=victim_order)
    info = ex.info
    page_size, max_model_len = ex.page_size, info.max_model_len
    max_draft = info.max_draft_tokens
    if len(decodes) > info.max_speculative_batch_size:
        max_draft = 0  # a large batch is compute-bound: verifying drafts costs more
    elif offers_no_drafts(ex, len(decodes)):
        max_draft = 0  # the executor's switch declines this batch until its next probe
    # per [no constraint, constraint]: tokens unverified steps may add (slack: k for each
    # step in flight offered drafts, the forced run's most for each with jump-forward),
    # and the draft cap (forced tokens are always accepted: they pay at any batch size)
    slacks = draft_slacks(ex)
    caps = (max(max_draft, 0), max(max_draft, info.max_forced_tokens))
    # no request's decode wish changes while this step is planned (no result is read);
    # pages ahead for every decode that needs them, asked for at once (one round trip
    # over gRPC); one that is refused retries below, where preemption makes room
    decoding: set[str] = set()
    growing: list[tuple[Request, int]] = []
    for r in decodes:  # wants_decode, inline (the hottest loop of a decode step)
        expected, max_tokens = r.num_computed_tokens + 1, r.sampling.max_tokens
        if (
            r.on_executor
            and expected < max_model_len
            and (max_tokens is None or expected - len(r.prompt_token_ids) < max_tokens)
        ):
            decoding.add(r.req_id)
            end = r.num_computed_tokens + 1 + slacks[r.constraint is not None]
            if end > len(r.page_table) * page_size:
                growing.append((r, end))
    if growing:
        await asyncio.gather(*(leases.grow(ex, r, n) for r, n in growing))
    return await _schedule(ex, leases, budget, decodes, prefills, decoding, slacks, caps, fast)


async def _schedule(
    ex: ExecutorState,
    leases: Leases,
    budget: StepBudget,
    decodes: list[Request],
    prefills: list[Request],
    decoding: set[str],
    slacks: tuple[int, int],
    caps: tuple[int, int],
    fast: bool,
) -> list[RunningSequence]:
    page_size, step_id = ex.page_size, ex.next_step_id
    scheduled: list[RunningSequence] = []
    # a draft takes only what the step's other work leaves: a token for each later decode,
    # the running prefills' chunks, and, with a sequence slot free, the waiting prompts
    decodes_left = len(decodes)
    prefill_need = sum(r.num_admitted_tokens - r.num_computed_tokens for r in prefills)
    if len(ex.queue) and budget.num_seqs > len(ex.running):
        prefill_need = budget.num_tokens
    pending = deque(decodes)
    pending.extend(prefills)
    while pending and budget.num_tokens > 0 and budget.num_seqs > 0:
        req = pending.popleft()
        prefilling = req.req_id not in decoding and req.prefilling
        if prefilling:
            num_tokens = min(req.num_admitted_tokens - req.num_computed_tokens, budget.num_tokens)
            needed, cap = num_tokens, 0
        else:
            decodes_left -= 1
            if req.req_id not in decoding:
                continue  # nothing more to decode
            constrained = req.constraint is not None
            num_tokens, cap = 1, caps[constrained]
            needed = 1 + slacks[constrained]
        covered = req.num_computed_tokens + needed <= len(req.page_table) * page_size
        if not (fast and covered) and not await _make_room(
            ex, leases, budget, req, pending, needed
        ):
            continue
        num_draft = 0
        if cap:
            left = budget.num_tokens - num_tokens - decodes_left - prefill_need
            num_draft = max(0, min(cap, left))
            if num_draft > 0 and not await leases.grow(
                ex, req, req.num_computed_tokens + needed + num_draft
            ):
                num_draft = 0  # no spare pages: decode without a draft
        appended = req.page_table[len(req.page_table) - req.num_unsent_pages :]
        req.num_unsent_pages = 0
        if req.trace is not None:
            req.trace.on_scheduled(num_tokens, prefilling, step_id)
        scheduled.append(RunningSequence(req.req_id, num_tokens, appended, num_draft))
        req.num_computed_tokens += num_tokens
        budget.take(num_tokens + num_draft)
    return scheduled


async def _make_room(
    ex: ExecutorState,
    leases: Leases,
    budget: StepBudget,
    req: Request,
    pending: deque[Request],
    num_tokens: int,
) -> bool:
    """Grow req's pages for this step, preempting others; False when req itself yields."""
    while not await leases.grow(ex, req, req.num_computed_tokens + num_tokens):
        waiting_lease = next((r for r in ex.queue if r.lease_id is not None), None)
        if waiting_lease is not None:  # admitted ahead but not started: it gives back first
            await leases.drop(waiting_lease)
            continue
        victim = pick_victim([*pending, req])
        assert victim is not None
        if victim is req:
            if len(ex.running) == 1:
                budget.failed.append((req, _too_long(ex, req, num_tokens)))
            else:
                await leases.preempt(ex, req)
                budget.preempted_req_ids.add(req.req_id)
            return False
        pending.remove(victim)
        await leases.preempt(ex, victim)
        budget.preempted_req_ids.add(victim.req_id)
    return True


def _too_long(ex: ExecutorState, req: Request, num_tokens: int) -> ResourceExhausted:
    return ResourceExhausted(
        f"request {req.req_id} needs KV for {req.num_computed_tokens + num_tokens} tokens; "
        f"executor {ex.executor_id} has {ex.info.num_pages} pages of {ex.page_size}"
    )
