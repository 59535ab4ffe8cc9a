"""Paged attention for decode: one query token per sequence, over its pages.

Layout contract: q is [num_seqs, num_heads, head_dim]; k_cache, v_cache,
page_table and seq_lens as in `paged_attention` (seq_lens includes the token
being decoded, whose KV is already stored).

`paged_decode_attention_triton` splits each sequence's KV along its length
into num_splits parts, in two launches:
1. one program per (sequence, KV head, split) attends all the query heads of
   that KV head (a [BLOCK_H, head_dim] tile, so each K/V page is read once per
   KV head) over its part, and writes the partial max, sum and unnormalized
   output of every head;
2. one program per (sequence, query head) merges the parts.
With one split (short contexts, or batches whose (sequence, KV head) programs
fill the device on their own) it is one launch instead: the same kernel, one
program per (sequence, KV head) over the whole context, writing the normalized
output itself, with no partials and no merge. The split count, and so the path,
depends on shapes only (the page table's capacity, the batch, the device), never
on a value on the device, so a captured graph keeps it; a graph captured with a
page table as wide as the longest context it serves picks for that context.
A sequence whose seq_len is 0 (a padding row) gets zeros. With a sliding
window the splits cover only the window, [max(0, seq_len - window), seq_len),
all of which the one query sees, so no tile needs a window mask.
"""

from __future__ import annotations

import torch

from radixmesh_kernels._triton import (
    check,
    dependent_launch,
    interpreting,
    num_multiprocessors,
    release_dependents,
    tl,
    triton,
)
from radixmesh_kernels.paged_attention import (
    LOG2E,
    attend_range,
    check_paged_kv,
    check_window,
    paged_attention_ref,
)


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    check_window("paged_decode_attention", sliding_window)
    cu_seqlens_q = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return paged_attention_ref(
        q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens, scale, sliding_window
    )


@triton.jit
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    page_table_ptr,
    seq_lens_ptr,
    part_out_ptr,
    part_m_ptr,
    part_l_ptr,
    out_ptr,
    qk_scale,
    window,
    stride_q_t,
    stride_q_h,
    stride_o_t,
    stride_o_h,
    stride_k_page,
    stride_k_slot,
    stride_k_h,
    stride_v_page,
    stride_v_slot,
    stride_v_h,
    stride_page_table,
    GROUP: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SLIDING: tl.constexpr,
    IEEE: tl.constexpr,
    DIRECT: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    # DIRECT: one split (grid axis 2 of size 1) writes the normalized output, no partials
    release_dependents(USE_PDL)
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    # the splits cover [kv_start, seq_len), each a whole number of BLOCK_N tiles;
    # trailing splits may be empty
    if SLIDING:
        kv_start = tl.maximum(seq_len - window, 0)
        split_len = tl.cdiv(tl.cdiv(seq_len - kv_start, num_splits), BLOCK_N) * BLOCK_N
        start = kv_start + split * split_len
    else:
        split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    acc, m_i, l_i = attend_split(
        q_ptr, k_cache_ptr, v_cache_ptr, page_table_ptr, seq, kv_head, seq_len, start, end,
        qk_scale, window, stride_q_t, stride_q_h, stride_k_page, stride_k_slot, stride_k_h,
        stride_v_page, stride_v_slot, stride_v_h, stride_page_table,
        GROUP, PAGE_SIZE, BLOCK_H, BLOCK_N, HEAD_DIM, BLOCK_D, IEEE,
    )  # fmt: skip
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_valid = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_h
    if DIRECT:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + seq.to(tl.int64) * stride_o_t + heads[:, None] * stride_o_h
            + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=h_valid[:, None] & d_mask[None, :],
        )  # fmt: skip
    else:
        store_partials(
            part_out_ptr, part_m_ptr, part_l_ptr, seq, kv_head, split, num_splits, acc, m_i,
            l_i, GROUP, BLOCK_H, HEAD_DIM, BLOCK_D,
        )  # fmt: skip


@triton.jit
def attend_split(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    page_table_ptr,
    row,
    kv_head,
    seq_len,
    start,
    end,
    qk_scale,
    window,
    stride_q_t,
    stride_q_h,
    stride_k_page,
    stride_k_slot,
    stride_k_h,
    stride_v_page,
    stride_v_slot,
    stride_v_h,
    stride_page_table,
    GROUP: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IEEE: tl.constexpr,
):
    """One decode row's GROUP query heads of one KV head over its positions [start, end)
    (whole BLOCK_N tiles, then the masked rest): the online softmax's unnormalized
    (acc, m, l). Shared by this module's split kernel and the batch-invariant one."""
    full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_valid = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_h
    q = tl.load(
        q_ptr + row.to(tl.int64) * stride_q_t + heads[:, None] * stride_q_h + offs_d[None, :],
        mask=h_valid[:, None] & d_mask[None, :],
        other=0.0,
    )
    q_pos = tl.full([BLOCK_H], 0, dtype=tl.int32) + seq_len - 1
    k_base = k_cache_ptr + kv_head * stride_k_h
    v_base = v_cache_ptr + kv_head * stride_v_h
    page_row = page_table_ptr + row.to(tl.int64) * stride_page_table
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc, m_i, l_i = attend_range(
        acc, m_i, l_i, q, q_pos, k_base, v_base, page_row, start, full_end, end,
        stride_k_page, stride_k_slot, stride_v_page, stride_v_slot, offs_d, d_mask,
        qk_scale, window, PAGE_SIZE, BLOCK_N, False, False, IEEE,
    )  # fmt: skip
    acc, m_i, l_i = attend_range(
        acc, m_i, l_i, q, q_pos, k_base, v_base, page_row, full_end, end, end,
        stride_k_page, stride_k_slot, stride_v_page, stride_v_slot, offs_d, d_mask,
        qk_scale, window, PAGE_SIZE, BLOCK_N, True, False, IEEE,
    )  # fmt: skip
    return acc, m_i, l_i


@triton.jit
def store_partials(
    part_out_ptr,
    part_m_ptr,
    part_l_ptr,
    row,
    kv_head,
    split,
    num_splits,
    acc,
    m_i,
    l_i,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """A split's (acc, m, l) into the partials, [rows, num_heads, num_splits] (+ [BLOCK_D]
    for acc), for the merge."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_valid = offs_h < GROUP
    heads = kv_head * GROUP + offs_h
    part = (row.to(tl.int64) * tl.num_programs(1) * GROUP + heads) * num_splits + split
    tl.store(part_m_ptr + part, m_i, mask=h_valid)
    tl.store(part_l_ptr + part, l_i, mask=h_valid)
    tl.store(
        part_out_ptr + part[:, None] * BLOCK_D + offs_d[None, :],
        acc,
        mask=h_valid[:, None] & (offs_d < HEAD_DIM)[None, :],
    )


@triton.jit
def _decode_reduce_kernel(
    part_out_ptr,
    part_m_ptr,
    part_l_ptr,
    out_ptr,
    num_splits,
    stride_o_t,
    stride_o_h,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    release_dependents(USE_PDL)
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_valid = offs_s < num_splits
    d_mask = offs_d < HEAD_DIM
    part = (seq * tl.num_programs(1) + head) * num_splits + offs_s
    m = tl.load(part_m_ptr + part, mask=s_valid, other=float("-inf"))
    l_s = tl.load(part_l_ptr + part, mask=s_valid, other=0.0)
    acc = tl.load(
        part_out_ptr + part[:, None] * BLOCK_D + offs_d[None, :],
        mask=s_valid[:, None] & d_mask[None, :],
        other=0.0,
    )
    weight = tl.math.exp2(m - tl.max(m, axis=0))
    total = tl.sum(weight * l_s, axis=0)
    out = tl.sum(weight[:, None] * acc, axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(
        out_ptr + seq * stride_o_t + head * stride_o_h + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


def _split_configs() -> list:
    # (BLOCK_N, num_warps, num_stages)
    shapes = [(64, 4, 3), (64, 4, 2), (128, 8, 2), (32, 4, 4), (128, 4, 3)]
    return [triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=st) for n, w, st in shapes]


_decode_split_tuned = triton.autotune(
    configs=_split_configs(), key=["HEAD_DIM", "GROUP", "PAGE_SIZE", "SLIDING", "IEEE", "DIRECT"]
)(_decode_split_kernel)

_MIN_TOKENS_PER_SPLIT = 256
_MAX_SPLITS = 64
SINGLE_PASS_MAX_CONTEXT = 512
"""Up to this capacity (page-table width x page size, or the sliding window) decode runs
as one launch with no split, whatever the batch; above it the split count decides (1 is
again one launch). A default from the per-program work (one KV head's 512 positions are
256 KB at head_dim 128 in bf16), not yet a measured crossover: `bench/attention_bench.py`
measures both paths per batch and context and prints the crossover it should be."""


def default_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """Enough (sequence, KV head, split) programs to fill num_sms about 4 times,
    with at least _MIN_TOKENS_PER_SPLIT positions of the longest possible sequence
    per split; 1 (the one-launch path) up to SINGLE_PASS_MAX_CONTEXT. Depends on shapes
    only, so a captured graph keeps it."""
    if max_seq_len <= SINGLE_PASS_MAX_CONTEXT:
        return 1
    wanted = triton.cdiv(4 * num_sms, max(num_seqs * num_kv_heads, 1))
    most = triton.cdiv(max_seq_len, _MIN_TOKENS_PER_SPLIT)
    return max(1, min(wanted, most, _MAX_SPLITS))


def decode_graph_widths(max_pages_per_seq: int, page_size: int) -> list[int]:
    """Page-table widths worth a decode graph each, narrowest first: the one-launch path's
    capacity (SINGLE_PASS_MAX_CONTEXT positions) when it is narrower than the table, then the
    whole table. A graph captured with `page_table[:, :width]` runs the path of that width; a
    step replays the narrowest graph whose width holds its longest sequence's pages."""
    if max_pages_per_seq < 1 or page_size < 1:
        raise ValueError(
            f"decode_graph_widths: max_pages_per_seq and page_size must be >= 1, got "
            f"{max_pages_per_seq} and {page_size}"
        )
    short = SINGLE_PASS_MAX_CONTEXT // page_size
    return [short, max_pages_per_seq] if 1 <= short < max_pages_per_seq else [max_pages_per_seq]


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """`paged_decode_attention_ref` as split-KV attention with a merge launch, or, with
    one split, as one launch.

    num_splits defaults to `default_num_splits` over the page table's capacity
    (max_pages_per_seq * page_size, at most sliding_window); no value is read
    back from the device.
    """
    check_paged_kv("paged_decode_attention", q, k_cache, v_cache, page_table)
    check_window("paged_decode_attention", sliding_window)
    num_seqs, num_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    check(
        seq_lens.shape == (num_seqs,) and seq_lens.dtype == torch.int32,
        "paged_decode_attention: seq_lens must be [num_seqs] int32",
    )
    check(
        page_table.shape[0] >= num_seqs, "paged_decode_attention: page_table has fewer rows than q"
    )
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    if num_splits is None:
        max_seq_len = page_table.shape[1] * page_size
        if sliding_window is not None:
            max_seq_len = min(max_seq_len, sliding_window)
        num_splits = default_num_splits(num_seqs, num_kv_heads, max_seq_len, num_multiprocessors(q.device))
    check(num_splits >= 1, "paged_decode_attention: num_splits must be >= 1")
    group = num_heads // num_kv_heads
    block_d = max(triton.next_power_of_2(head_dim), 16)
    direct = num_splits == 1
    if direct:  # unused by the one-launch path
        part_out = part_m = part_l = out
    else:
        part_out = torch.empty(
            (num_seqs, num_heads, num_splits, block_d), dtype=torch.float32, device=q.device
        )
        part_m = torch.empty(
            (num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device
        )
        part_l = torch.empty_like(part_m)
    args = (
        q, k_cache, v_cache, page_table, seq_lens, part_out, part_m, part_l, out,
        scale * LOG2E,
        sliding_window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        page_table.stride(0),
    )  # fmt: skip
    meta = {
        "GROUP": group,
        "PAGE_SIZE": page_size,
        "BLOCK_H": max(triton.next_power_of_2(group), 16),  # tl.dot needs >= 16 rows
        "HEAD_DIM": head_dim,
        "BLOCK_D": block_d,
        "SLIDING": sliding_window is not None,
        "IEEE": interpreting() or q.dtype == torch.float32,
        "DIRECT": direct,
    }
    grid = (num_seqs, num_kv_heads, num_splits)
    meta.update(dependent_launch(q.device))
    if interpreting():
        _decode_split_kernel[grid](*args, **meta, BLOCK_N=16)
    else:
        _decode_split_tuned[grid](*args, **meta)
    if not direct:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            part_out, part_m, part_l, out, num_splits, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d,
            **dependent_launch(q.device),
        )  # fmt: skip
    return out
