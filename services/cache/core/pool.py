"""One executor's page pool: its allocator, its radix tree and its counters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from radixmesh.cache_types import PageCopy, PoolStats
from radixmesh.errors import ResourceExhausted
from services.cache.core.allocator import PageAllocator
from services.cache.core.eviction import EvictionPolicy
from services.cache.core.radix import RadixNode, RadixTree, Tail


@dataclass(slots=True, eq=False)
class LeaseState:
    """The core's record of a lease (the public `Lease` is a snapshot of it)."""

    lease_id: str
    pool: Pool
    holder: str
    node: RadixNode
    """The deepest locked tree node; it ends exactly at `num_cached_tokens`."""
    num_cached_tokens: int
    num_prefix_pages: int
    page_ids: list[int]
    """The page table: `num_prefix_pages` tree pages, then the lease's own pages."""
    page_copy: PageCopy | None = None
    """The copy of a tail into the first own page the lease was granted with."""
    source: Tail | None = None
    """The tail `page_copy` reads (kept while the lease lives), or None."""
    source_node: RadixNode | None = None
    """Or the node whose edge's first page `page_copy` reads (locked while the lease
    lives, so that page is never evicted before the copy ran)."""


@dataclass(slots=True, eq=False)
class Pool:
    executor_id: str
    model: str
    num_pages: int
    page_size: int
    allocator: PageAllocator
    tree: RadixTree
    leases: dict[str, LeaseState] = field(default_factory=dict)
    num_leased_pages: int = 0
    num_prefix_queries: int = 0
    num_query_tokens: int = 0
    num_prefix_hit_tokens: int = 0
    num_evicted_pages: int = 0

    @classmethod
    def create(
        cls,
        executor_id: str,
        model: str,
        num_pages: int,
        page_size: int,
        policy: EvictionPolicy,
        now: float,
    ) -> Pool:
        return cls(
            executor_id,
            model,
            num_pages,
            page_size,
            PageAllocator(num_pages),
            RadixTree(page_size, policy, now),
        )

    def same_geometry(self, model: str, num_pages: int, page_size: int) -> bool:
        return (self.model, self.num_pages, self.page_size) == (model, num_pages, page_size)

    def lookup(self, tokens: Sequence[int], copies: bool = True) -> int:
        """Read-only on the tree: the tokens of `tokens` an acquire would reuse (the
        cached whole pages and, with `copies`, the tokens after them that a cached page
        holds in its first slots); counts one prefix query in the stats."""
        match = self.tree.walk(tokens)
        num_tokens = match.num_tokens + (self.tree.num_tail_tokens(match, tokens) if copies else 0)
        self.count_query(len(tokens), num_tokens)
        return num_tokens

    def count_query(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        """Changes counters only: one prefix query."""
        self.num_prefix_queries += 1
        self.num_query_tokens += num_query_tokens
        self.num_prefix_hit_tokens += num_hit_tokens

    def check_room(self, num_pages: int, num_pages_to_lock: int = 0) -> None:
        """Read-only: raises ResourceExhausted unless `num_pages` can be taken (evicting
        if needed) after `num_pages_to_lock` evictable pages become locked."""
        tree = self.tree
        evictable = tree.num_cached_pages - tree.num_locked_pages - num_pages_to_lock
        available = self.allocator.num_free + evictable
        if num_pages > available:
            raise ResourceExhausted(
                f"pool {self.executor_id!r}: {num_pages} pages needed, only {available} free or "
                f"evictable of {self.num_pages} ({self.num_leased_pages} leased, "
                f"{tree.num_locked_pages} locked)"
            )

    def take_pages(self, num_pages: int) -> list[int]:
        """Changes state: leases `num_pages` pages, evicting unlocked leaves if the free list
        is short. The caller ran `check_room` first."""
        short = num_pages - self.allocator.num_free
        if short > 0:
            freed = self.tree.evict(short)
            self.num_evicted_pages += len(freed)
            self.allocator.free(freed)
        pages = self.allocator.allocate(num_pages)
        self.num_leased_pages += num_pages
        return pages

    def return_pages(self, page_ids: list[int]) -> None:
        """Changes state: leased pages go back to the free list."""
        self.allocator.free(page_ids)
        self.num_leased_pages -= len(page_ids)

    def stats(self) -> PoolStats:
        tree = self.tree
        return PoolStats(
            executor_id=self.executor_id,
            model=self.model,
            num_pages=self.num_pages,
            page_size=self.page_size,
            num_free_pages=self.allocator.num_free,
            num_leased_pages=self.num_leased_pages,
            num_cached_pages=tree.num_cached_pages,
            num_locked_pages=tree.num_locked_pages,
            num_leases=len(self.leases),
            num_prefix_queries=self.num_prefix_queries,
            num_prefix_hit_tokens=self.num_prefix_hit_tokens,
            num_query_tokens=self.num_query_tokens,
            num_evicted_pages=self.num_evicted_pages,
        )
