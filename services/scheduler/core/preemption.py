"""Who gives up its pages when they run short, and when priority preempts running work.

Speculative work (Priority.SPECULATIVE) goes first, and any waiting request of
another class preempts it (with preemption by priority on). A program group's
members (groups.py) go after every request of no group in their class, so an
unrelated request of the same or a lower class never preempts one of them (it
yields itself); between groups the latest goes first, member after member.
"""

from __future__ import annotations

from collections.abc import Iterable

from radixmesh.sampling import Priority
from services.scheduler.core.budget import StepBudget
from services.scheduler.core.executor_state import ExecutorState
from services.scheduler.core.leases import Leases
from services.scheduler.core.request import Request


def victim_order(req: Request) -> tuple[int, int, float, float]:
    """Sort key: the largest key is preempted first: the lowest class; in it requests of
    no group before groups' members; then the latest arrival (a member by its group's
    first arrival, so one group's members follow each other)."""
    grouped = req.group_id is not None
    return (
        int(req.priority),
        0 if grouped else 1,
        req.group_arrival_time if grouped else req.arrival_time,
        req.arrival_time,
    )


def pick_victim(candidates: Iterable[Request]) -> Request | None:
    """The running request to preempt when pages run short, or None when there is none."""
    return max(candidates, key=victim_order, default=None)


def priority_victim(
    candidates: Iterable[Request], waiting: Request, gap: int | None
) -> Request | None:
    """A running request at least `gap` classes below `waiting` (any speculative one for a
    waiting request that is not), lowest and latest first; None when gap is None."""
    if gap is None:
        return None
    guess = waiting.priority is not Priority.SPECULATIVE
    eligible = [
        r
        for r in candidates
        if int(r.priority) - int(waiting.priority) >= gap
        or (guess and r.priority is Priority.SPECULATIVE)
    ]
    return pick_victim(eligible)


async def preempt_for_priority(
    ex: ExecutorState,
    leases: Leases,
    budget: StepBudget,
    head: Request,
    gap: int | None,
    max_num_seqs: int,
) -> None:
    """Let `head` take the pages (or the seat) of running work `gap` classes below it.

    Once it holds a lease and a seat is free, admission takes it first.
    """
    while priority_victim(ex.running.values(), head, gap) is not None:
        if len(ex.running) < max_num_seqs and (
            head.lease_id is not None or await leases.admit(ex, head)
        ):
            return
        victim = priority_victim(ex.running.values(), head, gap)
        assert victim is not None
        await leases.preempt(ex, victim)
        budget.preempted_req_ids.add(victim.req_id)
