"""Rotary embedding fused with the KV store: one launch per layer instead of two.

Layout contract: `rotary`'s (q [num_tokens, num_heads, head_dim], k and v [num_tokens,
num_kv_heads, head_dim], positions [num_tokens] int64, cos_sin_cache [max_positions,
head_dim] fp32) and `kv_store`'s (k_cache, v_cache [num_pages, page_size, num_kv_heads,
head_dim] contiguous, slot_mapping [num_tokens] int64, a negative slot skipped). Returns
the rotated q; the rotated k and v go straight into their cache slots, so the rotated k
never makes a round trip through memory.

`rotary_kv_store_triton` runs one program per token: it reads the token's cos and sin
once, rotates every query head into a new tensor and every key head into the cache, and
copies the value heads. The rotated keys are rounded to k's dtype before the cache's, as
the two separate ops do.
"""

from __future__ import annotations

import torch

from radixmesh_kernels._triton import check, dependent_launch, release_dependents, tl, triton
from radixmesh_kernels.kv_store import kv_store_ref
from radixmesh_kernels.rotary import _rotate_heads, rotary_ref


def rotary_kv_store_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """`rotary` then `kv_store` of the rotated k; returns the rotated q."""
    q_rot, k_rot = rotary_ref(q, k, positions, cos_sin_cache)
    keep = slot_mapping >= 0
    kv_store_ref(k_rot[keep], v[keep], k_cache, v_cache, slot_mapping[keep])
    return q_rot


@triton.jit
def _rotary_kv_store_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    positions_ptr,
    cos_sin_ptr,
    slot_mapping_ptr,
    num_heads,
    num_kv_heads,
    half,
    stride_q_t,
    stride_q_h,
    stride_k_t,
    stride_k_h,
    stride_v_t,
    stride_v_h,
    stride_qo_t,
    stride_qo_h,
    stride_cache_slot,
    stride_cache_h,
    stride_cos_sin,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    release_dependents(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < half
    cos = tl.load(cos_sin_ptr + pos * stride_cos_sin + offs_d, mask=d_mask, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cos_sin + half + offs_d, mask=d_mask, other=0.0)
    _rotate_heads(
        q_ptr + token * stride_q_t, q_out_ptr + token * stride_qo_t, stride_q_h, stride_qo_h,
        num_heads, cos, sin, half, BLOCK_HQ, BLOCK_HALF,
    )  # fmt: skip
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot >= 0:
        offs_h = tl.arange(0, BLOCK_HK)
        mask = (offs_h[:, None] < num_kv_heads) & d_mask[None, :]
        src = k_ptr + token * stride_k_t + offs_h[:, None] * stride_k_h + offs_d[None, :]
        dst = k_cache_ptr + slot * stride_cache_slot + offs_h[:, None] * stride_cache_h
        dst += offs_d[None, :]
        x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
        k_dtype = k_ptr.dtype.element_ty
        cache_dtype = k_cache_ptr.dtype.element_ty
        r1 = (x1 * cos[None, :] - x2 * sin[None, :]).to(k_dtype).to(cache_dtype)
        r2 = (x2 * cos[None, :] + x1 * sin[None, :]).to(k_dtype).to(cache_dtype)
        tl.store(dst, r1, mask=mask)
        tl.store(dst + half, r2, mask=mask)
        v_src = v_ptr + token * stride_v_t + offs_h[:, None] * stride_v_h + offs_d[None, :]
        v_dst = v_cache_ptr + slot * stride_cache_slot + offs_h[:, None] * stride_cache_h
        v_dst += offs_d[None, :]
        v1 = tl.load(v_src, mask=mask, other=0.0)
        v2 = tl.load(v_src + half, mask=mask, other=0.0)
        tl.store(v_dst, v1.to(cache_dtype), mask=mask)
        tl.store(v_dst + half, v2.to(cache_dtype), mask=mask)


def rotary_kv_store_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """`rotary_kv_store_ref` as one kernel; q, k and v may be strided views."""
    check(q.dim() == 3 and q.stride(-1) == 1, "rotary_kv_store: q must be [num_tokens, num_heads, head_dim]")  # fmt: skip
    num_tokens, num_heads, head_dim = q.shape
    check(k_cache.dim() == 4 and k_cache.is_contiguous(), "rotary_kv_store: k_cache must be contiguous 4D")  # fmt: skip
    check(
        v_cache.shape == k_cache.shape and v_cache.is_contiguous() and v_cache.dtype == k_cache.dtype,
        "rotary_kv_store: v_cache must match k_cache",
    )
    num_kv_heads = k_cache.shape[2]
    check(k_cache.shape[3] == head_dim, "rotary_kv_store: the caches' head_dim must be q's")
    check(head_dim % 2 == 0, "rotary_kv_store: head_dim must be even")
    for name, t in (("k", k), ("v", v)):
        check(
            t.shape == (num_tokens, num_kv_heads, head_dim) and t.stride(-1) == 1,
            f"rotary_kv_store: {name} must be [num_tokens, num_kv_heads, head_dim], head_dim contiguous",
        )
    check(positions.shape == (num_tokens,), "rotary_kv_store: positions must be [num_tokens]")
    check(slot_mapping.shape == (num_tokens,), "rotary_kv_store: slot_mapping must be [num_tokens]")
    check(
        cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == head_dim
        and cos_sin_cache.dtype == torch.float32 and cos_sin_cache.stride(-1) == 1,
        "rotary_kv_store: cos_sin_cache must be [max_positions, head_dim] fp32",
    )  # fmt: skip
    q_out = torch.empty_like(q)
    if num_tokens == 0:
        return q_out
    half = head_dim // 2
    _rotary_kv_store_kernel[(num_tokens,)](
        q, k, v, q_out, k_cache, v_cache, positions, cos_sin_cache, slot_mapping,
        num_heads, num_kv_heads, half,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1), k_cache.stride(1), k_cache.stride(2),
        cos_sin_cache.stride(0),
        BLOCK_HQ=triton.next_power_of_2(num_heads), BLOCK_HK=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton.next_power_of_2(half), num_warps=4, **dependent_launch(q.device),
    )  # fmt: skip
    return q_out
