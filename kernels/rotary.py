"""Rotary position embedding (the rotate-half form used by Llama, Qwen and Mistral).

Layout contract: q is [num_tokens, num_heads, head_dim], k is
[num_tokens, num_kv_heads, head_dim], positions is [num_tokens] int64, and
cos_sin_cache is [max_positions, rotary_dim] fp32 with cos in the first half of
the last dim and sin in the second.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None = None) -> torch.Tensor:
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
        smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
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
