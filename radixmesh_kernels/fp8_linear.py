"""FP8 linear layer: y = x @ (weight * scale[:, None]).T + bias, weight in float8_e4m3fn.

Layout contract: x is [num_tokens, in] (rows contiguous), weight [out, in] float8_e4m3fn
row-major, scale [out] float32 (one per output row), bias [out] or None; y is
[num_tokens, out] in x's dtype.

`fp8_linear_triton` picks the kernel by the number of rows:
- up to GEMV_MAX_ROWS (decode at batch 1 to 8): a weight-only GEMV (FP8 weights widened
  in registers, fp32 accumulation with the activations as they are: no activation
  rounding). `radixmesh_kernels/gemv.py` holds the split-K kernel and the per-shape choice
  among its configs, the one-pass `_fp8_gemv_kernel` here (one program per BLOCK_N
  output rows, the whole K) and the tensor-core path, timed on the device;
- above it: the activations are quantized per token by `_quantize_rows_kernel` (one
  program per row: the row's largest magnitude maps to 448) and the product runs on the
  FP8 tensor cores through `torch._scaled_mm` with row-wise scales.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixmesh_kernels import gemv
from radixmesh_kernels._triton import check, tl, triton
from radixmesh_kernels.gemv import (
    MAX_ROWS,
    GemvFn,
    dense_linear_ref,
    dense_linear_triton,
    gemv_plan,
)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
GEMV_MAX_ROWS = MAX_ROWS
ONEPASS_MAX_ROWS = 2
"""Rows the one-pass kernel served alone before the per-shape choice (gemv.MODE "legacy")."""
_MIN_SCALE = 1e-12
# torch._scaled_mm wants both dimensions of the activation matrix divisible by 16.
_ROW_MULTIPLE = 16


def fp8_linear_ref(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The dequantized product: what every kernel here is compared against."""
    dequantized = (weight.float() * scale.float()[:, None]).to(x.dtype)
    return F.linear(x, dequantized, bias)


@triton.jit
def _fp8_gemv_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    num_rows,
    out_features,
    in_features,
    stride_x,
    stride_w,
    stride_out,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask_n = offs_n < out_features
    mask_m = offs_m < num_rows
    # products accumulate elementwise over the K loop and are summed once at the end: no
    # cross-thread reduction inside the loop, which is bound by reading the weight
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w
    x_rows = x_ptr + offs_m[:, None] * stride_x
    for k0 in range(0, in_features, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < in_features
        w = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        x = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    out = tl.sum(acc, axis=2) * tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    if HAS_BIAS:
        out += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_out + offs_n[None, :]
    tl.store(out_ptrs, out, mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _quantize_rows_kernel(
    x_ptr,
    out_ptr,
    scale_ptr,
    num_rows,
    in_features,
    stride_x,
    stride_out,
    MIN_SCALE: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One row per program: scale = max|x| / 448, out = x / scale in FP8 (rows past
    num_rows, the padding, become zeros with a scale of MIN_SCALE)."""
    row = tl.program_id(0)
    live = row < num_rows
    x_row = x_ptr + row.to(tl.int64) * stride_x
    amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_row + offs, mask=(offs < in_features) & live, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    scale = tl.maximum(tl.max(amax, axis=0) / 448.0, MIN_SCALE)
    out_row = out_ptr + row.to(tl.int64) * stride_out
    for k0 in range(0, in_features, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_row + offs, mask=(offs < in_features) & live, other=0.0)
        q = tl.clamp(x.to(tl.float32) / scale, -448.0, 448.0)
        tl.store(out_row + offs, q.to(out_ptr.dtype.element_ty), mask=offs < in_features)
    tl.store(scale_ptr + row, scale)


def quantize_rows_triton(x: torch.Tensor, num_padded_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in FP8 [num_padded_rows, in], per-row float32 scales [num_padded_rows, 1])."""
    num_rows, in_features = x.shape
    out = torch.empty((num_padded_rows, in_features), dtype=FP8, device=x.device)
    scale = torch.empty((num_padded_rows, 1), dtype=torch.float32, device=x.device)
    block_k = min(triton.next_power_of_2(in_features), 4096)
    _quantize_rows_kernel[(num_padded_rows,)](
        x, out, scale, num_rows, in_features, x.stride(0), out.stride(0),
        MIN_SCALE=_MIN_SCALE, BLOCK_K=block_k, num_warps=8,
    )  # fmt: skip
    return out, scale


GEMV_BLOCK_N = 16
GEMV_BLOCK_PRODUCTS = 4096
"""BLOCK_M * BLOCK_N * BLOCK_K: the fp32 accumulators a program holds (32 per thread)."""
GEMV_NUM_WARPS = 4
GEMV_NUM_STAGES = 4


def _gemv_blocks(num_rows: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) for `num_rows` rows."""
    block_m = triton.next_power_of_2(max(num_rows, 1))
    return block_m, GEMV_BLOCK_N, max(32, GEMV_BLOCK_PRODUCTS // (block_m * GEMV_BLOCK_N))


def fp8_gemv_triton(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The weight-only product for a few rows (any count; efficient for one or two)."""
    _check_layout(x, weight, scale)
    num_rows, out_features, in_features = x.shape[0], weight.shape[0], weight.shape[1]
    out = torch.empty((num_rows, out_features), dtype=x.dtype, device=x.device)
    if num_rows == 0:
        return out
    block_m, block_n, block_k = _gemv_blocks(num_rows)
    _fp8_gemv_kernel[(triton.cdiv(out_features, block_n),)](
        x, weight, scale, bias if bias is not None else scale, out,
        num_rows, out_features, in_features, x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=GEMV_NUM_WARPS, num_stages=GEMV_NUM_STAGES,
    )  # fmt: skip
    return out


def fp8_scaled_mm_triton(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The tensor-core path: per-token FP8 activations, `torch._scaled_mm` with row scales."""
    num_rows = x.shape[0]
    padded = num_rows + (-num_rows % _ROW_MULTIPLE)
    x_fp8, x_scale = quantize_rows_triton(x, padded)
    out = torch._scaled_mm(
        x_fp8,
        weight.t(),  # [in, out], column-major, as the FP8 GEMM wants it
        scale_a=x_scale,
        scale_b=scale.view(1, -1),
        out_dtype=x.dtype,
    )
    if padded != num_rows:
        out = out[:num_rows]
    return out if bias is None else out + bias


GEMV_FALLBACKS: dict[str, GemvFn] = {
    "onepass": fp8_gemv_triton,  # type: ignore[dict-item]  # always given a scale
    "tensor-core": fp8_scaled_mm_triton,  # type: ignore[dict-item]
}
"""What the split-K GEMV's configs are timed against per shape; the first is the reference
their outputs must agree with."""


def linear_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ weight.T + bias of a plain weight (scale None) or an FP8 one: the references."""
    if scale is None:
        return dense_linear_ref(x, weight, bias)
    return fp8_linear_ref(x, weight, scale, bias)


def linear_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`linear_ref` by the kernels: `dense_linear_triton` or `fp8_linear_triton`."""
    if scale is None:
        return dense_linear_triton(x, weight, bias)
    return fp8_linear_triton(x, weight, scale, bias)


def fp8_linear_triton(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    _check_layout(x, weight, scale)
    num_rows = x.shape[0]
    if num_rows == 0:
        return torch.empty((0, weight.shape[0]), dtype=x.dtype, device=x.device)
    legacy = gemv.MODE == "legacy" and num_rows > ONEPASS_MAX_ROWS
    if num_rows <= GEMV_MAX_ROWS and not legacy:
        return gemv_plan(x, weight, scale, bias, GEMV_FALLBACKS).fn(x, weight, scale, bias)
    return fp8_scaled_mm_triton(x, weight, scale, bias)


def _check_layout(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> None:
    check(x.dim() == 2 and x.stride(-1) == 1, "fp8_linear: x must be [num_tokens, in] contiguous")
    check(weight.dtype == FP8 and weight.dim() == 2, "fp8_linear: weight must be [out, in] e4m3")
    check(weight.stride(-1) == 1, "fp8_linear: weight rows must be contiguous")
    out_features, in_features = weight.shape
    check(x.shape[1] == in_features, f"fp8_linear: x has {x.shape[1]} columns, weight {in_features}")
    check(scale.shape == (out_features,) and scale.dtype == torch.float32,
          "fp8_linear: scale must be [out] float32")  # fmt: skip
