"""Waiting requests of one executor, ranked by priority class, cached prefix and age.

Rank (lower is served first) = class - aging_rate * seconds waited
- prefix_weight * (fraction of the prompt already cached). prefix_weight < 1,
so the cached prefix orders requests within a class, while age lifts any
request, of any class, until it is served: nothing starves. Speculative work
(Priority.SPECULATIVE) does not age and ranks after every other waiting
request: a guess never delays real work.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from radixmesh.sampling import Priority
from services.scheduler.core.config import SchedulerConfig
from services.scheduler.core.request import Request, RequestStatus
from services.scheduler.core.sharing import num_prefix_pages, page_keys


class WaitQueue:
    """Insertion-ordered waiting requests; `ranked` sorts them on demand (per step).

    With a page_size, the queue also knows which full prompt pages its requests
    hold (`has_page`, by the page keys of sharing.page_keys), for routing.
    """

    def __init__(self, config: SchedulerConfig, page_size: int | None = None) -> None:
        self._aging_rate = config.aging_rate
        self._prefix_weight = config.prefix_weight
        self._page_size = page_size
        self._requests: dict[str, Request] = {}
        self._page_keys: Counter[int] = Counter()
        """Page key -> queued requests whose prompt has that page."""
        self._keys_of: dict[str, list[int]] = {}
        self._counts: dict[Priority, int] = dict.fromkeys(Priority, 0)
        """Queued requests per class, kept as they come and go (read on every submit)."""

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._requests

    def has_page(self, key: int) -> bool:
        """Read-only: a queued request's prompt has the full page of this key."""
        return key in self._page_keys

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._requests.values()))

    def push(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        if req.req_id not in self._requests:
            self._counts[req.priority] += 1
        self._requests[req.req_id] = req
        if self._page_size is not None and req.req_id not in self._keys_of:
            num_pages = num_prefix_pages(len(req.prompt_token_ids), self._page_size)
            keys = page_keys(req, self._page_size, num_pages)
            self._keys_of[req.req_id] = keys
            self._page_keys.update(keys)

    def remove(self, req_id: str) -> Request | None:
        keys = self._keys_of.pop(req_id, None)
        if keys is not None:
            self._page_keys.subtract(keys)
            for key in keys:
                if self._page_keys[key] <= 0:
                    self._page_keys.pop(key, None)
        req = self._requests.pop(req_id, None)
        if req is not None:
            self._counts[req.priority] -= 1
        return req

    def rank(self, req: Request, now: float) -> float:
        _, time_free, _ = self._order_key(now)(req)
        if req.priority is Priority.SPECULATIVE:
            return time_free
        return time_free - self._aging_rate * now

    def _order_key(self, now: float) -> Callable[[Request], tuple[bool, float, float]]:
        """The serving order's sort key at `now`: speculative work last, then `rank` through
        its time-free part (rank plus aging_rate * now for an aging request: every aging
        request's rank falls alike with time, and arrivals are never later than now), then
        arrival."""
        aging, weight, speculative = self._aging_rate, self._prefix_weight, Priority.SPECULATIVE

        def key(r: Request) -> tuple[bool, float, float]:
            cached = min(1.0, r.match_tokens / max(1, r.num_tokens))
            if r.priority is speculative:
                return (True, float(r.priority) - weight * cached, r.arrival_time)
            time_free = float(r.priority) + aging * min(r.arrival_time, now) - weight * cached
            return (False, time_free, r.arrival_time)

        return key

    def ranked(self, now: float) -> list[Request]:
        """Waiting requests, the one to serve first at index 0."""
        return sorted(self._requests.values(), key=self._order_key(now))

    def newest_unleased(self, priority: Priority) -> Request | None:
        """The latest arrival of a class holding no lease (the one to shed first)."""
        candidates = [
            r for r in self._requests.values() if r.priority is priority and r.lease_id is None
        ]
        return max(candidates, key=lambda r: r.arrival_time, default=None)

    def count_by_priority(self) -> dict[Priority, int]:
        return dict(self._counts)
