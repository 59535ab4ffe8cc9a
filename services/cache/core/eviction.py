"""Eviction policies: which unlocked leaf of the radix tree goes first.

A policy only orders candidates. The tree tells it when a node becomes (or stays, with
a new access time) an evictable leaf, and asks it for victims; the tree re-checks each
candidate, so a policy may keep stale entries and skip them lazily.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.cache.core.radix import RadixNode


class EvictionPolicy(ABC):
    """A min-heap of evictable leaves keyed by `priority(node)` (lowest goes first)."""

    def __init__(self) -> None:
        self._heap: list[tuple[Any, int, RadixNode]] = []
        self._seq = itertools.count()

    @abstractmethod
    def priority(self, node: RadixNode) -> Any:
        """Read-only: the node's eviction order key; lower is evicted earlier."""

    def push(self, node: RadixNode) -> None:
        """Changes state: `node` is an evictable leaf now (again, or with a new priority)."""
        heapq.heappush(self._heap, (self.priority(node), next(self._seq), node))

    def pop_victim(self, is_evictable: Callable[[RadixNode], bool]) -> RadixNode | None:
        """Changes state: removes and returns the next victim, skipping stale entries."""
        heap = self._heap
        while heap:
            key, _, node = heapq.heappop(heap)
            if is_evictable(node) and key == self.priority(node):
                return node
        return None

    def compact(self, is_evictable: Callable[[RadixNode], bool]) -> None:
        """Changes state: drops stale entries (the tree calls it when the heap grows large)."""
        self._heap = [e for e in self._heap if is_evictable(e[2]) and e[0] == self.priority(e[2])]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)


class LRUPolicy(EvictionPolicy):
    """Least recently used first: the leaf with the oldest last access goes."""

    def priority(self, node: RadixNode) -> float:
        return node.last_access


EVICTION_POLICIES: dict[str, Callable[[], EvictionPolicy]] = {"lru": LRUPolicy}
"""Registry of policies by config name; a priority-aware policy plugs in here."""
