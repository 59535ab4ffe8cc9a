"""Paged attention for prefill and extend: causal, over a cached prefix.

Layout contract:
- q: [num_tokens, num_heads, head_dim], the new tokens of every sequence, flattened;
- k_cache, v_cache: [num_pages, page_size, num_kv_heads, head_dim], with the new
  tokens' keys and values already stored;
- page_table: [num_seqs, max_pages_per_seq] int32 (unused entries arbitrary);
- cu_seqlens_q: [num_seqs + 1] int32, the offsets of each sequence's tokens in q;
- seq_lens: [num_seqs] int32, each sequence's total length after this step
  (cached prefix + new tokens). Query i of sequence b sits at position
  seq_lens[b] - q_len_b + i and attends to every position up to its own;
- sliding_window (optional): query position p attends only the keys at
  p - sliding_window < k <= p, the last sliding_window positions including itself.

num_heads must be a multiple of num_kv_heads (grouped-query attention).

`paged_attention_triton` is flash attention over the pages: one program per
(query head, sequence, block of BLOCK_M query tokens), an online softmax in
fp32 over KV tiles of BLOCK_N positions gathered through the page table. KV
tiles every query row of the block may see run unmasked; the tiles on the
causal diagonal run masked. Packed (`pack_gqa`, grouped-query models): one
program per (KV head, sequence, block of BLOCK_M rows), a row being one query
head of one token, so the GROUP heads that read the same keys and values share
each tile's loads and its matrix products. A sequence of few new tokens (a
decode row in a mixed step, a verification's k + 1, a select's choices) then
fills GROUP times more of a tile than one head's rows do, in GROUP times fewer
programs; `packed_launch` sizes the tile to the rows. With a sliding window (a compile-time switch, so
the full-attention kernel is unchanged) the KV loop starts at the first tile
the block's window reaches, and the tiles at the window's lower edge run
masked too. `attend_block` is the inner step and `attend_range` its loop, both
shared with the decode kernel.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType

import torch

from radixmesh_kernels._triton import check, interpreting, num_multiprocessors, tl, triton

LOG2E = 1.4426950408889634


def gather_kv(cache: torch.Tensor, page_row: torch.Tensor, seq_len: int) -> torch.Tensor:
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
    sliding_window: int | None = None,
) -> torch.Tensor:
    check_window("paged_attention", sliding_window)
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
        if sliding_window is not None:
            mask |= k_pos[None, :] <= q_pos[:, None] - sliding_window
        scores.masked_fill_(mask[None], float("-inf"))
        probs = scores.softmax(dim=-1)
        out[q_start:q_end] = torch.einsum("hls,shd->lhd", probs, v).to(q.dtype)
    return out


@triton.jit
def mma(a, b, acc, IEEE: tl.constexpr):
    """acc + a @ b with fp32 accumulation; IEEE multiplies in fp32 (fp32 inputs, interpreter)."""
    if IEEE:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


@triton.jit
def attend_block(
    acc,
    m_i,
    l_i,
    q,
    q_pos,
    k_base_ptr,
    v_base_ptr,
    page_row_ptr,
    start_n,
    kv_end,
    stride_k_page,
    stride_k_slot,
    stride_v_page,
    stride_v_slot,
    offs_d,
    d_mask,
    qk_scale,
    window,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    SLIDING: tl.constexpr,
    IEEE: tl.constexpr,
):
    """One online-softmax step over KV positions [start_n, start_n + BLOCK_N).

    q is [M, BLOCK_D] with query positions q_pos [M]; k/v_base_ptr point at the
    KV head in the caches. MASKED applies `position < kv_end` and causality
    (`position <= q_pos`), and with SLIDING the window (`position > q_pos -
    window`, positions below every row's window not even read); unmasked tiles
    must lie wholly inside all of them. Scores are in the log2 domain (qk_scale
    includes log2(e)); m_i, l_i are the running max and sum per row, acc the
    unnormalized output.
    """
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if MASKED:
        n_valid = offs_n < kv_end
        if SLIDING:  # nothing below the lowest window of the block is read
            n_valid = n_valid & (offs_n > tl.min(q_pos, axis=0) - window)
        page = tl.load(page_row_ptr + offs_n // PAGE_SIZE, mask=n_valid, other=0).to(tl.int64)
    else:
        n_valid = offs_n >= 0
        page = tl.load(page_row_ptr + offs_n // PAGE_SIZE).to(tl.int64)
    slot = offs_n % PAGE_SIZE
    k_off = page * stride_k_page + slot * stride_k_slot
    kv_mask = n_valid[None, :] & d_mask[:, None]
    k_t = tl.load(k_base_ptr + k_off[None, :] + offs_d[:, None], mask=kv_mask, other=0.0)
    s = mma(q, k_t, tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), IEEE)
    if MASKED:
        visible = n_valid[None, :] & (offs_n[None, :] <= q_pos[:, None])
        if SLIDING:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
    # the scale goes into the row max (qk_scale > 0) and one multiply-add per score
    m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v_off = page * stride_v_page + slot * stride_v_slot
    v = tl.load(
        v_base_ptr + v_off[:, None] + offs_d[None, :],
        mask=n_valid[:, None] & d_mask[None, :],
        other=0.0,
    )
    acc = mma(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
    return acc, m_new, l_i


@triton.jit
def attend_range(
    acc,
    m_i,
    l_i,
    q,
    q_pos,
    k_base_ptr,
    v_base_ptr,
    page_row_ptr,
    lo,
    hi,
    kv_end,
    stride_k_page,
    stride_k_slot,
    stride_v_page,
    stride_v_slot,
    offs_d,
    d_mask,
    qk_scale,
    window,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    SLIDING: tl.constexpr,
    IEEE: tl.constexpr,
):
    """`attend_block` over the KV tiles starting at lo, lo + BLOCK_N, ... below hi."""
    for start_n in range(lo, hi, BLOCK_N):
        acc, m_i, l_i = attend_block(
            acc, m_i, l_i, q, q_pos, k_base_ptr, v_base_ptr, page_row_ptr, start_n, kv_end,
            stride_k_page, stride_k_slot, stride_v_page, stride_v_slot, offs_d, d_mask,
            qk_scale, window, PAGE_SIZE, BLOCK_N, MASKED, SLIDING, IEEE,
        )  # fmt: skip
    return acc, m_i, l_i


@triton.jit
def _paged_prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    page_table_ptr,
    cu_seqlens_q_ptr,
    seq_lens_ptr,
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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SLIDING: tl.constexpr,
    IEEE: tl.constexpr,
    ROWS_PER_TOKEN: tl.constexpr = 1,
):
    # programs: (query heads, or KV heads when packed) x sequences x row blocks; heads vary
    # fastest, then sequences; the last (longest) row blocks run first. Row r of a sequence
    # is its token r // ROWS_PER_TOKEN in head first_head + r % ROWS_PER_TOKEN: one head
    # per program (1), or every query head of one KV head (GROUP, packed).
    first_head = tl.program_id(0) * ROWS_PER_TOKEN
    seq = tl.program_id(1)
    q_block = tl.num_programs(2) - 1 - tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if q_block * BLOCK_M < q_len * ROWS_PER_TOKEN:
        seq_len = tl.load(seq_lens_ptr + seq)
        prefix = seq_len - q_len
        offs_r = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_m = offs_r // ROWS_PER_TOKEN
        heads = first_head + offs_r % ROWS_PER_TOKEN
        offs_d = tl.arange(0, BLOCK_D)
        m_valid = offs_r < q_len * ROWS_PER_TOKEN
        d_mask = offs_d < HEAD_DIM
        q_rows = (q_start + offs_m).to(tl.int64)
        q_offs = q_rows[:, None] * stride_q_t + heads[:, None] * stride_q_h + offs_d[None, :]
        q = tl.load(q_ptr + q_offs, mask=m_valid[:, None] & d_mask[None, :], other=0.0)
        q_pos = prefix + offs_m
        kv_head = first_head // GROUP
        k_base = k_cache_ptr + kv_head * stride_k_h
        v_base = v_cache_ptr + kv_head * stride_v_h
        page_row = page_table_ptr + seq.to(tl.int64) * stride_page_table
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        # [window edge tiles,] tiles every row of the block sees in full, diagonal tiles
        first_pos = prefix + q_block * BLOCK_M // ROWS_PER_TOKEN
        last_pos = prefix + (q_block * BLOCK_M + BLOCK_M - 1) // ROWS_PER_TOKEN
        kv_end = tl.minimum(last_pos + 1, seq_len)
        full_end = (first_pos + 1) // BLOCK_N * BLOCK_N
        full_start = 0
        if SLIDING:
            # the first row reaches back to first_pos - window + 1; from full_start on,
            # every position is inside the last row's window (kv_end - 1 - window, ...]
            edge_start = tl.maximum(first_pos - window + 1, 0) // BLOCK_N * BLOCK_N
            full_start = tl.minimum(
                tl.cdiv(tl.maximum(kv_end - window, 0), BLOCK_N) * BLOCK_N, full_end
            )
            acc, m_i, l_i = attend_range(
                acc, m_i, l_i, q, q_pos, k_base, v_base, page_row, edge_start, full_start,
                kv_end, stride_k_page, stride_k_slot, stride_v_page, stride_v_slot, offs_d,
                d_mask, qk_scale, window, PAGE_SIZE, BLOCK_N, True, True, IEEE,
            )  # fmt: skip
        acc, m_i, l_i = attend_range(
            acc, m_i, l_i, q, q_pos, k_base, v_base, page_row, full_start, full_end, kv_end,
            stride_k_page, stride_k_slot, stride_v_page, stride_v_slot, offs_d, d_mask,
            qk_scale, window, PAGE_SIZE, BLOCK_N, False, False, IEEE,
        )  # fmt: skip
        acc, m_i, l_i = attend_range(
            acc, m_i, l_i, q, q_pos, k_base, v_base, page_row, full_end, kv_end, kv_end,
            stride_k_page, stride_k_slot, stride_v_page, stride_v_slot, offs_d, d_mask,
            qk_scale, window, PAGE_SIZE, BLOCK_N, True, SLIDING, IEEE,
        )  # fmt: skip
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + q_rows[:, None] * stride_o_t + heads[:, None] * stride_o_h + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=m_valid[:, None] & d_mask[None, :],
        )


def _prefill_configs() -> list:
    # (BLOCK_M, BLOCK_N, num_warps, num_stages); all fit Hopper's shared memory at head_dim 128
    shapes = [
        (128, 64, 8, 3),
        (128, 64, 8, 4),
        (128, 128, 8, 2),
        (128, 32, 4, 3),
        (64, 64, 4, 3),
        (64, 32, 4, 4),
    ]
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=st)
        for m, n, w, st in shapes
    ]


_paged_prefill_tuned = triton.autotune(
    configs=_prefill_configs(), key=["HEAD_DIM", "GROUP", "PAGE_SIZE", "SLIDING", "IEEE"]
)(_paged_prefill_kernel)

# the interpreter runs one fixed, small configuration (no timing to tune on)
_INTERPRETER_PREFILL = {"BLOCK_M": 16, "BLOCK_N": 16}

PACK_GQA_MODES = ("auto", "on", "off")
PACK_GQA = os.environ.get("RADIXMESH_PACK_GQA", "auto")
"""How `paged_attention_triton` runs grouped-query heads when its caller does not say:
"auto" packed for steps of at most PACK_MAX_Q_LEN new tokens a sequence whose heads and
sequences fill the device's multiprocessors (`packs_by_default`), "on" packed at any
length, "off" one head a program (from RADIXMESH_PACK_GQA at import, for A/B runs)."""
if PACK_GQA not in PACK_GQA_MODES:
    raise ValueError(
        f"RADIXMESH_PACK_GQA must be one of {', '.join(PACK_GQA_MODES)}, got {PACK_GQA!r}"
    )

PACK_MAX_Q_LEN = 128
""""auto" packs steps whose longest sequence has at most this many new tokens: there the
packed tile holds a sequence's rows in GROUP times fewer programs, each reading its keys
and values once for the group, and no program does more tile work than an unpacked one
(a one-token row costs a 16-row tile, not a BLOCK_M one per head). Longer steps keep the
unpacked kernel and its tuned tiles (the dense kernel serves most of them anyway)."""

PACKED_BLOCK_MS = (16, 32, 64)
"""Row tiles of the packed kernel: the smallest that holds a sequence's rows (its longest
new-token count times the group), at most the last; longer sequences take several."""


_PACKED_LAUNCHES = {
    block_m: MappingProxyType({"BLOCK_M": block_m, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3})
    for block_m in PACKED_BLOCK_MS
}
"""Each tile height's launch, built once: every layer of a step looks one up."""


def packed_launch(rows: int) -> Mapping[str, int]:
    """The packed kernel's launch for sequences of at most `rows` rows (tokens x group): the
    smallest tile that holds them, else the largest. Fixed per tile height, so a launch
    compiles one of `PACKED_BLOCK_MS` and tunes nothing (read-only: one per height)."""
    for block_m in PACKED_BLOCK_MS:
        if rows <= block_m:
            return _PACKED_LAUNCHES[block_m]
    return _PACKED_LAUNCHES[PACKED_BLOCK_MS[-1]]


def check_window(op: str, sliding_window: int | None) -> None:
    """A sliding window, when given, covers at least the query's own position."""
    check(
        sliding_window is None
        or (
            isinstance(sliding_window, int)
            and not isinstance(sliding_window, bool)
            and sliding_window >= 1
        ),
        f"{op}: sliding_window must be an int >= 1 or None, got {sliding_window!r}",
    )


def check_paged_kv(
    op: str, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor
) -> None:
    """The layout contract shared by the prefill and decode wrappers."""
    check(q.dim() == 3 and q.stride(-1) == 1, f"{op}: q must be [num_tokens, num_heads, head_dim]")
    check(
        k_cache.dim() == 4 and k_cache.stride(-1) == 1,
        f"{op}: k_cache must be [num_pages, page_size, num_kv_heads, head_dim]",
    )
    check(
        v_cache.shape == k_cache.shape and v_cache.stride(-1) == 1,
        f"{op}: v_cache must match k_cache",
    )
    check(k_cache.dtype == v_cache.dtype, f"{op}: k_cache and v_cache dtypes differ")
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    check(
        k_cache.shape[3] == head_dim,
        f"{op}: q head_dim {head_dim} != cache head_dim {k_cache.shape[3]}",
    )
    check(
        num_heads % num_kv_heads == 0,
        f"{op}: num_heads {num_heads} not a multiple of num_kv_heads {num_kv_heads}",
    )
    check(head_dim >= 16, f"{op}: head_dim must be at least 16")
    check(
        page_table.dim() == 2 and page_table.dtype == torch.int32 and page_table.stride(-1) == 1,
        f"{op}: page_table must be [num_seqs, max_pages_per_seq] int32",
    )


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    max_q_len: int | None = None,
    pack_gqa: bool | None = None,
) -> torch.Tensor:
    """`paged_attention_ref` in one launch for every sequence of the batch.

    max_q_len (the longest sequence's new-token count) sizes the grid; when
    omitted it is read from cu_seqlens_q, which synchronizes with the device.
    pack_gqa: one program per KV head and row block, its rows every query head of
    the group (module docstring); the same without grouped-query heads. None: by
    `PACK_GQA` (`packs_by_default`).
    """
    check_paged_kv("paged_attention", q, k_cache, v_cache, page_table)
    check_window("paged_attention", sliding_window)
    num_seqs = seq_lens.shape[0]
    check(
        cu_seqlens_q.shape == (num_seqs + 1,) and cu_seqlens_q.dtype == torch.int32,
        "paged_attention: cu_seqlens_q must be [num_seqs + 1] int32",
    )
    check(seq_lens.dtype == torch.int32, "paged_attention: seq_lens must be int32")
    check(
        page_table.shape[0] >= num_seqs, "paged_attention: page_table has fewer rows than seq_lens"
    )
    num_tokens, num_heads, head_dim = q.shape
    out = torch.empty_like(q)
    if max_q_len is None:
        max_q_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) if num_seqs else 0
    if num_tokens == 0 or max_q_len == 0:
        return out
    ieee = interpreting() or q.dtype == torch.float32
    args = (
        q, k_cache, v_cache, out, page_table, cu_seqlens_q, seq_lens,
        scale * LOG2E,
        sliding_window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        page_table.stride(0),
    )  # fmt: skip
    group = num_heads // k_cache.shape[2]
    if pack_gqa is None:
        pack_gqa = packs_by_default(max_q_len, num_seqs * num_heads, q.device)
    rows_per_token = group if pack_gqa else 1
    meta = {
        "GROUP": group,
        "PAGE_SIZE": k_cache.shape[1],
        "HEAD_DIM": head_dim,
        "BLOCK_D": max(triton.next_power_of_2(head_dim), 16),
        "SLIDING": sliding_window is not None,
        "IEEE": ieee,
    }

    def grid(cfg: Mapping[str, int]) -> tuple[int, int, int]:
        rows = max_q_len * rows_per_token
        return (num_heads // rows_per_token, num_seqs, triton.cdiv(rows, cfg["BLOCK_M"]))

    if interpreting():
        _paged_prefill_kernel[grid](
            *args, **meta, **_INTERPRETER_PREFILL, ROWS_PER_TOKEN=rows_per_token
        )
    elif rows_per_token > 1:
        launch = packed_launch(max_q_len * rows_per_token)
        _paged_prefill_kernel[grid(launch)](*args, **meta, **launch, ROWS_PER_TOKEN=rows_per_token)
    else:
        _paged_prefill_tuned[grid](*args, **meta)
    return out


def packs_by_default(max_q_len: int, head_seqs: int, device: torch.device) -> bool:
    """Whether a step whose longest sequence has `max_q_len` new tokens, over `head_seqs`
    (query head, sequence) pairs, runs packed when its caller does not say (`PACK_GQA`).

    "auto" packs short steps whose unpacked grid has a program for every multiprocessor
    of the device at least (`num_multiprocessors`; 2 under the interpreter). Packing divides the
    programs by the group: where the unpacked ones already run in one wave, that takes
    parallel KV reads away and saves no wave. On a lent H100 (132 multiprocessors) a
    verification of 5 rows over 512 keys at batch 1 (32 heads: 32 programs unpacked, 8
    packed) took 18.3 us packed against 15.5 unpacked at the 8B shape, while steps of
    512 and more pairs ran 1.3-2.4x faster packed (bench/RESULTS.md)."""
    if PACK_GQA != "auto":
        return PACK_GQA == "on"
    return max_q_len <= PACK_MAX_Q_LEN and head_seqs >= num_multiprocessors(device)


def packed_warmup_q_lens(group: int) -> tuple[int, ...]:
    """New-token counts of one sequence whose packed launches compile every tile height of
    `PACKED_BLOCK_MS` (a start-up's warm-up runs them, so no step compiles one)."""
    if group == 1:
        return ()
    return tuple(sorted({max(1, block_m // group) for block_m in PACKED_BLOCK_MS}))
