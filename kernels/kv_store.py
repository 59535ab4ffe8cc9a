"""KV store: writes the new tokens' keys and values into their pages.

Layout contract: k, v are [num_tokens, num_kv_heads, head_dim]; k_cache, v_cache
are [num_pages, page_size, num_kv_heads, head_dim]; slot_mapping is [num_tokens]
int64 with slot = page_id * page_size + offset_in_page.
"""

from __future__ import annotations

import torch


def kv_store_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = k.to(k_cache.dtype)
    v_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = v.to(v_cache.dtype)
