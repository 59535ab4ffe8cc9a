"""Plain results of the cache verbs, shared by the cache core and its clients.

The cache core returns them; `services.cache.client.CacheClient` rebuilds them
from the wire, so callers see the same types in-process and over gRPC.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PageCopy:
    """Copy the KV of slots [0, num_tokens) of page `src_page_id` into the same slots of
    page `dst_page_id` (all layers, keys and values)."""

    src_page_id: int
    dst_page_id: int
    num_tokens: int


@dataclass(slots=True)
class Lease:
    """Pages held for one sequence on one pool (result of `acquire`; a snapshot)."""

    lease_id: str
    executor_id: str
    page_ids: list[int]
    """The page table: the locked cached prefix's pages first, then the leased new pages."""
    num_cached_tokens: int
    """Length of the locked cached prefix (a multiple of page_size); its KV is in the pages."""
    page_copy: PageCopy | None = None
    """The prefix continues into a cached partial page: copy its first num_tokens slots
    into the lease's first new page (`dst_page_id`) and those tokens are computed too.
    The source stays allocated until the lease ends; the copy must run before any step
    the holder sends after it ends the lease. None: nothing to copy."""

    @property
    def num_reused_tokens(self) -> int:
        """Tokens whose KV the holder need not compute: the prefix and the copied ones."""
        return self.num_cached_tokens + (self.page_copy.num_tokens if self.page_copy else 0)


@dataclass(slots=True)
class CommitResult:
    """What a commit did. Over gRPC `num_cached_tokens` and `num_locked_pages` travel;
    the other page counts are the core's own detail and read 0 in a result from
    `CacheClient`."""

    num_cached_tokens: int
    """Tokens of the committed sequence now cached in the tree (its full pages)."""
    num_new_pages: int = 0
    """Lease pages that became part of the tree."""
    num_deduplicated_pages: int = 0
    """Lease pages freed because another commit had inserted the same tokens meanwhile."""
    num_freed_pages: int = 0
    """Lease pages returned to the free list (duplicates, the partial tail, unused pages)."""
    num_locked_pages: int = 0
    """With keep_locked: the pages the kept lock holds, every page of the committed path
    (its whole pages and each partial page kept on it, such as this sequence's own last
    one). 0 without keep_locked."""


MAX_CONTINUATION_TOKENS = 4096
"""Most tokens one `continuation` lookup returns."""


@dataclass(slots=True)
class Continuation:
    """The cached tokens that follow a prefix (result of `continuation`; read-only)."""

    executor_id: str
    """The pool whose tree matched longest ("" when none matched)."""
    num_matched_tokens: int
    """Leading tokens of the request found in that tree (any count, not only whole pages)."""
    token_ids: list[int]
    """The tokens cached after them, along the most recently used branch."""


@dataclass(slots=True)
class PoolStats:
    """Page and prefix counters of one pool (read-only snapshot)."""

    executor_id: str
    model: str
    num_pages: int
    page_size: int
    num_free_pages: int
    num_leased_pages: int
    """Pages held by leases and not (yet) in the tree."""
    num_cached_pages: int
    """Pages in the tree, locked or not."""
    num_locked_pages: int
    """Cached pages locked by at least one lease."""
    num_leases: int
    num_prefix_queries: int
    """Prefix lookups: every `match` on this pool and every `acquire`."""
    num_prefix_hit_tokens: int
    num_query_tokens: int
    num_evicted_pages: int
