"""Paged attention for decode: one query token per sequence, over its pages.

Layout contract: q is [num_seqs, num_heads, head_dim]; k_cache, v_cache,
page_table and seq_lens as in `paged_attention` (seq_lens includes the token
being decoded, whose KV is already stored).
"""

from __future__ import annotations

import torch

from kernels.paged_attention import paged_attention_ref


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    cu_seqlens_q = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return paged_attention_ref(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens, scale)
