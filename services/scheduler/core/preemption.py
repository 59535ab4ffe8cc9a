"""Who gives up its pages when they run short, and when priority preempts running work."""

from __future__ import annotations

from collections.abc import Iterable

from services.scheduler.core.budget import StepBudget
from services.scheduler.core.executor_state import ExecutorState
from services.scheduler.core.leases import Leases
from services.scheduler.core.request import Request


def victim_order(req: Request) -> tuple[int, float]:
    """Sort key: the largest key is preempted first (lowest class, then latest arrival)."""
    return (int(req.priority), req.arrival_time)


def pick_victim(candidates: Iterable[Request]) -> Request | None:
    """The running request to preempt when pages run short, or None when there is none."""
    return max(candidates, key=victim_order, default=None)


def priority_victim(
    candidates: Iterable[Request], waiting: Request, gap: int | None
) -> Request | None:
    """A running request at least `gap` classes below `waiting`, lowest and latest first."""
    if gap is None:
        return None
    eligible = [r for r in candidates if int(r.priority) - int(waiting.priority) >= gap]
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
