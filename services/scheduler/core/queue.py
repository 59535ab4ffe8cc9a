"""Waiting requests of one executor, ranked by priority class, cached prefix and age.

Rank (lower is served first) = class - aging_rate * seconds waited
- prefix_weight * (fraction of the prompt already cached). prefix_weight < 1,
so the cached prefix orders requests within a class, while age lifts any
request, of any class, until it is served: nothing starves. Speculative work
(Priority.SPECULATIVE) does not age and ranks after every other waiting
request: a guess never delays real work.

The queue also keeps the work its requests ask for per class (`request_work`), for the
queue-wait estimate (queue_wait.py), as it keeps their counts: both are read on every
submit, so they are running totals, not sums over the queue.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Iterator

from radixmesh.sampling import Priority
from services.scheduler.core.config import SchedulerConfig
from services.scheduler.core.request import Request, RequestStatus
from services.scheduler.core.sharing import num_prefix_pages, page_keys

_Entry = tuple[bool, float, float, int, Request]
"""A queued request's place: its `WaitQueue._key`, then a push count (unique: equal keys
keep their push order and no two entries compare their requests)."""


def request_work(req: Request, max_num_batched_tokens: int, max_model_len: int | None) -> int:
    """The steps req holds a place in its executor's batch for, by what it asks: its
    prompt's prefill chunks (the last one samples its first token), then a decode step for
    each further token of its max_tokens (within the context; without max_tokens, up to
    the context's end; with no context limit known, one token). At least 1.

    The unit is a sequence's place in one step. A waiting request waits for a place in
    the batch, and a place frees when a running sequence has run its steps: a request
    asking for 400 tokens holds it 100 times as long as one asking for 4. Output tokens
    are counted as asked, not as sampled, so that queued requests (whose end is not
    known yet) and finished ones (the measured rate) are counted alike."""
    num_prompt_tokens = len(req.prompt_token_ids)
    room = None if max_model_len is None else max(0, max_model_len - num_prompt_tokens)
    max_tokens = req.sampling.max_tokens
    if max_tokens is None:
        max_tokens = 1 if room is None else room
    elif room is not None:
        max_tokens = min(max_tokens, room)
    num_prefill_steps = -(-num_prompt_tokens // max_num_batched_tokens)
    return max(1, num_prefill_steps + max(0, max_tokens - 1))


def final_pages(req: Request, page_size: int, max_model_len: int) -> int:
    """Pages req holds once it has run to its end: its prompt plus its max_tokens (without
    max_tokens, the context's end), within the context. At least 1."""
    num_tokens = len(req.prompt_token_ids) + (req.sampling.max_tokens or max_model_len)
    return max(1, -(-min(num_tokens, max_model_len) // page_size))


class WaitQueue:
    """Waiting requests, kept in serving order as they come and go: a request's place is
    fixed by its class, arrival and cached prefix, and every aging request's rank falls
    alike with time, so the order changes only on push, remove and `rekey` (a queued
    request's cached prefix grew). `ranked` reads it in O(n) with no key computed, where
    a sort per step cost a quarter of the scheduler's loop at a thousand waiting.

    With a page_size, the queue also knows which full prompt pages its requests
    hold (`has_page`, by the page keys of sharing.page_keys), for routing.
    `max_model_len`: the executor's context limit (how far a request without max_tokens
    may run, for `request_work`).
    """

    def __init__(
        self,
        config: SchedulerConfig,
        page_size: int | None = None,
        max_model_len: int | None = None,
    ) -> None:
        self._aging_rate = config.aging_rate
        self._prefix_weight = config.prefix_weight
        self._max_num_batched_tokens = config.max_num_batched_tokens
        self._max_model_len = max_model_len
        self._page_size = page_size
        self._requests: dict[str, Request] = {}
        self._page_keys: Counter[int] = Counter()
        """Page key -> queued requests whose prompt has that page."""
        self._keys_of: dict[str, list[int]] = {}
        self._counts: dict[Priority, int] = dict.fromkeys(Priority, 0)
        """Queued requests per class, kept as they come and go (read on every submit)."""
        self._work: dict[Priority, int] = dict.fromkeys(Priority, 0)
        """`request_work` of the queued requests per class, kept like `_counts`."""
        self._pages: dict[Priority, int] = dict.fromkeys(Priority, 0)
        """`final_pages` of the queued requests per class (with a page_size and a context
        limit; else 0), kept like `_counts`."""
        self.num_grouped = 0
        """Queued requests of a named group (none: admission skips its group passes)."""
        self._entries: dict[str, _Entry] = {}
        """Per queued req_id: its place in `_order`."""
        self._order: list[_Entry] = []
        """The queued requests' entries, sorted: the serving order."""
        self._num_pushed = itertools.count()

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
            self._work[req.priority] += self.work(req)
            self._pages[req.priority] += self.pages(req)
            self.num_grouped += req.group_id is not None
        self._requests[req.req_id] = req
        self._place(req)
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
            self._work[req.priority] -= self.work(req)
            self._pages[req.priority] -= self.pages(req)
            self.num_grouped -= req.group_id is not None
            self._unplace(req_id)
        return req

    def rekey(self, req: Request) -> None:
        """Changes state: a queued request's cached prefix (match_tokens) changed; its place
        in the order follows (a request not queued: nothing)."""
        if req.req_id in self._requests:
            self._place(req)

    def _place(self, req: Request) -> None:
        self._unplace(req.req_id)
        is_speculative, time_free, arrival = self._key(req)
        entry = (is_speculative, time_free, arrival, next(self._num_pushed), req)
        self._entries[req.req_id] = entry
        bisect.insort(self._order, entry)

    def _unplace(self, req_id: str) -> None:
        entry = self._entries.pop(req_id, None)
        if entry is not None:
            del self._order[bisect.bisect_left(self._order, entry)]

    def work(self, req: Request) -> int:
        """`request_work` of req on this queue's executor, computed once (`Request.work`):
        what a push added is what its remove takes away."""
        if not req.work:
            req.work = request_work(req, self._max_num_batched_tokens, self._max_model_len)
        return req.work

    def pages(self, req: Request) -> int:
        """`final_pages` of req on this queue's executor (0 without a page_size or a
        context limit); the same at its push and its remove (prompt and max_tokens fixed)."""
        if self._page_size is None or self._max_model_len is None:
            return 0
        if not req.final_pages:
            req.final_pages = final_pages(req, self._page_size, self._max_model_len)
        return req.final_pages

    def rank(self, req: Request, now: float) -> float:
        _, time_free, _ = self._key(req)
        if req.priority is Priority.SPECULATIVE:
            return time_free
        return time_free - self._aging_rate * now

    def _key(self, r: Request) -> tuple[bool, float, float]:
        """The serving order's sort key: speculative work last, then `rank` through its
        time-free part (rank plus aging_rate * now for an aging request: every aging
        request's rank falls alike with time), then arrival. It reads only what does not
        change while a request waits but through `rekey` (the cached share is of the
        prompt: a preempted request's tokens may still arrive from a step in flight)."""
        cached = min(1.0, r.match_tokens / max(1, len(r.prompt_token_ids)))
        weighted = float(r.priority) - self._prefix_weight * cached
        if r.priority is Priority.SPECULATIVE:
            return (True, weighted, r.arrival_time)
        return (False, weighted + self._aging_rate * r.arrival_time, r.arrival_time)

    def ranked(self) -> list[Request]:
        """Waiting requests, the one to serve first at index 0 (the same order at any time:
        see `_key`)."""
        return [entry[-1] for entry in self._order]

    def head(self) -> Request | None:
        """Read-only: the waiting request to serve first (None: the queue is empty)."""
        return self._order[0][-1] if self._order else None

    def newest_unleased(self, priority: Priority) -> Request | None:
        """The latest arrival of a class holding no lease (the one to shed first)."""
        candidates = [
            r for r in self._requests.values() if r.priority is priority and r.lease_id is None
        ]
        return max(candidates, key=lambda r: r.arrival_time, default=None)

    def count_by_priority(self) -> dict[Priority, int]:
        return dict(self._counts)

    def work_by_priority(self) -> dict[Priority, int]:
        """Read-only: the `request_work` of the queued requests, per class."""
        return dict(self._work)

    def ahead_of(self, priority: Priority) -> tuple[int, int]:
        """Read-only: the requests queued in `priority` or a higher class (a new request
        of `priority` is served after them) and their work; O(classes)."""
        num_requests = work = 0
        for p in self._counts:
            if p <= priority:
                num_requests += self._counts[p]
                work += self._work[p]
        return num_requests, work

    def pages_ahead_of(self, priority: Priority) -> int:
        """Read-only: the `final_pages` of the requests `ahead_of(priority)` counts;
        O(classes)."""
        return sum(n for p, n in self._pages.items() if p <= priority)
