"""Context holds: a finished request's committed context kept locked in the prefix cache.

A request submitted with a `hold_id` that finishes normally commits its tokens
with `keep_locked`: its lease lives on as a lock on the committed pages (never
evicted), heartbeated with the scheduler's other leases. Its pages, as the cache
counts them (the partial last page it keeps included), count as used: in the
executor's KV usage and against the room of its batch (`queue_wait.batch_capacity`).
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
    """Pages the hold locks, as the cache counted them at the commit: the committed
    path's whole pages and every partial page kept on it (its own last one included)."""


class Holds:
    """Every live hold of one scheduler, by name."""

    def __init__(self, leases: Leases) -> None:
        self._leases = leases
        self._holds: dict[str, Hold] = {}
        self._num_pages: dict[str, int] = {}
        """Per executor id: the pages its holds lock (the sum of their `num_pages`)."""

    def __len__(self) -> int:
        return len(self._holds)

    def __contains__(self, hold_id: str) -> bool:
        return hold_id in self._holds

    def get(self, hold_id: str) -> Hold | None:
        return self._holds.get(hold_id)

    def num_pages(self, executor_id: str) -> int:
        """Read-only: pages locked by holds on one executor, as the cache counted each
        hold's at its commit (a prefix two holds share counts once for each)."""
        return self._num_pages.get(executor_id, 0)

    async def keep(self, req: Request, lease_id: str, num_pages: int) -> None:
        """req finished and its context is locked under `lease_id`, which holds `num_pages`
        pages: it becomes (or replaces) the hold named req.hold_id; released at once when
        the name was let go meanwhile."""
        hold_id = req.hold_id
        if hold_id is None or req.executor_id is None:
            await self._leases.release_hold(lease_id)
            return
        old = self._holds.get(hold_id)
        self._put(hold_id, Hold(lease_id, req.executor_id, num_pages))
        if old is not None:
            await self._leases.release_hold(old.lease_id)

    async def release(self, hold_id: str, running: list[Request]) -> bool:
        """End the hold named hold_id; running requests under that name will make none.
        False when no hold had that name."""
        for req in running:
            if req.hold_id == hold_id:
                req.hold_id = None
        hold = self._holds.get(hold_id)
        if hold is None:
            return False
        self._put(hold_id, None)
        await self._leases.release_hold(hold.lease_id)
        return True

    async def release_all(self) -> None:
        holds, self._holds, self._num_pages = self._holds, {}, {}
        for hold in holds.values():
            await self._leases.release_hold(hold.lease_id)

    def _put(self, hold_id: str, hold: Hold | None) -> None:
        """Changes state: the hold named hold_id is now `hold` (None: no hold by that name),
        with the per-executor page counts kept up to date."""
        old = self._holds.pop(hold_id, None)
        if old is not None:
            left = self._num_pages.pop(old.executor_id, 0) - old.num_pages
            if left > 0:
                self._num_pages[old.executor_id] = left
        if hold is not None:
            self._holds[hold_id] = hold
            self._num_pages[hold.executor_id] = (
                self._num_pages.get(hold.executor_id, 0) + hold.num_pages
            )
