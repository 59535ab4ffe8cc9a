"""Batch-invariant linear and decode attention: a row's result never depends on the other
rows of the call, on how many there are, or on the page table's width.

A matrix product or an attention whose reduction order changes with the batch (a split-K
GEMV chosen for few rows, cuBLAS picking its algorithm by M, a decode attention splitting
the context by the batch size) rounds a row differently in different batches; with bf16
activations that flips near-tied logits. Here every reduction of a row is fixed by that
row's own shapes:

- `batch_invariant_linear_triton`: one matmul kernel with one tile configuration for every
  M, no split-K, no autotuning: output element (r, c) is the sum over K in BLOCK_K tiles,
  always in the same order and with the same instructions, whatever the other rows of its
  tile hold or where in the tile the row sits (M is not specialized on, so M = 1 compiles
  the same kernel). Under Triton's interpreter a tile's product is a broadcast multiply
  and an in-order sum over K instead of `tl.dot`, which there is a BLAS call whose
  rounding depends on the row's place in the tile.
- `batch_invariant_linear_ref` (CPU): each row is its own matrix-vector product, one call
  of one shape per row, so the BLAS path cannot change with M.
- `batch_invariant_decode_attention_triton`: split-KV decode with SPLIT_LEN positions per
  split, counted from the row's own first visible position; the grid covers the page
  table's capacity, trailing splits are empty (max -1e30, sum 0, output 0) and the merge
  walks the splits in order, so an empty split adds exact zeros and a wider table or a
  longer neighbour changes nothing.
- `decode_rows`: an extend's query rows as decode rows (row j of a sequence attends its
  prefix + j + 1 positions), so a verified draft position gets the attention a plain decode
  of that position would.

`batch_invariant_ops(ops, device)` returns an op set with these in place (the CPU
reference set's decode attention already walks each sequence alone, so it is kept). RMSNorm,
rotary, SiLU and the K/V store of both sets are per row (one program or one elementwise op
per token), as is sampling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixmesh_kernels._triton import check, interpreting, tl, triton
from radixmesh_kernels.paged_attention import LOG2E, check_paged_kv, check_window, mma
from radixmesh_kernels.paged_decode_attention import attend_split, store_partials

MATMUL_BLOCK_M = 64
MATMUL_BLOCK_N = 64
MATMUL_BLOCK_K = 64
MATMUL_NUM_WARPS = 4
MATMUL_NUM_STAGES = 3
SPLIT_LEN = 256
"""KV positions per decode split (a multiple of every tile length used)."""
_DECODE_BLOCK_N = 64
_DECODE_BLOCK_N_INTERPRETED = 16
PARTIALS_BYTES = 256 << 20
"""Most bytes of split partials one launch writes; more rows run in chunks of rows (each
row's result is its own, so the chunking changes no bit)."""


def batch_invariant_linear_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ weight.T + bias, row by row: each row one matrix-vector product of the same shape."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch.empty((rows.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    for r in range(rows.shape[0]):
        out[r] = F.linear(rows[r], weight, bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])


@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
    BROADCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_valid = offs_m < M
    n_valid = offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    w_cols = w_ptr + offs_n.to(tl.int64)[None, :] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        k_valid = k < K
        a = tl.load(x_rows + k[None, :], mask=m_valid[:, None] & k_valid[None, :], other=0.0)
        b = tl.load(w_cols + k[:, None], mask=k_valid[:, None] & n_valid[None, :], other=0.0)
        if BROADCAST:  # the interpreter's tl.dot is a BLAS call, not row-invariant
            prod = a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :]
            acc += tl.sum(prod, axis=1)
        else:
            acc = mma(a, b, acc, IEEE)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_valid, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_valid[:, None] & n_valid[None, :])


def batch_invariant_linear_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`batch_invariant_linear_ref`'s product as one fixed-tile Triton matmul (fp32
    accumulation, bias added in fp32, one rounding to x's dtype)."""
    check(weight.dim() == 2, "batch_invariant_linear: weight must be [out, in]")
    n, k = weight.shape
    check(x.shape[-1] == k, f"batch_invariant_linear: x has {x.shape[-1]} features, weight {k}")
    check(x.dtype == weight.dtype, "batch_invariant_linear: x and weight dtypes must be equal")
    check(bias is None or bias.shape == (n,), "batch_invariant_linear: bias must be [out]")
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    m = rows.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m and n:
        grid = (triton.cdiv(m, MATMUL_BLOCK_M), triton.cdiv(n, MATMUL_BLOCK_N))
        _matmul_kernel[grid](
            rows, weight, bias if bias is not None else weight, out, m, n, k,
            rows.stride(0), weight.stride(0), out.stride(0),
            HAS_BIAS=bias is not None, BLOCK_M=MATMUL_BLOCK_M, BLOCK_N=MATMUL_BLOCK_N,
            BLOCK_K=MATMUL_BLOCK_K, IEEE=interpreting() or x.dtype == torch.float32,
            BROADCAST=interpreting(),
            num_warps=MATMUL_NUM_WARPS, num_stages=MATMUL_NUM_STAGES,
        )  # fmt: skip
    return out.reshape(*x.shape[:-1], n)


@triton.jit(do_not_specialize=["stride_page_table"])  # one compile for every table width
def _split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    page_table_ptr,
    seq_lens_ptr,
    part_out_ptr,
    part_m_ptr,
    part_l_ptr,
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
    SPLIT: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SLIDING: tl.constexpr,
    IEEE: tl.constexpr,
):
    # split s covers [first + s * SPLIT, first + (s + 1) * SPLIT) of the row's visible
    # positions [first, seq_len); past seq_len it is empty
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    seq_len = tl.load(seq_lens_ptr + row)
    start = split * SPLIT
    if SLIDING:
        start += tl.maximum(seq_len - window, 0)
    end = tl.minimum(start + SPLIT, seq_len)
    acc, m_i, l_i = attend_split(
        q_ptr, k_cache_ptr, v_cache_ptr, page_table_ptr, row, kv_head, seq_len, start, end,
        qk_scale, window, stride_q_t, stride_q_h, stride_k_page, stride_k_slot, stride_k_h,
        stride_v_page, stride_v_slot, stride_v_h, stride_page_table,
        GROUP, PAGE_SIZE, BLOCK_H, BLOCK_N, HEAD_DIM, BLOCK_D, IEEE,
    )  # fmt: skip
    store_partials(
        part_out_ptr, part_m_ptr, part_l_ptr, row, kv_head, split, num_splits, acc, m_i, l_i,
        GROUP, BLOCK_H, HEAD_DIM, BLOCK_D,
    )  # fmt: skip


@triton.jit(do_not_specialize=["num_splits"])  # one compiled merge for every table width
def _merge_kernel(
    part_out_ptr,
    part_m_ptr,
    part_l_ptr,
    out_ptr,
    num_splits,
    stride_o_t,
    stride_o_h,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # the splits in order: the max first (exact in any order), then the weighted sums
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    base = (row * tl.num_programs(1) + head) * num_splits
    m_max = tl.load(part_m_ptr + base)
    for s in range(1, num_splits):
        m_max = tl.maximum(m_max, tl.load(part_m_ptr + base + s))
    total = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s in range(num_splits):
        weight = tl.math.exp2(tl.load(part_m_ptr + base + s) - m_max)
        total += weight * tl.load(part_l_ptr + base + s)
        acc += weight * tl.load(part_out_ptr + (base + s) * BLOCK_D + offs_d, mask=d_mask, other=0.0)
    total_s = tl.sum(total, axis=0)
    out = acc / tl.where(total_s > 0.0, total_s, 1.0)
    tl.store(
        out_ptr + row * stride_o_t + head * stride_o_h + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


def num_splits_for(max_pages_per_seq: int, page_size: int, sliding_window: int | None) -> int:
    """Splits the grid covers: the table's capacity (at most the window) in SPLIT_LEN parts."""
    capacity = max_pages_per_seq * page_size
    if sliding_window is not None:
        capacity = min(capacity, sliding_window)
    return max(1, triton.cdiv(capacity, SPLIT_LEN))


def batch_invariant_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """`paged_decode_attention_ref` (one query row per page-table row, its K/V stored) with
    a split per SPLIT_LEN positions of the row's own context and an in-order merge."""
    check_paged_kv("batch_invariant_decode_attention", q, k_cache, v_cache, page_table)
    check_window("batch_invariant_decode_attention", sliding_window)
    num_rows, num_heads, head_dim = q.shape
    page_size = k_cache.shape[1]
    check(
        seq_lens.shape == (num_rows,) and seq_lens.dtype == torch.int32,
        "batch_invariant_decode_attention: seq_lens must be [num_rows] int32",
    )
    check(
        page_table.shape[0] >= num_rows,
        "batch_invariant_decode_attention: page_table has fewer rows than q",
    )
    out = torch.empty_like(q)
    num_splits = num_splits_for(page_table.shape[1], page_size, sliding_window)
    block_d = max(triton.next_power_of_2(head_dim), 16)
    chunk = max(1, PARTIALS_BYTES // (num_heads * num_splits * (block_d + 2) * 4))
    for lo in range(0, num_rows, chunk):
        hi = min(lo + chunk, num_rows)
        _attend_rows(
            q[lo:hi], k_cache, v_cache, page_table[lo:hi], seq_lens[lo:hi], scale,
            sliding_window, out[lo:hi], num_splits, block_d,
        )  # fmt: skip
    return out


def _attend_rows(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor,
    num_splits: int,
    block_d: int,
) -> None:
    """The split and merge launches for the rows of q, into out."""
    num_rows, num_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    part_out = torch.empty(
        (num_rows, num_heads, num_splits, block_d), dtype=torch.float32, device=q.device
    )
    part_m = torch.empty((num_rows, num_heads, num_splits), dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    interpreted = interpreting()
    _split_kernel[(num_rows, num_kv_heads, num_splits)](
        q, k_cache, v_cache, page_table, seq_lens, part_out, part_m, part_l,
        scale * LOG2E, sliding_window or 0,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        page_table.stride(0),
        GROUP=group, PAGE_SIZE=page_size, BLOCK_H=max(triton.next_power_of_2(group), 16),
        BLOCK_N=_DECODE_BLOCK_N_INTERPRETED if interpreted else _DECODE_BLOCK_N,
        SPLIT=SPLIT_LEN, HEAD_DIM=head_dim, BLOCK_D=block_d,
        SLIDING=sliding_window is not None,
        IEEE=interpreted or q.dtype == torch.float32,
        num_warps=4, num_stages=2,
    )  # fmt: skip
    _merge_kernel[(num_rows, num_heads)](
        part_out, part_m, part_l, out, num_splits, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, BLOCK_D=block_d, num_warps=1,
    )  # fmt: skip


def workspace_bytes(
    num_rows: int, num_heads: int, head_dim: int, max_pages_per_seq: int, page_size: int,
    sliding_window: int | None,
) -> int:
    """A bound on the device memory one batch-invariant decode attention call over num_rows
    rows allocates: its split partials (a chunk of rows at a time) and, for an extend, the
    rows' page table."""
    splits = num_splits_for(max_pages_per_seq, page_size, sliding_window)
    per_row = num_heads * splits * (max(triton.next_power_of_2(head_dim), 16) + 2) * 4
    partials = min(num_rows, max(1, PARTIALS_BYTES // per_row)) * per_row
    return partials + num_rows * (max_pages_per_seq * 4 + 8)


def decode_rows(
    cu_seqlens_q: torch.Tensor, positions: torch.Tensor, page_table: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """An extend's query rows as decode rows: (page table [T, max_pages], seq_lens [T]
    int32), row t being its sequence's page row and attending positions [0, positions[t]].
    No value is read back to the host (a CUDA graph may capture it)."""
    num_tokens = positions.shape[0]
    token = torch.arange(num_tokens, dtype=cu_seqlens_q.dtype, device=cu_seqlens_q.device)
    seq = torch.searchsorted(cu_seqlens_q[1:].contiguous(), token, right=True)
    return page_table.index_select(0, seq), (positions + 1).to(torch.int32)


def batch_invariant_ops(ops, device: torch.device | str):
    """`ops` (a `radixmesh_kernels.Ops`) in the batch-invariant mode: the fixed-tile linear and the
    fixed-split decode attention on CUDA, the row-by-row linear elsewhere (the reference
    decode attention already attends each row alone)."""
    if torch.device(device).type == "cuda":
        replaced = {
            "linear": batch_invariant_linear_triton,
            "paged_decode_attention": batch_invariant_decode_attention_triton,
        }
    else:
        from radixmesh_kernels.paged_decode_attention import paged_decode_attention_ref

        replaced = {
            "linear": batch_invariant_linear_ref,
            "paged_decode_attention": paged_decode_attention_ref,
        }
    from radixmesh_kernels import replace_ops

    # the fused forms of the linear (FUSED_OPS) are off: they would bypass its replacement
    return replace_ops(ops, ops.name + "+batch-invariant", batch_invariant=True, **replaced)
