"""A decoder layer's projections at decode batch sizes as a chain of split-K GEMVs that
carry the RMSNorms between them: no norm kernel between two projections.

Per layer, unfused: rmsnorm (+ residual add), qkv, attention, o_proj, rmsnorm (+ residual
add), gate_up, silu_and_mul, down. Chained:

- o_proj and down write residual + their product (`gemv.gemv_splitk_residual`) and, from
  their last output tile per row, the row's 1/rms (a fixed-order sum of per-tile sums of
  squares, so the same value whatever order the tiles finish in);
- gate_up and the next layer's qkv read that residual stream and form its RMSNorm in
  registers from the 1/rms and the norm's weight (`gemv.gemv_splitk(..., norm=...)`);
- down reads [gate | up] and forms silu(gate) * up in registers (`gated`).

So a layer is its four GEMVs, rotary + KV store and attention; the step keeps two norm
kernels (the first layer's input, the final norm). Each intermediate is rounded as the
unfused op rounds it; only the sums of squares are added in another order than `rmsnorm`'s.

A forward takes the chain when every projection's per-shape plan (`gemv.gemv_plan`,
decided on the shape's first eager call) is a split-K configuration, so the chain is never
taken where cuBLAS or the tensor-core path was chosen as faster; each fused launch uses
its projection's chosen configuration. RADIXMESH_GEMV_FUSION=on (read at import) turns the
chain and the fused `silu_mul_linear` on. Off by default: on a lent H100 (8B shape, batch 1,
bench/RESULTS.md) the chain's first form, which formed each activation once per weight row,
ran bf16 at 6.05 ms a token against 5.74 ms unfused and FP8 at 3.51 against 3.51; the form
here (each activation formed once per column, broadcast through shared memory) is not yet
timed on a GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from radixmesh_kernels import gemv
from radixmesh_kernels.gemv import GemvConfig, decided_plan

FUSION = os.environ.get("RADIXMESH_GEMV_FUSION", "off")
if FUSION not in ("on", "off"):
    raise ValueError(f"RADIXMESH_GEMV_FUSION must be on or off, got {FUSION!r}")


@dataclass(frozen=True, slots=True)
class ChainPlan:
    """Each projection's split-K configuration for one row count."""

    qkv: GemvConfig
    o_proj: GemvConfig
    gate_up: GemvConfig
    down: GemvConfig


@dataclass(frozen=True, slots=True)
class Projection:
    """A projection as the chain launches it: the weight (plain or FP8), its row scales
    (FP8) and bias."""

    weight: torch.Tensor
    scale: torch.Tensor | None = None
    bias: torch.Tensor | None = None


class GemvChain:
    """The op set's chain (`Ops.gemv_chain`): `plan` says whether a forward of `num_rows`
    rows takes it; `norm_linear` and `linear_residual` are its two fused launches."""

    max_rows = gemv.MAX_ROWS

    def plan(
        self,
        num_rows: int,
        dtype: torch.dtype,
        qkv: Projection,
        o_proj: Projection,
        gate_up: Projection,
        down: Projection,
    ) -> ChainPlan | None:
        """The configurations, if a forward of `num_rows` rows takes the chain: every
        projection's plan decided and a split-K configuration (`down`'s the gated one)."""
        if FUSION == "off" or not 1 <= num_rows <= self.max_rows:
            return None
        device = qkv.weight.device
        # the row statistics' workspace exists before any graph capture takes the chain
        # (the first forward of a shape runs eagerly, tuning its plans)
        gemv.Workspace.rows(device, o_proj.weight.shape[0])
        configs = []
        for proj, gated in ((qkv, False), (o_proj, False), (gate_up, False), (down, True)):
            if proj.scale is None and proj.weight.dtype != dtype:
                return None
            plan = decided_plan(device, num_rows, dtype, proj.weight, proj.bias is not None, gated)
            if plan is None or plan.config is None:
                return None
            configs.append(plan.config)
        return ChainPlan(*configs)

    @staticmethod
    def norm_linear(
        residual: torch.Tensor,
        rstd: torch.Tensor,
        norm_weight: torch.Tensor,
        proj: Projection,
        cfg: GemvConfig,
    ) -> torch.Tensor:
        """rmsnorm(residual) * norm_weight @ proj, the norm's 1/rms given (`rstd`)."""
        return gemv.gemv_splitk(
            residual, proj.weight, proj.scale, proj.bias, cfg, norm=(rstd, norm_weight)
        )

    @staticmethod
    def linear_residual(
        x: torch.Tensor,
        proj: Projection,
        residual: torch.Tensor,
        eps: float,
        cfg: GemvConfig,
        gated: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual + x @ proj, each row's 1/rms of it); `gated`: x is [gate | up]."""
        return gemv.gemv_splitk_residual(
            x, proj.weight, proj.scale, proj.bias, residual, eps, cfg, gated
        )


GEMV_CHAIN = GemvChain()
