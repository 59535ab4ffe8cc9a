"""GEMV for decode at batch 1-8, split over K, chosen per shape on the device.

y[m] = (x[m] @ weight.T) [* scale] + bias for m < MAX_ROWS rows, weight [out, in] row-major,
either float8_e4m3fn with scale [out] float32 (the layout contract of `fp8_linear`:
weight-only quantization, the activations as they are) or in the activations' dtype
with no scale (the bf16 projections); fp32 accumulation.

`_gemv_splitk_kernel` runs a (out tiles, SPLIT_K) grid. Each program streams a BLOCK_N x
BLOCK_K tile of weight per iteration (16 contiguous bytes per thread and load, several
loads per thread in flight), widens it in registers and multiplies it with one or two
activation rows (a grid axis over row pairs, neighbours in launch order, so a tile read
for one pair serves the others from L2), keeping per-lane fp32 partial sums that are reduced once after the loop;
the row scales are applied once per output tile. With SPLIT_K > 1 each program covers a
1/SPLIT_K slice of K, writes its partial row sums to a workspace, and the last program of
a tile to arrive (a per-tile ticket counter, reset by that program) adds the slices in a
fixed order and writes the output: one launch, and the same sum whatever the arrival order.
A thread's loads of one tile are all it has in flight while it waits for them and sums
them (the loop is not software-pipelined: the loads go to registers, not shared memory);
a `prefetch` config double-buffers instead, loading the next tile before it sums this one,
so a thread keeps a tile in flight while it computes (ptxas for sm_90, 16-row configs, 1-2
activation rows: 40-72 registers plain, 62-128 prefetching, none spilled).

`gemv_plan` picks the launch for a shape: on a CUDA device, the first call of a shape
(outside graph capture) times each candidate config and the fallbacks it is given (for
FP8 the one-pass kernel and the tensor-core path, for bf16 cuBLAS) with cold L2, checks
each against the first fallback's output, and keeps the fastest that agrees; so a config
slower than what it replaces is never used. Without CUDA (the interpreter) the default
config is used, untimed (`dense_gemv` keeps F.linear there).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixmesh_kernels._triton import (
    dependent_launch,
    interpreting,
    release_dependents,
    tl,
    triton,
)
from radixmesh_kernels.gemv_tiles import add_slices, add_tile, store_rows, weight_tile
from radixmesh_kernels.tuning import cuda_time_us, fastest, within

MAX_ROWS = 8
"""Rows (decode sequences) the GEMV serves: programs take them in pairs; from 3 rows on the
tensor-core path or cuBLAS is among what each shape's choice is timed against."""
VEC_BYTES = 16
"""Bytes of weight per thread and load; the VEC = 16 / element size values are summed in
the thread each iteration."""


@triton.jit
def _gemv_splitk_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    partial_ptr,
    counter_ptr,
    residual_ptr,
    rstd_ptr,
    norm_w_ptr,
    sumsq_ptr,
    row_counter_ptr,
    num_rows,
    out_features,
    in_features,
    k_per_split,
    stride_x,
    stride_w,
    stride_out,
    eps,
    NUM_ROWS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN: tl.constexpr,
    VEC: tl.constexpr,
    PREFETCH: tl.constexpr = False,
    GATED: tl.constexpr = False,
    NORM_INPUT: tl.constexpr = False,
    ADD_RESIDUAL: tl.constexpr = False,
    BLOCK_TILES: tl.constexpr = 1,
    USE_PDL: tl.constexpr = False,
):
    # programs of one weight tile for the row pairs are neighbours in launch order, so the
    # tile comes from DRAM once and from L2 for the other pairs
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    row0 = pid_m * NUM_ROWS
    # 1, or 0 for the second row of a pair past num_rows (it reads row0 again, unstored)
    second = tl.minimum(row0 + 1, num_rows - 1) - row0
    x_row0 = x_ptr + row0.to(tl.int64) * stride_x
    x_row1 = x_row0 + second * stride_x
    rstd_row0 = rstd_ptr + row0  # NORM_INPUT's statistics (ADD_RESIDUAL writes them)
    rstd_row1 = rstd_row0 + second
    out_row0 = out_ptr + row0.to(tl.int64) * stride_out
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < out_features
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_w
    k_begin = pid_k * k_per_split
    k_end = k_begin + k_per_split
    acc0 = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
    # the activations are read through a [BLOCK_N, BLOCK_K] pointer tile (every row the
    # same, from L1), so each thread loads the VEC values of its own weights: no layout
    # conversion through shared memory in the loop
    zero_n = tl.zeros((BLOCK_N, 1), dtype=tl.int32)
    k_plain = k_begin  # where the loop that loads each tile as it sums it starts
    if USE_PDL or PREFETCH:
        # the first weight tile is read ahead: under a dependent launch while the kernel
        # ahead finishes (no kernel writes weights); the activations, and every write, only
        # after the wait
        offs_k = zero_n + (k_begin + tl.arange(0, BLOCK_K))[None, :]
        w = weight_tile(w_rows, offs_k, mask_n, in_features, EVEN)
        release_dependents(USE_PDL)
        if PREFETCH:
            # double-buffered: each tile's loads are issued before the tile ahead of it is
            # widened and summed, so a thread keeps a tile in flight while it computes
            for k0 in range(k_begin + BLOCK_K, k_end, BLOCK_K):
                offs_next = zero_n + (k0 + tl.arange(0, BLOCK_K))[None, :]
                w_next = weight_tile(w_rows, offs_next, mask_n, in_features, EVEN)
                acc0, acc1 = add_tile(
                    w, x_row0, x_row1, offs_next - BLOCK_K, k0 - BLOCK_K, in_features, acc0,
                    acc1, NUM_ROWS, BLOCK_N, BLOCK_K, EVEN, VEC, GATED, NORM_INPUT, rstd_row0,
                    rstd_row1, norm_w_ptr,
                )  # fmt: skip
                w = w_next
            k_tile = k_end - BLOCK_K
            offs_k = zero_n + (k_tile + tl.arange(0, BLOCK_K))[None, :]
            k_plain = k_end
        else:
            k_tile = k_begin
            k_plain = k_begin + BLOCK_K
        acc0, acc1 = add_tile(
            w, x_row0, x_row1, offs_k, k_tile, in_features, acc0, acc1, NUM_ROWS, BLOCK_N,
            BLOCK_K, EVEN, VEC, GATED, NORM_INPUT, rstd_row0, rstd_row1, norm_w_ptr,
        )  # fmt: skip
    for k0 in range(k_plain, k_end, BLOCK_K):
        offs_k = zero_n + (k0 + tl.arange(0, BLOCK_K))[None, :]
        w = weight_tile(w_rows, offs_k, mask_n, in_features, EVEN)
        acc0, acc1 = add_tile(
            w, x_row0, x_row1, offs_k, k0, in_features, acc0, acc1, NUM_ROWS, BLOCK_N,
            BLOCK_K, EVEN, VEC, GATED, NORM_INPUT, rstd_row0, rstd_row1, norm_w_ptr,
        )  # fmt: skip
    out0 = tl.sum(acc0, axis=1)
    out1 = tl.sum(acc1, axis=1)
    if HAS_SCALE:
        scale = tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0)
        out0 *= scale
        out1 *= scale
    mask_1 = mask_n & (second > 0)
    # ADD_RESIDUAL: the rows written are residual + the product, and the row statistics
    stats = (
        residual_ptr + row0.to(tl.int64) * stride_out, sumsq_ptr, row_counter_ptr, rstd_ptr,
        row0, second, pid_m, pid_n, out_features, eps,
    )  # fmt: skip
    if SPLIT_K == 1:
        store_rows(
            out0, out1, bias_ptr, out_row0, stride_out, offs_n, mask_n, mask_1, NUM_ROWS,
            HAS_BIAS, ADD_RESIDUAL, BLOCK_TILES, stats,
        )  # fmt: skip
    else:
        add_slices(
            out0, out1, partial_ptr, counter_ptr, bias_ptr, out_row0, stride_out, offs_n,
            mask_n, mask_1, out_features, pid_m, pid_n, pid_k, row0,
            NUM_ROWS, HAS_BIAS, SPLIT_K, BLOCK_N, ADD_RESIDUAL, BLOCK_TILES, stats,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class GemvConfig:
    """One launch of the split-K kernel."""

    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    prefetch: bool = False
    """Double-buffered: each weight tile is loaded before the one ahead of it is summed."""

    def describe(self) -> str:
        name = f"splitk n{self.block_n} k{self.block_k} s{self.split_k} w{self.num_warps}"
        return name + " prefetch" if self.prefetch else name


FP8_CANDIDATES: tuple[GemvConfig, ...] = (
    GemvConfig(16, 512, 1, 4),
    GemvConfig(16, 512, 2, 4),
    GemvConfig(16, 512, 4, 4),
    GemvConfig(32, 512, 1, 4),
    GemvConfig(32, 512, 2, 4),
    GemvConfig(8, 512, 4, 2),
    GemvConfig(64, 512, 1, 8),
    GemvConfig(16, 256, 1, 4),
    GemvConfig(16, 256, 2, 4),
    GemvConfig(16, 256, 4, 4),
    GemvConfig(16, 512, 2, 4, prefetch=True),
    GemvConfig(16, 256, 2, 4, prefetch=True),
)
"""Timed on the device for each FP8 shape: 64 or 128 bytes of weight per thread and
iteration, in 16-byte loads; split-K gives the narrow shapes (o_proj, down) several
programs per SM; the prefetching configs keep a second tile in flight."""
BF16_CANDIDATES: tuple[GemvConfig, ...] = (
    GemvConfig(16, 256, 1, 4),
    GemvConfig(16, 256, 2, 4),
    GemvConfig(16, 256, 4, 4),
    GemvConfig(32, 256, 1, 4),
    GemvConfig(32, 256, 2, 4),
    GemvConfig(64, 256, 1, 8),
    GemvConfig(16, 256, 1, 4, prefetch=True),
    GemvConfig(16, 256, 2, 4, prefetch=True),
)
"""The same per-thread bytes for 2-byte weights (8 values per 16-byte load)."""
CANDIDATES = {1: FP8_CANDIDATES, 2: BF16_CANDIDATES}
"""Weight element size -> configs timed per shape; the first is the untimed default."""
DEFAULT_CONFIG = FP8_CANDIDATES[0]


class Workspace:
    """Per (device, thread, out_features, tiling): fp32 partials and the tiles' ticket
    counters (zero between launches: the last program of a tile resets its counter).

    One per thread, so two executors stepping on one device from their own threads never
    share counters; created at the eager warm-up call that tunes the shape, so a graph
    captured after it in the same thread needs no allocation, and kept for the process's
    life, so captured pointers stay valid."""

    _lock = threading.Lock()
    _buffers: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def get(cls, device: torch.device, out_features: int, cfg: GemvConfig):
        key = (device, threading.get_ident(), out_features, cfg.split_k, cfg.block_n)
        with cls._lock:
            found = cls._buffers.get(key)
            if found is None:
                tiles = triton.cdiv(out_features, cfg.block_n) * triton.cdiv(MAX_ROWS, 2)
                partial = torch.empty(cfg.split_k * MAX_ROWS * out_features, device=device)
                counters = torch.zeros(tiles, dtype=torch.int32, device=device)
                found = cls._buffers[key] = (partial, counters)
        return found

    @classmethod
    def rows(cls, device: torch.device, out_features: int):
        """`gemv_splitk_residual`'s: per-(row, output tile) sums of squares, for the finest
        tiling (block_n 8), and the row pairs' tickets (zero between launches)."""
        key = (device, threading.get_ident(), out_features, "rows")
        with cls._lock:
            found = cls._buffers.get(key)
            if found is None:
                sumsq = torch.empty(MAX_ROWS * triton.cdiv(out_features, 8), device=device)
                tickets = torch.zeros(triton.cdiv(MAX_ROWS, 2), dtype=torch.int32, device=device)
                found = cls._buffers[key] = (sumsq, tickets)
        return found


def gemv_splitk(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    cfg: GemvConfig | None = None,
    gated: bool = False,
    norm: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The split-K kernel with `cfg` (default: the first candidate for the weight's element
    size), for 1 to MAX_ROWS rows; scale None for a plain weight (layout checked by the caller).
    `gated`: x is [rows, 2 * in] as [gate | up] and the product is silu(gate) * up @ weight.T
    (`silu_and_mul` fused into the activations' read). `norm` = (rstd [rows] fp32, weight
    [in]): x is a residual stream and the product is its RMSNorm's (`rmsnorm` fused into the
    activations' read, with the 1/rms `gemv_splitk_residual` wrote)."""
    return _launch(x, weight, scale, bias, cfg, gated, norm, None, 0.0)[0]


def gemv_splitk_residual(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    eps: float,
    cfg: GemvConfig | None = None,
    gated: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`gemv_splitk` with the residual add after it: (residual + product [rows, out], and
    1 / sqrt(mean square + eps) of each of its rows [rows] fp32): what `rmsnorm(product, w,
    eps, residual)` computes before its weight, for the next projection's `norm`."""
    if residual.shape != (x.shape[0], weight.shape[0]) or not residual.is_contiguous():
        raise ValueError(
            f"gemv: residual must be [{x.shape[0]}, {weight.shape[0]}] contiguous, "
            f"got {list(residual.shape)}"
        )
    if residual.dtype != x.dtype:
        raise ValueError(f"gemv: residual is {residual.dtype}, the activations {x.dtype}")
    out, rstd = _launch(x, weight, scale, bias, cfg, gated, None, residual, eps)
    assert rstd is not None
    return out, rstd


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    cfg: GemvConfig | None,
    gated: bool,
    norm: tuple[torch.Tensor, torch.Tensor] | None,
    residual: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if cfg is None:
        cfg = CANDIDATES[weight.element_size()][0]
    num_rows, in_features = x.shape[0], weight.shape[1]
    out_features = weight.shape[0]
    if not 1 <= num_rows <= MAX_ROWS:
        raise ValueError(f"gemv: 1 to {MAX_ROWS} rows, got {num_rows}")
    if x.shape[1] != in_features * (2 if gated else 1):
        raise ValueError(
            f"gemv: x has {x.shape[1]} columns for a weight of {in_features}"
            + (" (gated: 2 x in)" if gated else "")
        )
    if norm is not None and (gated or residual is not None):
        raise ValueError("gemv: a norm on the input goes with neither gated nor a residual")
    out = torch.empty((num_rows, out_features), dtype=x.dtype, device=x.device)
    rstd_in, norm_weight = norm if norm is not None else (out, out)
    if norm is not None and (rstd_in.shape != (num_rows,) or norm_weight.shape != (in_features,)):
        raise ValueError(f"gemv: norm needs rstd [{num_rows}] and a weight [{in_features}]")
    rstd_out, sumsq, tickets = out, out, out  # unused without a residual
    if residual is not None:
        if cfg.block_n < 8:  # the sums-of-squares workspace holds tiles of 8 rows or more
            raise ValueError(f"gemv: a residual needs block_n >= 8, got {cfg.block_n}")
        rstd_out = torch.empty(num_rows, dtype=torch.float32, device=x.device)
        sumsq, tickets = Workspace.rows(x.device, out_features)
    step = cfg.block_k * cfg.split_k
    k_per_split = triton.cdiv(in_features, step) * cfg.block_k
    even = k_per_split * cfg.split_k == in_features and out_features % cfg.block_n == 0
    if cfg.split_k > 1:
        partial, counters = Workspace.get(x.device, out_features, cfg)
    else:
        partial, counters = out, out  # unused
    per_program = 1 if num_rows == 1 else 2
    grid = (triton.cdiv(num_rows, per_program), triton.cdiv(out_features, cfg.block_n), cfg.split_k)
    _gemv_splitk_kernel[grid](
        x, weight, scale if scale is not None else out, bias if bias is not None else out, out,
        partial, counters, residual if residual is not None else out,
        rstd_out if residual is not None else rstd_in, norm_weight, sumsq, tickets,
        num_rows, out_features, in_features, k_per_split, x.stride(0), weight.stride(0),
        out.stride(0), eps, NUM_ROWS=per_program, HAS_SCALE=scale is not None,
        HAS_BIAS=bias is not None,
        SPLIT_K=cfg.split_k, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN=even,
        VEC=VEC_BYTES // weight.element_size(), PREFETCH=cfg.prefetch, GATED=gated,
        NORM_INPUT=norm is not None, ADD_RESIDUAL=residual is not None,
        BLOCK_TILES=triton.next_power_of_2(grid[1]) if residual is not None else 1,
        num_warps=cfg.num_warps,
        **dependent_launch(x.device),
    )  # fmt: skip
    return out, (rstd_out if residual is not None else None)


GemvFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None], torch.Tensor
]


@dataclass(frozen=True, slots=True)
class GemvPlan:
    """What serves one shape: `fn(x, weight, scale, bias)`, named by `name`, with the
    timings (us, cold L2) that chose it."""

    name: str
    fn: GemvFn
    timings_us: tuple[tuple[str, float], ...] = ()
    config: GemvConfig | None = None
    """The split-K configuration `fn` launches; None for a fallback (cuBLAS, ...)."""


_L2_FLUSH_BYTES = 256 << 20
_TUNE_ITERS = 9
_plans: dict[tuple, GemvPlan] = {}
_plans_lock = threading.RLock()
"""Reentrant: a gated shape's reference (`silu_and_mul`, then the plain shape's plan) tunes
the plain shape on its first, untimed, call, inside the gated shape's tuning."""
MODE = "auto"
""""auto" (time and choose per shape), "legacy" (the one-pass kernel), or "splitk"
(the default split-K config, untimed): set by benchmarks for A/B runs."""


def _time_us(fn: Callable[[], object], flush: torch.Tensor) -> float:
    return cuda_time_us(fn, iters=_TUNE_ITERS, warmups=2, flush=flush)


def _bound(
    fn: GemvFn, x: torch.Tensor, w: torch.Tensor, s: torch.Tensor | None, b: torch.Tensor | None
) -> Callable[[], torch.Tensor]:
    return lambda: fn(x, w, s, b)


def _splitk_fn(cfg: GemvConfig, gated: bool = False) -> GemvFn:
    return lambda x, w, s, b: gemv_splitk(x, w, s, b, cfg, gated)


def _tune(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    fallbacks: Mapping[str, GemvFn],
    gated: bool = False,
) -> GemvPlan:
    """Times every candidate (and the fallbacks) on this call's own inputs; the fastest
    whose output agrees with the first fallback's wins (`fastest`)."""
    options: dict[str, GemvFn] = dict(fallbacks)
    configs = {cfg.describe(): cfg for cfg in CANDIDATES[weight.element_size()]}
    for name, cfg in configs.items():
        options[name] = _splitk_fn(cfg, gated)
    try:
        flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device=x.device)
    except torch.OutOfMemoryError:  # timed with warm L2 then: still a ranking
        flush = torch.empty(1, dtype=torch.uint8, device=x.device)
    runs = {name: _bound(fn, x, weight, scale, bias) for name, fn in options.items()}
    best = fastest(runs, functools.partial(_time_us, flush=flush), within(1e-2, 1e-6))
    del flush
    return GemvPlan(best.name, options[best.name], best.timings_us, configs.get(best.name))


def gemv_plan(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    fallbacks: Mapping[str, GemvFn],
    gated: bool = False,
) -> GemvPlan:
    """The plan for this call's shape (tuned on the first call of the shape on CUDA).

    `fallbacks`: name -> function, the first being the reference a candidate must agree
    with, and what a shape first seen inside a graph capture (no timing there) gets.
    `gated`: x is [gate | up] and the candidates fuse `silu_and_mul` (`gemv_splitk`).
    """
    reference = next(iter(fallbacks.items()))
    plan = decided_plan(x.device, x.shape[0], x.dtype, weight, bias is not None, gated)
    if plan is not None:
        return plan
    if MODE == "legacy":
        return GemvPlan(*reference)
    key = _key(x.device, x.shape[0], x.dtype, weight, bias is not None, gated)
    if torch.cuda.is_current_stream_capturing():
        return GemvPlan(*reference)
    with _plans_lock:
        plan = _plans.get(key)
        if plan is None:
            try:
                plan = _tune(x, weight, scale, bias, fallbacks, gated)
            except Exception as exc:  # never worse than the reference kernel
                plan = GemvPlan(
                    f"{reference[0]} (tuning failed: {type(exc).__name__})", reference[1]
                )
            _plans[key] = plan
    return plan


def _key(
    device: torch.device, num_rows: int, dtype: torch.dtype, weight: torch.Tensor,
    has_bias: bool, gated: bool,
) -> tuple:  # fmt: skip
    # row counts share the plan of their power-of-two bucket (3 rows use 4's): the decode
    # graphs' buckets are tuned at capture, so an odd-sized eager call never tunes mid-serving
    rows = 1 << (num_rows - 1).bit_length()
    return (device, rows, weight.shape[0], weight.shape[1], dtype, weight.dtype, has_bias, gated)


def decided_plan(
    device: torch.device, num_rows: int, dtype: torch.dtype, weight: torch.Tensor,
    has_bias: bool = False, gated: bool = False,
) -> GemvPlan | None:  # fmt: skip
    """The plan of a shape if it is decided (tuned, or fixed: the default config off the
    GPU or in "splitk" mode), without tuning; None if not, and in "legacy" mode."""
    if MODE == "legacy":
        return None
    if MODE == "splitk" or device.type != "cuda" or interpreting():
        # (fp32 weights, which only the interpreter's tests chain, take bf16's tiling)
        cfg = CANDIDATES.get(weight.element_size(), BF16_CANDIDATES)[0]
        return GemvPlan(cfg.describe(), _splitk_fn(cfg, gated), config=cfg)
    return _plans.get(_key(device, num_rows, dtype, weight, has_bias, gated))


def _cublas(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    return F.linear(x, weight, bias)


DENSE_FALLBACKS: dict[str, GemvFn] = {"cublas": _cublas}


def dense_linear_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ weight.T + bias for a plain weight: the `linear` op's reference."""
    return F.linear(x, weight, bias)


def dense_linear_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.linear`, except 1 to MAX_ROWS contiguous rows on CUDA go through the per-shape choice
    between cuBLAS and the split-K GEMV (cuBLAS wherever it is as fast)."""
    gemv = (
        x.is_cuda and x.dim() == 2 and 1 <= x.shape[0] <= MAX_ROWS and x.stride(-1) == 1
        and weight.dim() == 2 and weight.stride(-1) == 1 and weight.dtype == x.dtype
        and x.shape[1] == weight.shape[1] and weight.element_size() in CANDIDATES
        and not interpreting()
    )  # fmt: skip
    if not gemv:
        return F.linear(x, weight, bias)
    return gemv_plan(x, weight, None, bias, DENSE_FALLBACKS).fn(x, weight, None, bias)


def chosen_plans() -> list[dict]:
    """Every shape tuned so far: its key, the plan's name, and the timings it chose from."""
    return [
        {
            "rows": key[1], "out": key[2], "in": key[3], "dtype": str(key[4]).removeprefix("torch."),
            "weight": str(key[5]).removeprefix("torch."), "bias": key[6], "gated": key[7],
            "chosen": plan.name,
            "timings_us": dict(plan.timings_us),
        }
        for key, plan in _plans.items()
    ]  # fmt: skip


def reset_plans() -> None:
    with _plans_lock:
        _plans.clear()
