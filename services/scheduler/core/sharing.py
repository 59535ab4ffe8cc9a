"""Prefix sharing among requests in flight: compute a shared prefix once, then reuse it.

The cache only learns a prefix when a lease commits. When a waiting request
shares full pages with a request that is still prefilling them (not yet in the
tree), admitting it now would compute those pages twice. So admission defers
it, the prefilling request (the leader) is checkpointed as soon as its prefill
ends (its pages committed to the tree, the request resumed at once), and the
deferred request then gets those pages as a cached prefix.

Pages are compared by a hash chain over their tokens, so a page key stands for
the whole prefix up to it.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.scheduler.core.request import Request


def page_keys(req: Request, page_size: int, num_pages: int) -> list[int]:
    """Keys of req's first num_pages full pages; key i covers tokens [0, (i + 1) * page_size).

    Tokens only ever append, so keys computed once stay valid and are kept on req.
    """
    keys = req.page_keys
    if len(keys) < num_pages:
        tokens = req.all_token_ids
        key = keys[-1] if keys else 0
        for i in range(len(keys), num_pages):
            key = hash((key, tuple(tokens[i * page_size : (i + 1) * page_size])))
            keys.append(key)
    return keys[:num_pages]


@dataclass(frozen=True, slots=True)
class Lead:
    leader: Request
    num_shared_tokens: int
    """Tokens of the follower's prefix, from its start, that the leader puts in the tree."""
    tentative: bool
    """The leader is a candidate of this step whose lease is not granted yet."""


class InflightPrefixes:
    """Full prompt pages being computed under a lease, not yet in the cache's tree."""

    def __init__(self, min_shared_pages: int = 1) -> None:
        self._min_shared_pages = min_shared_pages
        self._leaders: dict[tuple[str, int], tuple[Request, bool]] = {}
        """(executor_id, page key) -> (the request computing that page, tentative)."""

    def register(
        self, req: Request, page_size: int, num_cached: int, num_tokens: int, tentative: bool
    ) -> None:
        """req computes tokens [num_cached, num_tokens): their full pages are in flight.

        Admission registers each candidate tentatively before leases are granted
        (num_cached from the cache hint), so candidates of one step wait on each
        other; a granted lease registers again with the real cached length.
        """
        assert req.executor_id is not None
        self._unregister(req)
        first = num_cached // page_size
        last = num_tokens // page_size
        keys = page_keys(req, page_size, last)
        req.inflight_page_keys = keys[first:]
        for key in req.inflight_page_keys:
            self._leaders.setdefault((req.executor_id, key), (req, tentative))

    def forget(self, req: Request) -> None:
        """req's pages reached the tree, or were given up; its followers are let go."""
        self._unregister(req)
        req.followers.clear()

    def _unregister(self, req: Request) -> None:
        ex_id = req.executor_id or ""
        for key in req.inflight_page_keys:
            entry = self._leaders.get((ex_id, key))
            if entry is not None and entry[0] is req:
                del self._leaders[(ex_id, key)]
        req.inflight_page_keys = []

    def leader_for(self, req: Request, page_size: int) -> Lead | None:
        """The request computing enough of req's uncached prefix that req should wait for it."""
        assert req.executor_id is not None
        if not self._leaders:
            return None
        num_pages = (req.num_tokens - 1) // page_size
        first = req.match_tokens // page_size
        lead, shared = None, 0
        for key in page_keys(req, page_size, num_pages)[first:]:
            entry = self._leaders.get((req.executor_id, key))
            if entry is None or entry[0] is req:
                break
            lead, shared = entry, shared + 1
        if lead is None or shared < self._min_shared_pages:
            return None
        return Lead(lead[0], (first + shared) * page_size, lead[1])
