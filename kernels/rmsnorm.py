"""RMSNorm, optionally fused with the residual add that precedes it.

Layout contract: x and residual are [num_tokens, hidden] contiguous, weight is [hidden].
"""

from __future__ import annotations

import torch


def rmsnorm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (normed, new_residual).

    With a residual: h = x + residual, normed = rmsnorm(h), new_residual = h.
    Without: normed = rmsnorm(x), new_residual = x. Statistics in fp32, the
    product with weight in x's dtype, as Hugging Face's Llama does.
    """
    if residual is not None:
        x = x + residual
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype), x
