"""FP8 linear weights: compressed-tensors float8 checkpoints, or bf16 weights quantized at load.

A quantized projection keeps its weight as `float8_e4m3fn` [out, in] with one float32
scale per output row. A checkpoint's per-tensor scale is spread over that tensor's rows,
so the fused q/k/v and gate/up matrices keep each part's own scale and every product is
one matrix call.

The product is the `fp8_linear` op of `kernels` (`radixmesh_kernels/fp8_linear.py`): on CUDA a
weight-only GEMV for decode-sized batches and the FP8 tensor cores (per-token activation
scales) above that; the torch reference dequantizes the weight and calls `F.linear`.

    weight = quantize_weight(bf16_weight)          # per output row
    y = linear(x, weight, bias, ops)               # Fp8Weight or a plain tensor
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from radixmesh.errors import InvalidArgument
from radixmesh_kernels import Ops
from radixmesh_kernels.gemv_chain import Projection
from services.executor.core.config import QUANTIZATIONS

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
_MIN_SCALE = 1e-12


@dataclass(slots=True)
class Fp8Weight:
    """A linear layer's weight in FP8: `weight` [out, in] float8_e4m3fn, `scale` [out] float32."""

    weight: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    def __getitem__(self, rows: slice) -> Fp8Weight:
        """The rows `rows` of the weight and their scales (views, for loading fused parts)."""
        return Fp8Weight(self.weight[rows], self.scale[rows])


Weight = torch.Tensor | Fp8Weight


def empty_fp8(rows: int, cols: int, device: torch.device) -> Fp8Weight:
    return Fp8Weight(
        torch.empty(rows, cols, dtype=FP8, device=device),
        torch.empty(rows, dtype=torch.float32, device=device),
    )


def quantize_weight(weight: torch.Tensor) -> Fp8Weight:
    """Symmetric per-output-row FP8: each row scaled so its largest magnitude maps to 448."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=_MIN_SCALE) / FP8_MAX
    return Fp8Weight((w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale)


def dequantize(weight: Fp8Weight, dtype: torch.dtype) -> torch.Tensor:
    return (weight.weight.float() * weight.scale[:, None]).to(dtype)


def linear(
    x: torch.Tensor, weight: Weight, bias: torch.Tensor | None, ops: Ops
) -> torch.Tensor:
    """x @ weight.T (+ bias), for a plain weight (`ops.linear`) or an FP8 one
    (`ops.fp8_linear`)."""
    if isinstance(weight, torch.Tensor):
        return ops.linear(x, weight, bias)
    return ops.fp8_linear(x, weight.weight, weight.scale, bias)


def projection(weight: Weight, bias: torch.Tensor | None = None) -> Projection:
    """A projection's tensors as the GEMV chain takes them (radixmesh_kernels/gemv_chain.py)."""
    if isinstance(weight, torch.Tensor):
        return Projection(weight, None, bias)
    return Projection(weight.weight, weight.scale, bias)


def silu_mul_linear(x: torch.Tensor, weight: Weight, ops: Ops) -> torch.Tensor:
    """silu(gate) * up of x = [gate | up], then @ weight.T: one op where the set fuses them
    (`ops.silu_mul_linear`), else `ops.silu_and_mul` and `linear`."""
    if ops.silu_mul_linear is None:
        return linear(ops.silu_and_mul(x), weight, None, ops)
    down = projection(weight)
    return ops.silu_mul_linear(x, down.weight, down.scale)


@dataclass(frozen=True, slots=True)
class CheckpointQuantization:
    """How a checkpoint's linear weights are stored, read from its `quantization_config`."""

    method: str
    """"fp8" (float8_e4m3fn weights with float32 scales) or "none"."""
    weight_strategy: str = "tensor"
    """"tensor" (one scale per weight) or "channel" (one per output row)."""


NO_QUANTIZATION = CheckpointQuantization("none")


def read_checkpoint_quantization(config: dict[str, Any]) -> CheckpointQuantization:
    """The checkpoint's format; raises InvalidArgument naming what is not supported.

    Supported: compressed-tensors `float-quantized` checkpoints with 8-bit float weights,
    symmetric, per-tensor or per-channel scales (the FP8 Llama 3.1 releases' format), with
    only `lm_head` left unquantized. Activation settings are read and checked but
    activations are always quantized dynamically per token, which is at least as exact as
    a static scale.
    """
    qc = config.get("quantization_config")
    if not qc:
        return NO_QUANTIZATION
    where = "config.json: quantization_config"
    method = qc.get("quant_method")
    if method != "compressed-tensors":
        raise InvalidArgument(
            f"{where}.quant_method {method!r} is not supported (supported: compressed-tensors "
            "with float8 weights)"
        )
    fmt = qc.get("format", "float-quantized")
    if fmt not in ("float-quantized", "naive-quantized"):
        raise InvalidArgument(f"{where}.format {fmt!r} is not supported (float-quantized)")
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise InvalidArgument(
            f"{where}.config_groups: exactly one group is supported, got {len(groups)}"
        )
    name, group = next(iter(groups.items()))
    gwhere = f"{where}.config_groups.{name}"
    targets = group.get("targets") or []
    if "Linear" not in targets:
        raise InvalidArgument(f"{gwhere}.targets must include 'Linear', got {targets!r}")
    weights = group.get("weights") or {}
    for key, want in (("num_bits", 8), ("type", "float"), ("symmetric", True)):
        if weights.get(key, want) != want:
            raise InvalidArgument(
                f"{gwhere}.weights.{key} must be {want!r}, got {weights.get(key)!r}"
            )
    strategy = weights.get("strategy", "tensor")
    if strategy not in ("tensor", "channel"):
        raise InvalidArgument(
            f"{gwhere}.weights.strategy {strategy!r} is not supported (tensor, channel)"
        )
    acts = group.get("input_activations")
    if acts is not None:
        for key, want in (("num_bits", 8), ("type", "float")):
            if acts.get(key, want) != want:
                raise InvalidArgument(
                    f"{gwhere}.input_activations.{key} must be {want!r}, got {acts.get(key)!r}"
                )
    lm_head = ("lm_head", "re:.*lm_head")
    ignored = [entry for entry in qc.get("ignore") or [] if entry not in lm_head]
    if ignored:
        raise InvalidArgument(
            f"{where}.ignore: only lm_head may stay unquantized, got {ignored[:4]!r}"
        )
    return CheckpointQuantization("fp8", strategy)


def resolve_quantization(requested: str, checkpoint: CheckpointQuantization) -> str:
    """The weights' format in memory: "fp8" or "none"."""
    if requested not in QUANTIZATIONS:
        raise InvalidArgument(
            f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {requested!r}"
        )
    return checkpoint.method if requested == "auto" else requested
