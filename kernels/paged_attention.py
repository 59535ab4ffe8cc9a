"""Paged attention for prefill and extend: causal, over a cached prefix.

Layout contract:
- q: [num_tokens, num_heads, head_dim], the new tokens of every sequence, flattened;
- k_cache, v_cache: [num_pages, page_size, num_kv_heads, head_dim], with the new
  tokens' keys and values already stored;
- page_table: [num_seqs, max_pages_per_seq] int32 (unused entries arbitrary);
- cu_seqlens_q: [num_seqs + 1] int32, the offsets of each sequence's tokens in q;
- seq_lens: [num_seqs] int32, each sequence's total length after this step
  (cached prefix + new tokens). Query i of sequence b sits at position
  seq_lens[b] - q_len_b + i and attends to every position up to its own.

num_heads must be a multiple of num_kv_heads (grouped-query attention).
"""

from __future__ import annotations

import torch


def gather_kv(
    cache: torch.Tensor, page_row: torch.Tensor, seq_len: int
) -> torch.Tensor:
    """[seq_len, num_kv_heads, head_dim] of one sequence, read through its pages."""
    page_size = cache.shape[1]
    num_pages = (seq_len + page_size - 1) // page_size
    pages = cache[page_row[:num_pages].long()]
    return pages.reshape(-1, cache.shape[2], cache.shape[3])[:seq_len]


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    starts = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    for b, seq_len in enumerate(lens):
        q_start, q_end = starts[b], starts[b + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        k = gather_kv(k_cache, page_table[b], seq_len).float()
        v = gather_kv(v_cache, page_table[b], seq_len).float()
        k = k.repeat_interleave(group, dim=1)  # [S, H, D]
        v = v.repeat_interleave(group, dim=1)
        qb = q[q_start:q_end].float()  # [L, H, D]
        scores = torch.einsum("lhd,shd->hls", qb, k) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        mask = k_pos[None, :] > q_pos[:, None]
        scores.masked_fill_(mask[None], float("-inf"))
        probs = scores.softmax(dim=-1)
        out[q_start:q_end] = torch.einsum("hls,shd->lhd", probs, v).to(q.dtype)
    return out
