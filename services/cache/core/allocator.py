"""Free-page bookkeeping for one executor's KV pool."""

from __future__ import annotations


class PageAllocator:
    """A stack of free page ids; allocation and freeing are list slices, no per-page loop.

    The allocator trusts its caller (the pool) not to free a page twice; the pool's
    invariant tests check that no page is ever both free and in use.
    """

    __slots__ = ("_free", "num_pages")

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        # Reversed so that the first allocations hand out low page ids (easier to read in logs).
        self._free: list[int] = list(range(num_pages - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, num_pages: int) -> list[int]:
        """Changes state: takes `num_pages` free pages. The caller checked that enough are free."""
        if num_pages <= 0:
            return []
        free = self._free
        if num_pages > len(free):
            raise AssertionError(f"allocate({num_pages}) with only {len(free)} free pages")
        pages = free[-num_pages:]
        del free[-num_pages:]
        pages.reverse()
        return pages

    def free(self, page_ids: list[int]) -> None:
        """Changes state: returns pages to the free list."""
        self._free.extend(page_ids)

    def free_page_ids(self) -> list[int]:
        """Read-only: a copy of the free list (for tests and debugging)."""
        return list(self._free)
