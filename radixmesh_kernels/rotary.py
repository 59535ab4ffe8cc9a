"""Rotary position embedding (the rotate-half form used by Llama, Qwen and Mistral).

Layout contract: q is [num_tokens, num_heads, head_dim], k is
[num_tokens, num_kv_heads, head_dim], positions is [num_tokens] int64, and
cos_sin_cache is [max_positions, rotary_dim] fp32 with cos in the first half of
the last dim and sin in the second. The rotation covers the whole head
(rotary_dim == head_dim).

`rotary_triton` runs one program per token: it reads the token's cos and sin
once and rotates every query and key head, into new tensors.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from radixmesh_kernels._triton import check, tl, triton


def rope_inv_freq(
    head_dim: int, theta: float, scaling: dict[str, Any] | None = None
) -> torch.Tensor:
    """Inverse frequencies, with Llama 3's frequency-dependent scaling when asked."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type in (None, "default"):
        return inv_freq
    if rope_type == "llama3":
        assert scaling is not None
        factor = float(scaling["factor"])
        low_freq_factor = float(scaling["low_freq_factor"])
        high_freq_factor = float(scaling["high_freq_factor"])
        old_context_len = float(scaling["original_max_position_embeddings"])
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context_len / wavelen - low_freq_factor) / (
            high_freq_factor - low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    if rope_type == "linear":
        assert scaling is not None
        return inv_freq / float(scaling["factor"])
    raise ValueError(f"unsupported rope scaling type {rope_type!r}")


def rope_cos_sin_cache(
    head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None = None
) -> torch.Tensor:
    """[max_positions, head_dim] fp32: cos of each frequency, then sin."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling)
    t = torch.arange(max_positions, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


def rotary_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns rotated (q, k); the inputs are not modified."""
    cos_sin = cos_sin_cache[positions]
    half = cos_sin.shape[-1] // 2
    cos = cos_sin[:, None, :half]
    sin = cos_sin[:, None, half:]
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


@triton.jit
def _rotate_heads(
    src_ptr,
    dst_ptr,
    stride_src_h,
    stride_dst_h,
    num_heads,
    cos,
    sin,
    half,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """Rotates the [num_heads, 2 * half] heads of one token: (x1, x2) -> (x1c - x2s, x2c + x1s)."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < half)
    src = src_ptr + offs_h[:, None] * stride_src_h + offs_d[None, :]
    dst = dst_ptr + offs_h[:, None] * stride_dst_h + offs_d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst, x1 * cos[None, :] - x2 * sin[None, :], mask=mask)
    tl.store(dst + half, x2 * cos[None, :] + x1 * sin[None, :], mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    positions_ptr,
    cos_sin_ptr,
    num_heads,
    num_kv_heads,
    half,
    stride_q_t,
    stride_q_h,
    stride_k_t,
    stride_k_h,
    stride_qo_t,
    stride_qo_h,
    stride_ko_t,
    stride_ko_h,
    stride_cos_sin,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < half
    cos = tl.load(cos_sin_ptr + pos * stride_cos_sin + offs_d, mask=d_mask, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cos_sin + half + offs_d, mask=d_mask, other=0.0)
    _rotate_heads(
        q_ptr + token * stride_q_t,
        q_out_ptr + token * stride_qo_t,
        stride_q_h,
        stride_qo_h,
        num_heads,
        cos,
        sin,
        half,
        BLOCK_HQ,
        BLOCK_HALF,
    )
    _rotate_heads(
        k_ptr + token * stride_k_t,
        k_out_ptr + token * stride_ko_t,
        stride_k_h,
        stride_ko_h,
        num_kv_heads,
        cos,
        sin,
        half,
        BLOCK_HK,
        BLOCK_HALF,
    )


def rotary_triton(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rotary_ref` as one kernel; q and k may be strided views (head_dim contiguous)."""
    check(q.dim() == 3 and q.stride(-1) == 1, "rotary: q must be [num_tokens, num_heads, head_dim]")
    num_tokens, num_heads, head_dim = q.shape
    check(
        k.dim() == 3 and k.shape[0] == num_tokens and k.shape[2] == head_dim and k.stride(-1) == 1,
        "rotary: k must be [num_tokens, num_kv_heads, head_dim]",
    )
    check(positions.shape == (num_tokens,), "rotary: positions must be [num_tokens]")
    check(
        cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == head_dim,
        "rotary: cos_sin_cache must be [max_positions, head_dim]",
    )
    check(
        cos_sin_cache.dtype == torch.float32 and cos_sin_cache.stride(-1) == 1,
        "rotary: cos_sin_cache must be fp32",
    )
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    if num_tokens == 0:
        return q_out, k_out
    num_kv_heads = k.shape[1]
    half = head_dim // 2
    _rotary_kernel[(num_tokens,)](
        q,
        k,
        q_out,
        k_out,
        positions,
        cos_sin_cache,
        num_heads,
        num_kv_heads,
        half,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        q_out.stride(0),
        q_out.stride(1),
        k_out.stride(0),
        k_out.stride(1),
        cos_sin_cache.stride(0),
        BLOCK_HQ=triton.next_power_of_2(num_heads),
        BLOCK_HK=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton.next_power_of_2(half),
        num_warps=4,
    )
    return q_out, k_out
