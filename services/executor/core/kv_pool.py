"""The KV pool: per-layer key and value tensors, paged.

Each layer has k_cache and v_cache of [num_pages, page_size, num_kv_heads,
head_dim]; slot = page_id * page_size + offset. The pool only holds tensors:
which page belongs to which request is decided by the cache service. Optional
scratch pages after the usable ones absorb the writes of padding rows.
"""

from __future__ import annotations

import torch

from radixmesh.errors import ResourceExhausted


def page_bytes(
    num_layers: int, page_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes one page takes across all layers, keys and values."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * page_size * num_kv_heads * head_dim * itemsize


def num_pages_for_budget(budget_bytes: int, bytes_per_page: int) -> int:
    """Pages that fit in a budget; ResourceExhausted when not even one does."""
    num_pages = budget_bytes // bytes_per_page
    if num_pages < 1:
        raise ResourceExhausted(
            f"KV pool: {budget_bytes} bytes left for the KV cache, one page needs {bytes_per_page}"
        )
    return int(num_pages)


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        num_scratch_pages: int = 0,
    ) -> None:
        self.num_pages = num_pages
        """Pages requests may use: ids 0 .. num_pages - 1."""
        self.page_size = page_size
        self.scratch_page_ids = list(range(num_pages, num_pages + num_scratch_pages))
        """Pages after the usable ones that only padding rows write (CUDA graph batches)."""
        shape = (num_pages + num_scratch_pages, page_size, num_kv_heads, head_dim)
        self.k_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k_caches, *self.v_caches))

    def release(self) -> None:
        self.k_caches.clear()
        self.v_caches.clear()
