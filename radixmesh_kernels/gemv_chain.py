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

A forward takes the chain when every projection's per-shape plan (`gemv.gemv_plan`) is a
split-K configuration (never where cuBLAS or the tensor-core path was chosen as faster),
each fused launch with its projection's chosen configuration, and, in the default "auto"
mode, where the chain measured faster than the unfused ops on this device: at the first
eager forward of a row-count bucket, four layers of the model's own first-layer weights
run both ways, each captured in a CUDA graph (as decode steps run), and the chain is kept
for the bucket where its output agrees and it was faster by MIN_GAIN or more
(`GemvChain.decisions` lists them). A first
form of the chain, which formed each activation once per weight row, ran bf16 batch 1 at
6.05 ms a token against 5.74 ms unfused on an H100 (bench/RESULTS.md): what the timing is
there to catch. RADIXMESH_GEMV_FUSION (read at import): auto (the default), on (untimed,
wherever the plans allow; also fuses `silu_mul_linear` regardless), or off (neither).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import torch

from radixmesh_kernels import gemv
from radixmesh_kernels._triton import interpreting
from radixmesh_kernels.fp8_linear import linear_triton
from radixmesh_kernels.gemv import GemvConfig, decided_plan
from radixmesh_kernels.rmsnorm import rmsnorm_triton
from radixmesh_kernels.tuning import cuda_time_us, fastest, graphed, within

MODES = ("auto", "on", "off")
FUSION = os.environ.get("RADIXMESH_GEMV_FUSION", "auto")
if FUSION not in MODES:
    raise ValueError(f"RADIXMESH_GEMV_FUSION must be one of {', '.join(MODES)}, got {FUSION!r}")
TIMED_LAYERS = 4
"""Layers each way in the chain's timing: their weights (the first layer's, again) are far
past the L2, as a step's are."""
MIN_GAIN = 0.02
"""The chain is kept where its timing beat the unfused ops by this share or more. On an
H100 a 0.5% win in the four-layer timing (627 against 630 us, bf16 batch 1) came with a
whole decode step no faster (5.73 ms with the chain, 5.74 without; 5.81 with it forced
on), and the chain rounds differently from the unfused ops: a win inside the noise keeps
them (bench/RESULTS.md)."""


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


@dataclass(frozen=True, slots=True)
class ChainLayer:
    """A decoder layer as the chain takes it: its four projections and two norms' weights."""

    qkv: Projection
    o_proj: Projection
    gate_up: Projection
    down: Projection
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    signature: tuple = field(init=False, compare=False)
    """What a decision depends on: the device, and each projection's shape, dtype and bias."""

    def __post_init__(self) -> None:
        projections = (self.qkv, self.o_proj, self.gate_up, self.down)
        shapes = tuple((tuple(p.weight.shape), p.weight.dtype, p.bias is not None) for p in projections)
        object.__setattr__(self, "signature", (self.qkv.weight.device, shapes))

    @property
    def hidden(self) -> int:
        return self.o_proj.weight.shape[0]


@dataclass(frozen=True, slots=True)
class ChainDecision:
    """A row-count bucket's choice: the plan (None: the unfused ops), and why."""

    plan: ChainPlan | None
    reason: str
    timings_us: tuple[tuple[str, float], ...] = ()


class GemvChain:
    """The op set's chain (`Ops.gemv_chain`): `plan` says whether a forward of `num_rows`
    rows takes it; `norm_linear` and `linear_residual` are its two fused launches."""

    max_rows = gemv.MAX_ROWS

    def __init__(self) -> None:
        self._decisions: dict[tuple, ChainDecision] = {}
        self._lock = threading.Lock()

    def plan(
        self, num_rows: int, dtype: torch.dtype, layer: ChainLayer, eps: float
    ) -> ChainPlan | None:
        """The configurations, if a forward of `num_rows` rows takes the chain (module
        docstring): decided at the bucket's first call outside a graph capture, then a
        lookup."""
        if FUSION == "off" or not 1 <= num_rows <= self.max_rows:
            return None
        device = layer.qkv.weight.device
        if FUSION == "auto" and (device.type != "cuda" or interpreting()):
            return None  # "auto" times on a GPU only
        key = (FUSION, 1 << (num_rows - 1).bit_length(), dtype, layer.signature)
        decision = self._decisions.get(key)
        if decision is None:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return None
            with self._lock:
                decision = self._decisions.get(key)
                if decision is None:
                    decision = _decision(num_rows, dtype, layer, eps)
                    if decision is None:  # "on" before the plans are tuned: asked again
                        return None
                    # the row statistics' workspace, before any graph capture takes the chain
                    gemv.Workspace.rows(device, layer.hidden)
                    self._decisions[key] = decision
        return decision.plan

    def decisions(self) -> list[dict]:
        """Each bucket decided so far: its rows, the choice, why, and the timings."""
        return [
            {"rows": key[1], "mode": key[0], "chain": d.plan is not None, "reason": d.reason,
             "timings_us": dict(d.timings_us)}
            for key, d in self._decisions.items()
        ]  # fmt: skip

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


def _configs(num_rows: int, dtype: torch.dtype, layer: ChainLayer) -> ChainPlan | None:
    """Each projection's split-K configuration, or None (a plan undecided, or not split-K)."""
    device = layer.qkv.weight.device
    configs = []
    for proj, gated in ((layer.qkv, False), (layer.o_proj, False), (layer.gate_up, False),
                        (layer.down, True)):  # fmt: skip
        if proj.scale is None and proj.weight.dtype != dtype:
            return None
        plan = decided_plan(device, num_rows, dtype, proj.weight, proj.bias is not None, gated)
        if plan is None or plan.config is None:
            return None
        configs.append(plan.config)
    return ChainPlan(*configs)


def _linear(x: torch.Tensor, proj: Projection) -> torch.Tensor:
    return linear_triton(x, proj.weight, proj.scale, proj.bias)


def _decision(
    num_rows: int, dtype: torch.dtype, layer: ChainLayer, eps: float
) -> ChainDecision | None:
    """"on": the plans' configurations, untimed (None while a plan is undecided); "auto":
    `_decide`."""
    if FUSION == "on":
        plan = _configs(num_rows, dtype, layer)
        return None if plan is None else ChainDecision(plan, "on: untimed")
    return _decide(num_rows, dtype, layer, eps)


def _decide(num_rows: int, dtype: torch.dtype, layer: ChainLayer, eps: float) -> ChainDecision:
    """Times TIMED_LAYERS layers' projections and norms both ways in CUDA graphs; the chain
    where it is faster and its output agrees with the unfused ops'. Never raises: a failure
    keeps the unfused ops, with its reason."""
    try:
        return _time_both_ways(num_rows, dtype, layer, eps)
    except Exception as exc:  # never worse than the unfused ops
        return ChainDecision(None, f"timing failed: {type(exc).__name__}: {exc}")


def _time_both_ways(
    num_rows: int, dtype: torch.dtype, layer: ChainLayer, eps: float
) -> ChainDecision:
    from radixmesh_kernels.silu_mul_linear import silu_mul_linear_triton  # it imports this module

    device = layer.qkv.weight.device
    gen = torch.Generator(device=device).manual_seed(num_rows)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device).to(dtype)

    hidden = layer.hidden
    attn, h0, res0 = randn(num_rows, layer.o_proj.weight.shape[1]), randn(num_rows, hidden), randn(num_rows, hidden)
    # the projections' plans decided on these inputs' shapes (each op tunes its own)
    normed, residual = rmsnorm_triton(h0, layer.input_norm, eps, res0)
    _linear(normed, layer.qkv)
    _linear(attn, layer.o_proj)
    silu_mul_linear_triton(_linear(normed, layer.gate_up), layer.down.weight, layer.down.scale)
    plan = _configs(num_rows, dtype, layer)
    if plan is None:
        return ChainDecision(None, "a projection's plan is not a split-K configuration")
    rstd0 = torch.rsqrt(residual.float().pow(2).mean(-1) + eps)

    def unfused() -> torch.Tensor:
        h, res = h0, res0
        for _ in range(TIMED_LAYERS):
            normed, res = rmsnorm_triton(h, layer.input_norm, eps, res)
            _linear(normed, layer.qkv)
            h = _linear(attn, layer.o_proj)
            normed, res = rmsnorm_triton(h, layer.post_norm, eps, res)
            gate_up = _linear(normed, layer.gate_up)
            h = silu_mul_linear_triton(gate_up, layer.down.weight, layer.down.scale, layer.down.bias)
        return h + res

    def chained() -> torch.Tensor:
        res, rstd = residual, rstd0
        for _ in range(TIMED_LAYERS):
            GemvChain.norm_linear(res, rstd, layer.input_norm, layer.qkv, plan.qkv)
            res, rstd = GemvChain.linear_residual(attn, layer.o_proj, res, eps, plan.o_proj)
            gate_up = GemvChain.norm_linear(res, rstd, layer.post_norm, layer.gate_up, plan.gate_up)
            res, rstd = GemvChain.linear_residual(gate_up, layer.down, res, eps, plan.down, True)
        return res

    runs = {"unfused": graphed(unfused), "chain": graphed(chained)}
    best = fastest(runs, lambda fn: cuda_time_us(fn, iters=9, warmups=2), within(3e-2, 1e-3))
    if "chain" in dict(best.dropped):
        return ChainDecision(None, dict(best.dropped)["chain"], best.timings_us)
    keep, why = chain_pays(dict(best.timings_us))
    return ChainDecision(plan if keep else None, why, best.timings_us)


def chain_pays(timings_us: dict[str, float]) -> tuple[bool, str]:
    """Whether the timed chain is kept: only where it beat the unfused ops by MIN_GAIN or
    more (a tie, or a win inside the timing's noise, keeps the unfused ops), with the reason."""
    chain, unfused = timings_us["chain"], timings_us["unfused"]
    if chain <= unfused * (1 - MIN_GAIN):
        return True, f"faster than the unfused ops by {MIN_GAIN:.0%} or more"
    if chain < unfused:
        return False, f"faster than the unfused ops by less than {MIN_GAIN:.0%}"
    return False, "the unfused ops were as fast or faster"
