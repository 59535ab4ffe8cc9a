"""Prefill attention with the new tokens' keys and values read densely (Hopper TMA when
the device and Triton have it), the cached prefix through the pages.

Layout contract: `paged_attention`'s, plus
- k_new, v_new: [num_tokens, num_kv_heads, head_dim], the keys and values of the new
  tokens (rows as in q, each sequence's at its cu_seqlens_q offsets; the same values
  that are stored in the caches), head_dim contiguous and the heads of a row adjacent.

Query i of sequence b (position prefix_b + i) attends the prefix_b cached positions,
gathered through the page table in BLOCK_N tiles exactly as `paged_attention_triton`
does, then the new tokens j <= i of its own sequence from k_new / v_new: rows
q_start_b + j, no page lookup. With USE_TMA each new-token tile (q, k, v) is one tensor
copy through a descriptor over the [num_tokens, heads * head_dim] view (rows past the
tensor come back zero; rows of the next sequence are masked off on the diagonal tiles);
otherwise plain loads of the same rows. The loop over the off-diagonal new-token tiles
can run warp-specialized (a producer warp group loading, the others computing) where
Triton supports it on the device.

`dense_prefill_attention` runs one configuration (`DenseConfig`); which configuration,
or the paged kernel, serves a shape on a GPU is `prefill_attention.py`'s choice.
No sliding window: a windowed model keeps the paged kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixmesh_kernels._triton import check, interpreting, tl, triton
from radixmesh_kernels.paged_attention import LOG2E, attend_range, check_paged_kv, mma

try:  # triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor

    HAS_TMA_DESCRIPTORS = True
except ImportError:  # pragma: no cover - older triton
    TensorDescriptor = None
    HAS_TMA_DESCRIPTORS = False


@dataclass(frozen=True, slots=True)
class DenseConfig:
    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2
    tma: bool = False
    """New-token tiles through TMA tensor descriptors (needs triton >= 3.4 and, on a GPU,
    compute capability 9.0 or later)."""
    warp_specialize: bool = False

    def describe(self) -> str:
        extras = "".join(
            [" tma" if self.tma else "", " ws" if self.warp_specialize else ""]
        )
        return (
            f"dense {self.block_m}x{self.block_n} w{self.num_warps} s{self.num_stages}{extras}"
        )


@triton.jit
def _new_tile(
    src,
    row0,
    col0,
    stride_row,
    row_end,
    BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    USE_TMA: tl.constexpr,
    MASKED: tl.constexpr,
):
    """[BLOCK, HEAD_DIM] of rows row0.. at column col0 of a [rows, heads * HEAD_DIM] view:
    a descriptor load, or plain loads (MASKED: rows at or past row_end read as zero)."""
    if USE_TMA:
        tile = src.load([row0, col0])
    else:
        rows = row0 + tl.arange(0, BLOCK)
        ptrs = src + rows.to(tl.int64)[:, None] * stride_row + col0 + tl.arange(0, HEAD_DIM)[None, :]
        if MASKED:
            tile = tl.load(ptrs, mask=(rows < row_end)[:, None], other=0.0)
        else:
            tile = tl.load(ptrs)
    return tile


@triton.jit
def _attend_new(
    acc,
    m_i,
    l_i,
    q,
    offs_m,
    k_src,
    v_src,
    row0,
    j0,
    q_len,
    col,
    stride_k_t,
    stride_v_t,
    qk_scale,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    USE_TMA: tl.constexpr,
    MASKED: tl.constexpr,
    IEEE: tl.constexpr,
):
    """One online-softmax step over the new tokens j0 .. j0 + BLOCK_N of the sequence whose
    first new row is row0; MASKED applies causality (j <= i) and j < q_len."""
    row_end = row0 + q_len
    k = _new_tile(k_src, row0 + j0, col, stride_k_t, row_end, BLOCK_N, HEAD_DIM, USE_TMA, MASKED)
    s = mma(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), IEEE)
    if MASKED:
        offs_n = j0 + tl.arange(0, BLOCK_N)
        visible = (offs_n[None, :] <= offs_m[:, None]) & (offs_n < q_len)[None, :]
        s = tl.where(visible, s, float("-inf"))
    # as attend_block: the scale in the row max and one multiply-add per score
    m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = _new_tile(v_src, row0 + j0, col, stride_v_t, row_end, BLOCK_N, HEAD_DIM, USE_TMA, MASKED)
    acc = mma(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
    return acc, m_new, l_i


@triton.jit
def _dense_prefill_kernel(
    q_src,
    k_src,
    v_src,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    page_table_ptr,
    cu_seqlens_q_ptr,
    seq_lens_ptr,
    qk_scale,
    stride_q_t,
    stride_k_t,
    stride_v_t,
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    USE_TMA: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    IEEE: tl.constexpr,
):
    # heads vary fastest (the query heads of one KV head share its tiles in L2), then
    # sequences; the last (longest) query blocks run first
    head = tl.program_id(0)
    seq = tl.program_id(1)
    q_block = tl.num_programs(2) - 1 - tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    m0 = q_block * BLOCK_M
    if m0 < q_len:
        prefix = tl.load(seq_lens_ptr + seq) - q_len
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        d_mask = offs_d < HEAD_DIM
        kv_head = head // GROUP
        q = _new_tile(
            q_src, q_start + m0, head * HEAD_DIM, stride_q_t, q_start + q_len,
            BLOCK_M, HEAD_DIM, USE_TMA, True,
        )  # fmt: skip
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        # the cached prefix, every position of it visible to every row: full tiles, then
        # the part tile masked at the prefix's end
        q_pos = prefix + offs_m
        k_base = k_cache_ptr + kv_head * stride_k_h
        v_base = v_cache_ptr + kv_head * stride_v_h
        page_row = page_table_ptr + seq.to(tl.int64) * stride_page_table
        prefix_full = prefix // BLOCK_N * BLOCK_N
        acc, m_i, l_i = attend_range(
            acc, m_i, l_i, q, q_pos, k_base, v_base, page_row, 0, prefix_full, prefix,
            stride_k_page, stride_k_slot, stride_v_page, stride_v_slot, offs_d, d_mask,
            qk_scale, 0, PAGE_SIZE, BLOCK_N, False, False, IEEE,
        )  # fmt: skip
        acc, m_i, l_i = attend_range(
            acc, m_i, l_i, q, q_pos, k_base, v_base, page_row, prefix_full, prefix, prefix,
            stride_k_page, stride_k_slot, stride_v_page, stride_v_slot, offs_d, d_mask,
            qk_scale, 0, PAGE_SIZE, BLOCK_N, True, False, IEEE,
        )  # fmt: skip
        # the new tokens: every row sees the tiles below m0 whole (BLOCK_N divides
        # BLOCK_M), then the diagonal tiles up to the block's last row, masked
        col = kv_head * HEAD_DIM
        for j0 in tl.range(0, m0, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
            acc, m_i, l_i = _attend_new(
                acc, m_i, l_i, q, offs_m, k_src, v_src, q_start, j0, q_len, col, stride_k_t,
                stride_v_t, qk_scale, BLOCK_N, HEAD_DIM, USE_TMA, False, IEEE,
            )  # fmt: skip
        for j0 in range(m0, tl.minimum(m0 + BLOCK_M, q_len), BLOCK_N):
            acc, m_i, l_i = _attend_new(
                acc, m_i, l_i, q, offs_m, k_src, v_src, q_start, j0, q_len, col, stride_k_t,
                stride_v_t, qk_scale, BLOCK_N, HEAD_DIM, USE_TMA, True, IEEE,
            )  # fmt: skip
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        rows = (q_start + offs_m).to(tl.int64)
        tl.store(
            out_ptr + rows[:, None] * stride_o_t + head * stride_o_h + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=(offs_m < q_len)[:, None],
        )


INTERPRETER_CONFIG = DenseConfig(block_m=32, block_n=16)
"""What the interpreter runs when no configuration is given (no timing to choose on)."""


def dense_supported(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    num_kv_heads: int,
    sliding_window: int | None,
) -> bool:
    """The dense kernel serves this call: no window, a power-of-two head_dim, and k_new /
    v_new laid out as the contract says."""
    num_tokens, _, head_dim = q.shape
    return (
        sliding_window is None
        and head_dim >= 16
        and head_dim & (head_dim - 1) == 0
        and q.stride(1) == head_dim
        and all(
            t.dim() == 3 and t.shape == (num_tokens, num_kv_heads, head_dim)
            and t.stride(2) == 1 and t.stride(1) == head_dim and t.dtype == q.dtype
            for t in (k_new, v_new)
        )
    )  # fmt: skip


def tma_supported(*tensors: torch.Tensor) -> bool:
    """TMA descriptors can cover these [rows, heads, head_dim] tensors: triton has them,
    the device is Hopper or later (or the interpreter), bases and row strides 16-byte aligned."""
    if not HAS_TMA_DESCRIPTORS:
        return False
    device = tensors[0].device
    if not interpreting() and (
        device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9
    ):
        return False
    return all(
        t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 for t in tensors
    )


def _source(t: torch.Tensor, rows: int, use_tma: bool) -> object:
    """The [rows, heads * head_dim] view of t as the kernel reads it."""
    if not use_tma:
        return t
    width = t.shape[1] * t.shape[2]
    return TensorDescriptor(t, [t.shape[0], width], [t.stride(0), 1], [rows, t.shape[2]])


def dense_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    max_q_len: int,
    config: DenseConfig,
) -> torch.Tensor:
    """`paged_attention_ref` (no window) with the new tokens' K/V from k_new / v_new, in one
    launch of `config`. The caller checked the paged contract and `dense_supported`."""
    check_paged_kv("paged_attention", q, k_cache, v_cache, page_table)
    check(
        dense_supported(q, k_new, v_new, k_cache.shape[2], None),
        "paged_attention: k_new / v_new must be [num_tokens, num_kv_heads, head_dim] like q",
    )
    check(config.block_m % config.block_n == 0, "dense prefill: block_n must divide block_m")
    num_tokens, num_heads, head_dim = q.shape
    out = torch.empty_like(q)
    if num_tokens == 0 or max_q_len == 0:
        return out
    # a batch shorter than one query tile reads through plain loads (no box past the rows)
    use_tma = config.tma and num_tokens >= config.block_m and tma_supported(q, k_new, v_new)
    grid = (num_heads, seq_lens.shape[0], triton.cdiv(max_q_len, config.block_m))
    _dense_prefill_kernel[grid](
        _source(q, config.block_m, use_tma),
        _source(k_new, config.block_n, use_tma),
        _source(v_new, config.block_n, use_tma),
        k_cache, v_cache, out, page_table, cu_seqlens_q, seq_lens,
        scale * LOG2E,
        q.stride(0), k_new.stride(0), v_new.stride(0), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        page_table.stride(0),
        GROUP=num_heads // k_cache.shape[2],
        PAGE_SIZE=k_cache.shape[1],
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        HEAD_DIM=head_dim,
        USE_TMA=use_tma,
        WARP_SPECIALIZE=config.warp_specialize and not interpreting(),
        IEEE=interpreting() or q.dtype == torch.float32,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )  # fmt: skip
    return out
