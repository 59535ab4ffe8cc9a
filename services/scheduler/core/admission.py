"""Admission: waiting requests become new sequences, in rank order, under the budget.

A request is admitted when its lease is granted: the cache locks its cached
prefix and leases pages for every known token. Its first chunk runs in the
same step; the rest follow as running prefill chunks (chunked prefill). When
the head of the queue does not fit, admission stops there, so a large
request is not overtaken forever by small ones.
"""

from __future__ import annotations

import asyncio

from radixmesh.errors import ResourceExhausted
from radixmesh.step import NewSequence
from services.scheduler.core.budget import StepBudget
from services.scheduler.core.executor_state import ExecutorState
from services.scheduler.core.leases import Leases
from services.scheduler.core.request import Request, RequestStatus
from services.scheduler.core.stats import SchedulerStats


async def admit_waiting(
    ex: ExecutorState,
    leases: Leases,
    budget: StepBudget,
    now: float,
    max_num_seqs: int,
    stats: SchedulerStats,
) -> list[NewSequence]:
    candidates = _candidates(ex, leases, budget, now, max_num_seqs)
    # every lease of the step is asked for at once: over gRPC they share one round trip
    granted = await asyncio.gather(
        *(_true() if r.lease_id is not None else leases.admit(ex, r) for r in candidates)
    )
    new_seqs: list[NewSequence] = []
    alone = not ex.running and not any(granted) and not any(r.lease_id for r in ex.queue)
    for req, ok in zip(candidates, granted, strict=True):
        if not ok:
            leases.inflight.forget(req)
            if alone:  # no other lease holds pages on this executor: it can never fit
                budget.failed.append((req, _does_not_fit(ex, req)))
            continue
        if budget.num_tokens <= 0 or budget.num_seqs <= 0:
            continue  # keeps its lease and goes first next step
        new_seqs.append(_start(ex, budget, req))
        stats.admitted(req, now)
    return new_seqs


def _candidates(
    ex: ExecutorState, leases: Leases, budget: StepBudget, now: float, max_num_seqs: int
) -> list[Request]:
    """Waiting requests to admit this step, in rank order, sized by the cache hint."""
    num_tokens = budget.num_tokens
    num_seqs = min(budget.num_seqs, max_num_seqs - len(ex.running))
    out = []
    for req in ex.queue.ranked(now):
        if num_tokens <= 0 or num_seqs <= 0:
            break
        if req.req_id in budget.preempted_req_ids or req.hold_until_step > ex.last_result_step:
            continue
        if req.lease_id is None and (lead := leases.inflight.leader_for(req, ex.page_size)):
            if not lead.tentative:  # the leader is checkpointed once its prefill is done
                lead.leader.followers[req.req_id] = lead.num_shared_tokens
            continue
        out.append(req)
        if req.lease_id is None:
            leases.inflight.register(
                req, ex.page_size, req.match_tokens, req.num_tokens, tentative=True
            )
        num_tokens -= max(1, req.num_tokens - req.match_tokens)
        num_seqs -= 1
    return out


def _start(ex: ExecutorState, budget: StepBudget, req: Request) -> NewSequence:
    """req holds its lease: it joins the batch with its first chunk."""
    ex.queue.remove(req.req_id)
    req.status = RequestStatus.RUNNING
    ex.running[req.req_id] = req
    num_tokens = min(req.num_admitted_tokens - req.num_computed_tokens, budget.num_tokens)
    new = NewSequence(
        req_id=req.req_id,
        token_ids=req.all_token_ids,
        num_prompt_tokens=len(req.prompt_token_ids),
        num_computed_tokens=req.num_computed_tokens,
        num_scheduled_tokens=num_tokens,
        page_ids=list(req.page_table),
        sampling=req.sampling,
        constraint=req.constraint,
        traceparent=req.trace.traceparent if req.trace is not None else "",
    )
    req.num_unsent_pages = 0
    if req.trace is not None:
        req.trace.on_started(num_tokens, ex.next_step_id)
    req.num_computed_tokens += num_tokens
    req.on_executor = True
    budget.take(num_tokens)
    return new


async def _true() -> bool:
    return True


def _does_not_fit(ex: ExecutorState, req: Request) -> ResourceExhausted:
    return ResourceExhausted(
        f"request {req.req_id} needs KV for {req.num_tokens} tokens; executor "
        f"{ex.executor_id} has {ex.info.num_pages} pages of {ex.page_size} tokens"
    )
