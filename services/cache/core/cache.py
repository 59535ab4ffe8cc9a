"""CacheCore: every executor's page pool, the radix trees and the leases. No gRPC here.

Each verb says whether it changes state. A verb that raises leaves no partial state.
Not thread-safe: the service calls it from one event loop.
"""

from __future__ import annotations

import itertools
import secrets
import time
from array import array
from collections.abc import Callable, Sequence

from radixmesh.cache_types import (
    MAX_CONTINUATION_TOKENS,
    CommitResult,
    Continuation,
    Lease,
    PageCopy,
    PoolStats,
)
from radixmesh.errors import InvalidArgument, NotFound, ResourceExhausted
from services.cache.core.config import CacheConfig
from services.cache.core.continuation import continuation
from services.cache.core.eviction import EVICTION_POLICIES
from services.cache.core.pool import LeaseState, Pool
from services.cache.core.radix import CopySource, TreeMatch, pack_tokens

Clock = Callable[[], float]


def _num_newly_locked(source: CopySource | None, match: TreeMatch) -> int:
    """Pages that locking `source`'s node (the edge a copy reads) would lock beyond the
    matched prefix: none for a tail (its node is the prefix's) or an already locked node."""
    if source is None or source.node is None or source.node.lock_count:
        return 0
    if source.node is match.partial:  # split_match leaves it the pages after the match
        return source.node.num_pages - match.partial_pages
    return source.node.num_pages


def _as_tokens(tokens: Sequence[int]) -> Sequence[int]:
    """A list or an array as it is (both slice cheaply); any other sequence as a list."""
    return tokens if type(tokens) in (list, array) else list(tokens)


class CacheCore:
    """Pools, trees and leases of every executor.

    Leases expire per holder: a holder's TTL (`lease_ttl_s`) restarts with each of its
    heartbeats, acquires and extends; `expire()` releases every lease of a holder whose
    TTL ran out. Read-only verbs never touch access times, locks or pages.

    Token ids are ints in int64 (ids in [0, 2**32) are packed fastest), given as a list,
    an array (used as is) or any other sequence (copied into a list).
    """

    def __init__(self, config: CacheConfig | None = None, clock: Clock = time.monotonic) -> None:
        self.config = config or CacheConfig()
        self._clock = clock
        self._pools: dict[str, Pool] = {}
        self._leases: dict[str, LeaseState] = {}
        self._holder_leases: dict[str, set[str]] = {}
        self._holder_deadline: dict[str, float] = {}
        # A per-instance prefix: a restarted service never accepts a stale lease id.
        self._lease_prefix = f"{secrets.token_hex(4)}-"
        self._lease_seq = itertools.count(1)

    # ---- pools ----

    def register_pool(self, executor_id: str, model: str, num_pages: int, page_size: int) -> None:
        """Changes state: adds a pool. Idempotent for the same geometry; a different
        geometry (model, num_pages, page_size) resets the pool and drops its leases."""
        if not executor_id:
            raise InvalidArgument("executor_id must not be empty")
        if not model:
            raise InvalidArgument("model must not be empty")
        if not (1 <= num_pages <= self.config.max_pages_per_pool):
            raise InvalidArgument(
                f"num_pages must be in [1, {self.config.max_pages_per_pool}], got {num_pages}"
            )
        if not (1 <= page_size <= 1 << 16):
            raise InvalidArgument(f"page_size must be in [1, 65536], got {page_size}")
        pool = self._pools.get(executor_id)
        if pool is not None:
            if pool.same_geometry(model, num_pages, page_size):
                return
            self.unregister_pool(executor_id)
        policy = EVICTION_POLICIES[self.config.eviction_policy]()
        self._pools[executor_id] = Pool.create(
            executor_id, model, num_pages, page_size, policy, self._clock()
        )

    def unregister_pool(self, executor_id: str) -> int:
        """Changes state: drops a pool, its tree and every lease on it; returns how many leases."""
        pool = self._pool(executor_id)
        num_leases = len(pool.leases)
        for state in list(pool.leases.values()):
            self._end_lease(state)
        del self._pools[executor_id]
        return num_leases

    # ---- lookups ----

    def match(self, tokens: Sequence[int], model: str | None = None) -> dict[str, int]:
        """Read-only on pools and trees: tokens of `tokens` each pool (of `model`, if
        given) would reuse, as `acquire` grants them: the cached whole pages and the
        tokens of a kept partial page they continue into (`Lease.num_reused_tokens`).
        Counts one prefix query per pool looked at in the stats."""
        tokens = _as_tokens(tokens)
        return {
            executor_id: pool.lookup(tokens, self.config.keep_partial_pages)
            for executor_id, pool in self._pools.items()
            if not model or pool.model == model
        }

    def continuation(
        self, tokens: Sequence[int], model: str | None, max_tokens: int
    ) -> Continuation:
        """Read-only (touches no access time and counts no query): the cached tokens that
        follow the longest match of `tokens` in any pool (of `model`, if given), at most
        `max_tokens`, along the most recently used branch; the longest match wins, then the
        longest continuation, then the pool registered first. Empty when no pool holds a prefix of `tokens`."""
        if not 1 <= max_tokens <= MAX_CONTINUATION_TOKENS:
            raise InvalidArgument(
                f"max_tokens must be in [1, {MAX_CONTINUATION_TOKENS}], got {max_tokens}"
            )
        tokens = _as_tokens(tokens)
        best = Continuation("", 0, [])
        for executor_id, pool in self._pools.items():
            if model and pool.model != model:
                continue
            found = continuation(pool.tree, tokens, max_tokens)
            if (found.num_matched_tokens, len(found.token_ids)) > (
                best.num_matched_tokens, len(best.token_ids)
            ):
                best = Continuation(executor_id, found.num_matched_tokens, found.token_ids)
        return best

    def stats(self, executor_id: str | None = None) -> list[PoolStats]:
        """Read-only: counters of one pool, or of every pool when `executor_id` is empty."""
        if executor_id:
            return [self._pool(executor_id).stats()]
        return [pool.stats() for pool in self._pools.values()]

    def lease(self, lease_id: str) -> Lease:
        """Read-only: a snapshot of a live lease."""
        return self._snapshot(self._lease(lease_id))

    # ---- leases ----

    def acquire(
        self, executor_id: str, tokens: Sequence[int], num_tokens: int, holder: str
    ) -> Lease:
        """Changes state: locks the longest cached prefix of `tokens` and leases pages so
        the lease covers `num_tokens` tokens, evicting unlocked leaves when free pages run
        short. ResourceExhausted, with nothing changed, when even eviction cannot make room.

        Where a cached page's first slots agree with the next i >= 1 tokens after the
        prefix (the kept partial page (tail) of the node the prefix ends at, or the first
        page of an edge after it: `RadixTree.copy_source`), the lease carries a
        `page_copy` of those i tokens into its first new page (counted as hit tokens) and
        keeps that page (the tail, or the edge's node locked) until it ends."""
        pool = self._pool(executor_id)
        if not holder:
            raise InvalidArgument("holder must not be empty")
        tokens = _as_tokens(tokens)
        if num_tokens < max(1, len(tokens)):
            raise InvalidArgument(
                f"num_tokens must be >= max(1, len(token_ids)={len(tokens)}), got {num_tokens}"
            )
        tree = pool.tree
        match = tree.walk(tokens)
        num_prefix_pages = match.num_tokens // pool.page_size
        num_new_pages = -(-num_tokens // pool.page_size) - num_prefix_pages
        source = tree.copy_source(match, tokens) if self.config.keep_partial_pages else None
        if num_new_pages > pool.allocator.num_free:
            to_lock = tree.num_unlocked_pages(match)
            try:
                pool.check_room(num_new_pages, to_lock + _num_newly_locked(source, match))
            except ResourceExhausted:
                if source is None or source.node is None:
                    raise
                pool.check_room(num_new_pages, to_lock)  # room without locking the source
                source = None
        num_copied = source.num_tokens if source is not None else 0
        pool.count_query(len(tokens), match.num_tokens + num_copied)
        now = self._clock()
        node = tree.split_match(match)
        tree.lock(node, now)
        if source is not None and source.node is not None:
            tree.lock(source.node, now)  # before any eviction: the page stays
        page_ids = tree.path_page_ids(node) if num_prefix_pages else []
        page_ids += pool.take_pages(num_new_pages)
        lease_id = f"{self._lease_prefix}{next(self._lease_seq)}"
        state = LeaseState(
            lease_id, pool, holder, node, match.num_tokens, num_prefix_pages, page_ids
        )
        if source is not None:  # num_new_pages >= 1: num_tokens > the prefix and the copy
            state.source, state.source_node = source.tail, source.node
            if source.tail is not None:
                source.tail.num_sources += 1
            state.page_copy = PageCopy(source.page_id, page_ids[num_prefix_pages], num_copied)
        self._leases[lease_id] = pool.leases[lease_id] = state
        self._holder_leases.setdefault(holder, set()).add(lease_id)
        self._holder_deadline[holder] = now + self.config.lease_ttl_s
        return self._snapshot(state)

    def extend(self, lease_id: str, num_pages: int) -> list[int]:
        """Changes state: `num_pages` more pages for a lease (evicting if needed); renews
        its holder. ResourceExhausted, with nothing changed, when there is no room."""
        state = self._lease(lease_id)
        if num_pages < 1:
            raise InvalidArgument(f"num_pages must be >= 1, got {num_pages}")
        pool = state.pool
        if num_pages > pool.allocator.num_free:
            pool.check_room(num_pages)
        pages = pool.take_pages(num_pages)
        state.page_ids += pages
        self._renew(state.holder)
        return pages

    def commit(
        self, lease_id: str, tokens: Sequence[int], keep_locked: bool = False
    ) -> CommitResult:
        """Changes state: inserts the full pages of `tokens` (whose KV the lease's pages
        hold, in order) into the tree and keeps its partial last page as the tail of the
        node it ends at (`RadixTree.attach_tail`); frees the lease's copies of pages
        another commit inserted meanwhile, a tail the tree does not take and unused pages,
        unlocks, ends the lease.

        With `keep_locked` the lease lives on as a lock on the committed path (taken
        before the old lock is dropped): its page table is the committed full pages, it
        holds no pages of its own, and `release` (or its holder's expiry) ends it.

        `tokens` must start with the lease's cached prefix; only its last page is compared
        again (its pages are the tree's own), and only the tokens after it are inserted."""
        state = self._lease(lease_id)
        pool = state.pool
        ps = pool.page_size
        tokens = _as_tokens(tokens)
        if len(tokens) < state.num_cached_tokens:
            raise InvalidArgument(
                f"token_ids ({len(tokens)}) must cover the lease's cached prefix ({state.num_cached_tokens} tokens)"
            )
        if len(tokens) > len(state.page_ids) * ps:
            raise InvalidArgument(
                f"token_ids ({len(tokens)}) exceed the lease's {len(state.page_ids)} pages of {ps} tokens"
            )
        cached = state.num_cached_tokens
        if cached and pack_tokens(tokens[cached - ps : cached]) != state.node.tokens[-ps:]:
            # A cheap guard (one page, not the whole prefix) against a caller mix-up.
            raise InvalidArgument("token_ids do not start with the lease's cached prefix")
        num_full_pages = len(tokens) // ps
        # Packed before anything changes: a bad token id raises with no state changed.
        new_tokens = pack_tokens(tokens[cached : num_full_pages * ps])
        tail_tokens = pack_tokens(
            tokens[num_full_pages * ps :] if self.config.keep_partial_pages else ()
        )
        first = state.num_prefix_pages
        own_pages = state.page_ids[first:]
        tree = pool.tree
        inserted = tree.insert(
            state.node,
            new_tokens,
            own_pages[: num_full_pages - first],
            self._clock(),
            split_end=bool(tail_tokens),
        )
        to_free = inserted.duplicate_page_ids + own_pages[num_full_pages - first + 1 :]
        self._drop_source(state)  # before the tail is placed: it may replace its source
        if tail_tokens:
            assert inserted.end is not None
            freed = tree.attach_tail(inserted.end, tail_tokens, own_pages[num_full_pages - first])
            to_free += [] if freed is None else [freed]
        elif num_full_pages - first < len(own_pages):
            to_free.append(own_pages[num_full_pages - first])
        pool.allocator.free(to_free)
        pool.num_leased_pages -= len(own_pages)
        num_locked_pages = 0
        if keep_locked:
            num_locked_pages = self._relock(state, tokens[: num_full_pages * ps])
        else:
            self._end_lease(state)
        return CommitResult(
            num_cached_tokens=num_full_pages * ps,
            num_new_pages=inserted.num_new_pages,
            num_deduplicated_pages=len(inserted.duplicate_page_ids),
            num_freed_pages=len(to_free),
            num_locked_pages=num_locked_pages,
        )

    def release(self, lease_id: str) -> None:
        """Changes state: ends a lease without inserting; frees its own pages, drops its locks."""
        state = self._lease(lease_id)
        state.pool.return_pages(state.page_ids[state.num_prefix_pages :])
        self._drop_source(state)
        self._end_lease(state)

    def heartbeat(self, holder: str) -> int:
        """Changes state: renews every lease of `holder`; returns how many it holds."""
        if not holder:
            raise InvalidArgument("holder must not be empty")
        lease_ids = self._holder_leases.get(holder)
        if not lease_ids:
            return 0
        self._renew(holder)
        return len(lease_ids)

    def expire(self, now: float | None = None) -> list[str]:
        """Changes state: releases every lease whose holder's TTL ran out; returns their ids."""
        if now is None:
            now = self._clock()
        expired: list[str] = []
        for holder, deadline in list(self._holder_deadline.items()):
            if deadline <= now:
                for lease_id in sorted(self._holder_leases.get(holder, ())):
                    expired.append(lease_id)
                    self.release(lease_id)
        return expired

    # ---- internals ----

    def _pool(self, executor_id: str) -> Pool:
        pool = self._pools.get(executor_id)
        if pool is None:
            raise NotFound(f"executor_id {executor_id!r} has no registered pool")
        return pool

    def _lease(self, lease_id: str) -> LeaseState:
        state = self._leases.get(lease_id)
        if state is None:
            raise NotFound(
                f"lease_id {lease_id!r} is not a live lease (ended, expired or never issued)"
            )
        return state

    def _renew(self, holder: str) -> None:
        self._holder_deadline[holder] = self._clock() + self.config.lease_ttl_s

    def _relock(self, state: LeaseState, tokens: Sequence[int]) -> int:
        """Changes state: the lease now locks exactly the cached path of `tokens` (just
        committed, full pages) and holds no pages of its own. Returns the pages that lock
        holds: the path's whole pages and every partial page kept on it."""
        tree = state.pool.tree
        match = tree.walk(tokens)
        if match.num_tokens != len(tokens):
            raise AssertionError("a committed path is not in the tree")
        node = tree.split_match(match)
        tree.lock(node, self._clock())
        tree.unlock(state.node)
        state.node = node
        state.num_cached_tokens = len(tokens)
        state.num_prefix_pages = len(tokens) // state.pool.page_size
        state.page_ids = tree.path_page_ids(node)
        self._renew(state.holder)
        return tree.num_path_pages(node)

    @staticmethod
    def _drop_source(state: LeaseState) -> None:
        """Changes state: the lease no longer needs the page it copies from."""
        if state.source is not None:
            state.source.num_sources -= 1
            state.source = None
        if state.source_node is not None:
            state.pool.tree.unlock(state.source_node)
            state.source_node = None
        state.page_copy = None

    def _end_lease(self, state: LeaseState) -> None:
        """Changes state: drops the lease's locks and its records (its pages are handled)."""
        state.pool.tree.unlock(state.node)
        del self._leases[state.lease_id]
        del state.pool.leases[state.lease_id]
        holder_leases = self._holder_leases[state.holder]
        holder_leases.discard(state.lease_id)
        if not holder_leases:
            del self._holder_leases[state.holder]
            del self._holder_deadline[state.holder]

    @staticmethod
    def _snapshot(state: LeaseState) -> Lease:
        return Lease(
            state.lease_id,
            state.pool.executor_id,
            list(state.page_ids),
            state.num_cached_tokens,
            state.page_copy,
        )
