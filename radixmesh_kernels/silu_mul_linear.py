"""The gated MLP's second half as one op: silu(gate) * up, then the down projection.

`silu_mul_linear(x, weight, scale=None, bias=None)` is `silu_and_mul(x)` followed by
`linear` (scale None: a plain weight) or `fp8_linear` (an FP8 weight with its row scales).
At decode batch sizes on CUDA the split-K GEMV reads [gate | up] and forms the activation
in registers (`gemv.gemv_splitk(..., gated=True)`): one launch and no activation round trip
through memory, chosen per shape against the two ops it replaces (timed together, so the
fused form serves only where it is faster). Elsewhere it is those two ops.
"""

from __future__ import annotations

import torch

from radixmesh_kernels import gemv_chain
from radixmesh_kernels._triton import check, interpreting
from radixmesh_kernels.fp8_linear import FP8, linear_ref, linear_triton
from radixmesh_kernels.gemv import CANDIDATES, MAX_ROWS, GemvFn, gemv_plan
from radixmesh_kernels.silu_and_mul import silu_and_mul_ref, silu_and_mul_triton


def silu_mul_linear_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    return linear_ref(silu_and_mul_ref(x), weight, scale, bias)


def _two_ops(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    return linear_triton(silu_and_mul_triton(x), weight, scale, bias)


TWO_OPS: dict[str, GemvFn] = {"silu_and_mul + linear": _two_ops}
"""What the fused GEMV's configs are timed against per shape, and the reference their
outputs must agree with."""


def silu_mul_linear_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`silu_mul_linear_ref`, fused at 1 to MAX_ROWS rows on CUDA where that is faster."""
    check(x.dim() == 2 and x.stride(-1) == 1, "silu_mul_linear: x must be [rows, 2 * in] contiguous")
    check(weight.dim() == 2, "silu_mul_linear: weight must be [out, in]")
    check(
        x.shape[1] == 2 * weight.shape[1],
        f"silu_mul_linear: x has {x.shape[1]} columns, 2 x the weight's {weight.shape[1]} expected",
    )
    check(
        (scale is None) == (weight.dtype != FP8),
        "silu_mul_linear: an FP8 weight takes its scale, a plain weight none",
    )
    fused = (
        gemv_chain.FUSION != "off" and x.is_cuda and 1 <= x.shape[0] <= MAX_ROWS and weight.stride(-1) == 1
        and weight.element_size() in CANDIDATES and (scale is not None or weight.dtype == x.dtype)
        and not interpreting()
    )  # fmt: skip
    if not fused:
        return _two_ops(x, weight, scale, bias)
    return gemv_plan(x, weight, scale, bias, TWO_OPS, gated=True).fn(x, weight, scale, bias)
