"""RMSNorm, optionally fused with the residual add that precedes it.

Layout contract: x and residual are [num_tokens, hidden] contiguous, weight is [hidden].
`rmsnorm_triton` runs one program per token over the whole hidden row.
"""

from __future__ import annotations

import torch

from radixmesh_kernels._triton import check, dependent_launch, release_dependents, tl, triton


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


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    new_residual_ptr,
    hidden,
    stride_x,
    stride_residual,
    stride_out,
    stride_new_residual,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_H: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """One program per token: (x + residual) -> new_residual, rmsnorm of it * weight -> out."""
    release_dependents(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_H)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + offs, mask=mask, other=0.0)
        # round the sum to the activation dtype, as the unfused add would
        x = (x + r.to(tl.float32)).to(new_residual_ptr.dtype.element_ty).to(tl.float32)
        tl.store(new_residual_ptr + row * stride_new_residual + offs, x, mask=mask)
    mean_sq = tl.sum(x * x, axis=0) / hidden
    normed = x * tl.rsqrt(mean_sq + eps)
    normed = normed.to(new_residual_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, w * normed, mask=mask)


def rmsnorm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rmsnorm_ref` as one fused kernel; the inputs are not modified."""
    check(
        x.dim() == 2 and x.stride(-1) == 1,
        "rmsnorm: x must be [num_tokens, hidden], rows contiguous",
    )
    num_tokens, hidden = x.shape
    check(weight.shape == (hidden,) and weight.is_contiguous(), "rmsnorm: weight must be [hidden]")
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if residual is not None:
        check(
            residual.shape == x.shape and residual.stride(-1) == 1, "rmsnorm: residual must match x"
        )
        check(residual.dtype == x.dtype, "rmsnorm: residual dtype must equal x dtype")
        new_residual = torch.empty_like(x)
    else:
        new_residual = x
    if num_tokens == 0:
        return out, new_residual
    block_h = triton.next_power_of_2(hidden)
    _rmsnorm_kernel[(num_tokens,)](
        x,
        residual if residual is not None else x,
        weight,
        out,
        new_residual,
        hidden,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        new_residual.stride(0),
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK_H=block_h,
        num_warps=min(max(block_h // 512, 1), 16),
        **dependent_launch(x.device),
    )
    return out, new_residual
