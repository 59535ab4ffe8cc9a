"""Prefix sharing among requests in flight: compute a shared prefix once, then reuse it.

The cache only learns a prefix when a lease commits. When a waiting request
shares full pages with a request that is still prefilling them (not yet in the
tree), admitting it now would compute those pages twice. So admission defers
it, the prefilling request (the leader) is checkpointed as soon as its prefill
ends (its pages committed to the tree, the request resumed at once), and the
deferred request then gets those pages as a cached prefix.

Pages are compared by a hash chain over their tokens, so a page key stands for
the whole prefix up to it.

Across executors, routing sees the same prefixes: a request whose uncached
pages are queued or being prefilled on an executor counts them as matched
there (`pending_matches`), so requests that arrive together with one system
prompt go to the executor that will hold it, instead of each executor
computing it once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from services.scheduler.core.request import Request


def page_keys(req: Request, page_size: int, num_pages: int) -> list[int]:
    """Keys of req's first num_pages full pages; key i covers tokens [0, (i + 1) * page_size).

    Tokens only ever append, so keys computed once stay valid and are kept on req.
    """
    keys = req.page_keys
    if len(keys) < num_pages:
        extend_keys(keys, req.all_token_ids, page_size, num_pages)
    return keys[:num_pages]


def extend_keys(keys: list[int], tokens: Sequence[int], page_size: int, num_pages: int) -> None:
    """Append to `keys` (a chain over tokens' first pages) until it has num_pages keys."""
    key = keys[-1] if keys else 0
    for i in range(len(keys), num_pages):
        key = hash((key, tuple(tokens[i * page_size : (i + 1) * page_size])))
        keys.append(key)


def num_prefix_pages(num_tokens: int, page_size: int) -> int:
    """Full pages a request can share: the last token is always computed (its logits)."""
    return max(0, num_tokens - 1) // page_size


class PageIndex(Protocol):
    def has_page(self, key: int) -> bool: ...


class RoutingTarget(Protocol):
    """What pending_matches reads of an executor (ExecutorState has it)."""

    @property
    def executor_id(self) -> str: ...

    @property
    def page_size(self) -> int: ...

    @property
    def queue(self) -> PageIndex: ...


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

    def computing(self, executor_id: str, key: int) -> bool:
        """Read-only: a request holding a lease on executor_id is computing page `key`."""
        return (executor_id, key) in self._leaders

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
        num_pages = num_prefix_pages(req.num_tokens, page_size)
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


def pending_matches(
    req: Request,
    candidates: Collection[RoutingTarget],
    matches: Mapping[str, int],
    inflight: InflightPrefixes,
) -> dict[str, int]:
    """Per candidate: the cached prefix `matches` says, or longer when the pages after it
    are queued there (`queue` holds their page keys) or being prefilled there. For routing
    only: the request's own match_tokens stays what the cache has."""
    out = dict(matches)
    if len(candidates) < 2:
        return out
    keys_by_size: dict[int, list[int]] = {}
    for ex in candidates:
        page_size = ex.page_size
        keys = keys_by_size.get(page_size)
        if keys is None:
            keys = keys_by_size[page_size] = []
            num_pages = num_prefix_pages(req.num_tokens, page_size)
            extend_keys(keys, req.prompt_token_ids, page_size, num_pages)
        cached = matches.get(ex.executor_id, 0)
        shared = cached // page_size
        while shared < len(keys) and (
            ex.queue.has_page(keys[shared]) or inflight.computing(ex.executor_id, keys[shared])
        ):
            shared += 1
        out[ex.executor_id] = max(cached, shared * page_size)
    return out


def weigh_pending(shared: Mapping[str, int], matches: Mapping[str, int]) -> dict[str, int]:
    """Routing matches: cached tokens once, pending ones (shared minus cached) twice.

    Computing a pending prefix again elsewhere costs that executor's queue as much as it
    saves this request's wait, so an executor computing the prefix wins unless its load
    is ahead by more than the prefix."""
    return {ex_id: 2 * n - min(n, matches.get(ex_id, 0)) for ex_id, n in shared.items()}
