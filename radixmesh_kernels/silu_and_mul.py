"""SiLU-and-mul: the gated MLP activation, silu(gate) * up.

Layout contract: x is [num_tokens, 2 * intermediate] with gate first, then up
(rows contiguous in the last dim). `silu_and_mul_triton` runs a 2D grid of
(token, column block) programs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixmesh_kernels._triton import check, dependent_launch, release_dependents, tl, triton


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    intermediate,
    stride_x,
    stride_out,
    BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    release_dependents(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs < intermediate
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + intermediate + offs, mask=mask, other=0.0)
    # silu rounded to the activation dtype before the product, as the unfused ops do
    act = (gate * tl.sigmoid(gate)).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, act * up.to(tl.float32), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    check(
        x.dim() == 2 and x.stride(-1) == 1, "silu_and_mul: x must be [num_tokens, 2 * intermediate]"
    )
    check(x.shape[1] % 2 == 0, "silu_and_mul: x's last dim must be even")
    num_tokens, intermediate = x.shape[0], x.shape[1] // 2
    out = torch.empty((num_tokens, intermediate), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    block_n = min(triton.next_power_of_2(intermediate), 1024)
    grid = (num_tokens, triton.cdiv(intermediate, block_n))
    _silu_and_mul_kernel[grid](
        x, out, intermediate, x.stride(0), out.stride(0), BLOCK_N=block_n, num_warps=4,
        **dependent_launch(x.device),
    )
    return out
