"""Admission: waiting requests become new sequences, in rank order, under the budget.

A request is admitted when its lease is granted: the cache locks its cached
prefix and leases pages for every known token. Its first chunk runs in the
same step; the rest follow as running prefill chunks (chunked prefill). When
the head of the queue does not fit, admission stops there, so a large
request is not overtaken forever by small ones.

Members of a program group are admitted together and take the full pages they
share from the first of them in the same step (groups.py): their leases are
asked for after the leader's pages are in the tree.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from radixmesh.cache_types import PageCopy
from radixmesh.errors import ResourceExhausted
from radixmesh.step import NewSequence
from services.scheduler.core.budget import StepBudget
from services.scheduler.core.executor_state import ExecutorState
from services.scheduler.core.groups import (
    arriving_groups,
    keep_feasible_shares,
    num_common_tokens,
    order_groups,
    publish_targets,
    share_tokens,
)
from services.scheduler.core.leases import Leases
from services.scheduler.core.request import Request, RequestStatus, StepShare
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
    first = [r for r in candidates if r.step_share is None]
    # every lease of the step is asked for at once: over gRPC they share one round trip
    granted = dict(
        zip(
            (r.req_id for r in first),
            await asyncio.gather(
                *(_true() if r.lease_id is not None else leases.admit(ex, r) for r in first)
            ),
            strict=True,
        )
    )
    if len(first) < len(candidates):
        granted |= await _admit_followers(ex, leases, budget, candidates)
    new_seqs: list[NewSequence] = []
    alone = (
        not ex.running and not any(granted.values()) and not any(r.lease_id for r in ex.queue)
    )
    for req in candidates:
        ok = granted.get(req.req_id)
        if ok is None:  # a follower whose share this step could not honour: it waits
            leases.inflight.forget(req)
            continue
        if not ok:
            leases.inflight.forget(req)
            if alone:  # no other lease holds pages on this executor: it can never fit
                budget.failed.append((req, _does_not_fit(ex, req)))
            continue
        if budget.num_tokens <= 0 or budget.num_seqs <= 0:
            continue  # keeps its lease and goes first next step
        new_seqs.append(_start(ex, budget, req, leases))
        stats.admitted(req, now)
    return new_seqs


async def _admit_followers(
    ex: ExecutorState, leases: Leases, budget: StepBudget, candidates: list[Request]
) -> dict[str, bool]:
    """Leases of the step's followers, after their leaders' shared pages are in the tree.
    A follower whose share cannot be honoured is left out (it waits for a later step)."""
    followers = keep_feasible_shares(candidates, budget.num_tokens)
    targets = publish_targets(followers)
    # together, in order: over gRPC every leader's verbs share one message
    done = await asyncio.gather(*(leases.publish(ex, r, n) for r, n in targets.values()))
    published = {leader_id for leader_id, ok in zip(targets, done, strict=True) if ok}
    shares = {
        r.req_id: r.step_share
        for r in followers
        if r.step_share is not None and r.step_share.leader.req_id in published
    }
    # the leader's lease found those pages cached (the hint the share was sized by was
    # older than the tree): the follower finds them there too, as any request would
    found = [r for r in followers if r.req_id not in shares and _leader_has_them(r)]
    for req in candidates:
        if req.req_id not in shares:
            req.step_share = None
    followers = [r for r in followers if r.req_id in shares]
    granted = await asyncio.gather(
        *(leases.admit(ex, r, max_cached_tokens=shares[r.req_id].num_tokens) for r in followers),
        *(leases.admit(ex, r) for r in found),
    )
    for req, ok in zip(followers, granted, strict=False):
        if not ok:
            req.step_share = None
    return {r.req_id: ok for r, ok in zip([*followers, *found], granted, strict=True)}


def _leader_has_them(follower: Request) -> bool:
    """The follower's share is pages its leader's lease holds as a cached prefix."""
    share = follower.step_share
    if share is None:
        return False
    leader = share.leader
    return leader.lease_id is not None and leader.num_computed_tokens >= share.num_tokens


def _candidates(
    ex: ExecutorState, leases: Leases, budget: StepBudget, now: float, max_num_seqs: int
) -> list[Request]:
    """Waiting requests to admit this step, in rank order (a group's members together),
    sized by the cache hint. A request sharing uncached pages with a candidate of its
    group takes them in this step (its step_share); one sharing them with another
    request waits for them to reach the tree."""
    num_tokens = budget.num_tokens
    num_seqs = min(budget.num_seqs, max_num_seqs - len(ex.running))
    out: list[Request] = []
    out_ids: set[str] = set()
    # a step runs: a group still arriving joins the next plan whole (an idle loop waited)
    # the group passes walk the whole queue: only while a group's member waits in it
    ranked = ex.queue.ranked()
    arriving: dict[str, float] = {}
    sizes: Counter[str | None] = Counter()
    if ex.queue.num_grouped:
        if ex.num_in_flight:
            arriving = arriving_groups(ex.queue, ex.running.values(), now)
        sizes.update(r.group_id for r in ex.queue if r.group_id is not None and r.lease_id is None)
        ranked = order_groups(ranked)
    seen: set[str] = set()
    deferred: set[str] = set()
    for req in ranked:
        if num_tokens <= 0 or num_seqs <= 0:
            break
        if req.req_id in budget.preempted_req_ids:
            continue
        if req.hold_until_answered > ex.num_steps_answered:
            continue
        group = req.group_id
        if group in arriving or group in deferred:
            continue
        if group is not None and group not in seen:
            seen.add(group)
            if _cut_short(req, sizes[group], num_tokens, budget.num_tokens):
                deferred.add(group)
                continue
        req.step_share = None
        num_cached = req.match_tokens
        if req.lease_id is None and (lead := leases.inflight.leader_for(req, ex.page_size)):
            leader = lead.leader
            shared = 0
            if lead.tentative and leader.step_share is None and leader.req_id in out_ids:
                shared = share_tokens(leader, req, lead.num_shared_tokens, ex.page_size)
            if not shared:
                if not lead.tentative:  # the leader is checkpointed once its prefill is done
                    leader.followers[req.req_id] = lead.num_shared_tokens
                continue
            req.step_share = StepShare(leader, shared)
            num_cached = shared
        out.append(req)
        out_ids.add(req.req_id)
        if req.lease_id is None:
            leases.inflight.register(req, ex.page_size, num_cached, req.num_tokens, tentative=True)
        num_tokens -= max(1, req.num_tokens - num_cached)
        num_seqs -= 1
    return out


def _cut_short(first: Request, num_members: int, num_tokens: int, step_tokens: int) -> bool:
    """The first member of a group would start with a chunk short of its prompt, so of the
    pages its group shares (the others would wait for the rest of its prefill), where the
    step's admissions as a whole would hold it: the group waits for a later step, which it
    starts whole (it ranks higher then). A prompt larger than that is chunked as any."""
    need = first.num_tokens - first.match_tokens
    return first.lease_id is None and num_members > 1 and num_tokens < need <= step_tokens


def _start(ex: ExecutorState, budget: StepBudget, req: Request, leases: Leases) -> NewSequence:
    """req holds its lease: it joins the batch with its first chunk (after the copy of a
    cached partial page its lease was granted with, if any)."""
    ex.queue.remove(req.req_id)
    req.status = RequestStatus.RUNNING
    ex.running[req.req_id] = req
    page_copy = leases.take_copy(req) or _leader_copy(ex, req)
    if page_copy is not None and req.step_share is not None:
        req.num_computed_tokens += page_copy.num_tokens
        req.num_cached_tokens = (req.num_cached_tokens or 0) + page_copy.num_tokens
    num_tokens = min(req.num_admitted_tokens - req.num_computed_tokens, budget.num_tokens)
    # a leader whose tail pages the pool could not lend again runs up to its pages
    num_tokens = min(num_tokens, len(req.page_table) * ex.page_size - req.num_computed_tokens)
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
        page_copy=page_copy,
    )
    req.num_unsent_pages = 0
    if req.trace is not None:
        req.trace.on_started(num_tokens, ex.next_step_id)
    req.num_computed_tokens += num_tokens
    req.on_executor = True
    budget.take(num_tokens)
    return new


def _leader_copy(ex: ExecutorState, req: Request) -> PageCopy | None:
    """A group member that takes its leader's whole pages in place (its step share) also
    copies the first slots of the leader's next page, as far as their tokens agree, the
    leader's KV reaches with this step and req needs no logits there; None when that is
    no token. The copy runs in the step that computes it (after each layer's writes), and
    the leader's page is freed only by a commit or release made after this plan is sent.
    """
    share, page_size = req.step_share, ex.page_size
    if share is None or req.num_computed_tokens != share.num_tokens:
        return None
    leader, index = share.leader, share.num_tokens // page_size
    if ex.running.get(leader.req_id) is not leader or index >= len(leader.page_table):
        return None
    tokens = req.all_token_ids
    limit = min(
        num_common_tokens(leader.all_token_ids, tokens),
        leader.num_computed_tokens,  # what its steps up to this one compute
        len(tokens) - 1,  # the last token's logits are req's own
        share.num_tokens + page_size - 1,
    )
    start = req.sampling.prompt_logprobs_start
    if start is not None:
        limit = min(limit, start - 1)
    if limit <= share.num_tokens or index >= len(req.page_table):
        return None
    return PageCopy(leader.page_table[index], req.page_table[index], limit - share.num_tokens)


async def _true() -> bool:
    return True


def _does_not_fit(ex: ExecutorState, req: Request) -> ResourceExhausted:
    return ResourceExhausted(
        f"request {req.req_id} needs KV for {req.num_tokens} tokens; executor "
        f"{ex.executor_id} has {ex.info.num_pages} pages of {ex.page_size} tokens"
    )
