"""Context holds: a finished request's committed context kept locked in the prefix cache.

A request submitted with a `hold_id` that finishes normally commits its tokens
with `keep_locked`: its lease lives on as a lock on the committed pages (never
evicted; they count as used), heartbeated with the scheduler's other leases.
A later request with the same `hold_id` replaces the hold (its lock is taken
before the old one is released); `release` ends a hold, and a request still
running under that name then makes none. Names are the caller's: the
scheduler service prefixes them per stream, so closing a stream ends its holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.scheduler.core.leases import Leases
from services.scheduler.core.request import Request


@dataclass(slots=True)
class Hold:
    lease_id: str
    executor_id: str
    num_pages: int
    """Pages the hold locks (its committed full pages)."""


class Holds:
    """Every live hold of one scheduler, by name."""

    def __init__(self, leases: Leases) -> None:
        self._leases = leases
        self._holds: dict[str, Hold] = {}

    def __len__(self) -> int:
        return len(self._holds)

    def __contains__(self, hold_id: str) -> bool:
        return hold_id in self._holds

    def get(self, hold_id: str) -> Hold | None:
        return self._holds.get(hold_id)

    def num_pages(self, executor_id: str) -> int:
        """Read-only: pages locked by holds on one executor."""
        return sum(h.num_pages for h in self._holds.values() if h.executor_id == executor_id)

    async def keep(self, req: Request, lease_id: str, num_tokens: int, page_size: int) -> None:
        """req finished and its context is locked under `lease_id`: it becomes (or replaces)
        the hold named req.hold_id; released at once when the name was let go meanwhile."""
        hold_id = req.hold_id
        if hold_id is None or req.executor_id is None:
            await self._leases.release_hold(lease_id)
            return
        old = self._holds.get(hold_id)
        self._holds[hold_id] = Hold(lease_id, req.executor_id, num_tokens // page_size)
        if old is not None:
            await self._leases.release_hold(old.lease_id)

    async def release(self, hold_id: str, running: list[Request]) -> bool:
        """End the hold named hold_id; running requests under that name will make none.
        False when no hold had that name."""
        for req in running:
            if req.hold_id == hold_id:
                req.hold_id = None
        hold = self._holds.pop(hold_id, None)
        if hold is None:
            return False
        await self._leases.release_hold(hold.lease_id)
        return True

    async def release_all(self) -> None:
        holds, self._holds = self._holds, {}
        for hold in holds.values():
            await self._leases.release_hold(hold.lease_id)
