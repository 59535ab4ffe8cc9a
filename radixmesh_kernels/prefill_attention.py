"""The prefill / extend attention op of the Triton set: the paged kernel, or the dense-K/V
kernel when the caller hands in the new tokens' keys and values, chosen per shape.

`prefill_attention_triton` has `paged_attention_triton`'s signature plus `k_new` / `v_new`
(the new tokens' keys and values as stored, [num_tokens, num_kv_heads, head_dim]), which a
caller passes for steps of at least `prefill_attention_triton.min_dense_q_len` new tokens in
one sequence (MIN_DENSE_Q_LEN). Without them, with a sliding window, or with a head_dim the
dense kernel does not take, it is the paged kernel.

Otherwise, on a CUDA device, a shape class (dtype, heads, head_dim, page size, and the
longest new-token count's power-of-two bucket) goes by its plan: the paged kernel or one
`DENSE_CANDIDATES` configuration. `decide_plans` makes the plans at start-up (the
executor's warm-up, every bucket of `startup_buckets`): it times the paged kernel and each
candidate on one random prompt of the bucket's length (not a call's inputs: a warm-up's
dummy batch stores every token in one page, so its cache disagrees with its dense K/V),
drops a candidate that fails to compile or disagrees with the paged kernel's output, and
keeps the fastest, so a configuration slower than the paged kernel is never used. After
it nothing is timed or compiled at a call: a bucket not decided takes the nearest decided
bucket's plan, a shape class not decided the paged kernel. A caller that never ran
`decide_plans` (a kernel benchmark) gets a shape timed on its first call instead, except
inside a CUDA graph capture (the paged kernel). The interpreter runs the dense kernel's
small configuration, untimed. RADIXMESH_PREFILL_ATTENTION=paged (or dense) fixes the choice.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixmesh_kernels._triton import check, interpreting
from radixmesh_kernels.dense_prefill_attention import (
    INTERPRETER_CONFIG,
    DenseConfig,
    dense_prefill_attention,
    dense_supported,
)
from radixmesh_kernels.paged_attention import check_window, paged_attention_triton
from radixmesh_kernels.tuning import cuda_time_us, fastest, within

MODES = ("auto", "paged", "dense")
MODE = os.environ.get("RADIXMESH_PREFILL_ATTENTION", "auto")
""""auto" (time and choose per shape), "paged" or "dense" (the first candidate, untimed):
from RADIXMESH_PREFILL_ATTENTION at import, set by benchmarks for A/B runs."""
if MODE not in MODES:
    raise ValueError(
        f"RADIXMESH_PREFILL_ATTENTION must be one of {', '.join(MODES)}, got {MODE!r}"
    )

_WS_VALUES = ("", "0", "1")
WARP_SPECIALIZE = os.environ.get("RADIXMESH_PREFILL_WARP_SPECIALIZE", "")
""""1" adds `WARP_SPECIALIZED_CANDIDATES` to what is timed (off by default: Triton 3.6's
NVGPUWarpSpecialization pass fails on this kernel on the H200, after printing the MLIR)."""
if WARP_SPECIALIZE not in _WS_VALUES:
    raise ValueError(
        f"RADIXMESH_PREFILL_WARP_SPECIALIZE must be 0 or 1 (or unset), got {WARP_SPECIALIZE!r}"
    )

WARP_SPECIALIZED_CANDIDATES: tuple[DenseConfig, ...] = (
    DenseConfig(128, 128, num_warps=8, num_stages=2, tma=True, warp_specialize=True),
    DenseConfig(128, 64, num_warps=4, num_stages=3, tma=True, warp_specialize=True),
)
DENSE_CANDIDATES: tuple[DenseConfig, ...] = (
    DenseConfig(128, 128, num_warps=8, num_stages=3, tma=True),
    DenseConfig(128, 128, num_warps=8, num_stages=2, tma=True),
    DenseConfig(128, 64, num_warps=4, num_stages=3, tma=True),
    DenseConfig(128, 64, num_warps=4, num_stages=4, tma=True),
    DenseConfig(64, 64, num_warps=4, num_stages=4, tma=True),
    DenseConfig(128, 64, num_warps=4, num_stages=3),
    DenseConfig(128, 128, num_warps=8, num_stages=2),
) + (WARP_SPECIALIZED_CANDIDATES if WARP_SPECIALIZE == "1" else ())
"""Shapes that fit Hopper's shared memory at head_dim 128 (8 warps only with 128 x 128
tiles, as Triton's own attention tutorial keeps them on Hopper); `tma` falls back to plain
loads where descriptors cannot be used, and the last two are the non-TMA controls. The
warp-specialized ones only with RADIXMESH_PREFILL_WARP_SPECIALIZE=1."""

_TUNE_ITERS = 10


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    name: str
    config: DenseConfig | None
    """None: the paged kernel."""
    timings_us: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class ShapeClass:
    """What a prefill choice is made for, with a bucket of the longest new-token count."""

    device: torch.device
    dtype: torch.dtype
    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int

    def key(self, bucket: int) -> tuple:
        return (
            self.device, self.dtype, self.num_heads, self.num_kv_heads, self.head_dim,
            self.page_size, bucket,
        )  # fmt: skip


PAGED = PrefillPlan("paged", None)
_plans: dict[tuple, PrefillPlan] = {}
_plans_lock = threading.Lock()
_decided_only = False
"""Set by `decide_plans` (the executor's start-up): from then on a call of a shape class
never times anything, it takes the decided plan of the nearest bucket, or the paged kernel."""


def _time_us(fn: Callable[[], object]) -> float:
    return cuda_time_us(fn, iters=_TUNE_ITERS, warmups=1)


@dataclass(frozen=True, slots=True)
class _Case:
    """Inputs a shape class is timed on: one prompt of `q_len` tokens from position 0 in
    shuffled pages, random values, its keys and values both in the caches and dense."""

    args: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float]
    """q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens, scale."""
    k_new: torch.Tensor
    v_new: torch.Tensor
    q_len: int

    @classmethod
    def like(cls, q: torch.Tensor, k_cache: torch.Tensor, q_len: int) -> _Case:
        _, page_size, num_kv_heads, head_dim = k_cache.shape
        return cls.build(
            ShapeClass(q.device, q.dtype, q.shape[1], num_kv_heads, head_dim, page_size), q_len
        )

    @classmethod
    def build(cls, shape: ShapeClass, q_len: int, width: int | None = None) -> _Case:
        """`width`: the page table's, padded past the prompt's pages (default: no padding)."""
        device, dtype = shape.device, shape.dtype
        page_size, num_kv_heads, head_dim = shape.page_size, shape.num_kv_heads, shape.head_dim
        gen = torch.Generator(device=device).manual_seed(q_len)
        num_pages = -(-q_len // page_size)

        def randn(*shape: int) -> torch.Tensor:
            return torch.randn(shape, generator=gen, device=device).to(dtype)

        k_new, v_new = randn(q_len, num_kv_heads, head_dim), randn(q_len, num_kv_heads, head_dim)
        pages = torch.randperm(num_pages, generator=gen, device=device).to(torch.int32)
        slots = (pages.long()[:, None] * page_size + torch.arange(page_size, device=device))
        slots = slots.flatten()[:q_len]
        caches = []
        for new in (k_new, v_new):
            cache = torch.zeros((num_pages, page_size, num_kv_heads, head_dim), dtype=dtype, device=device)
            cache.view(-1, num_kv_heads, head_dim)[slots] = new
            caches.append(cache)
        table = torch.zeros((1, max(width or 0, num_pages)), dtype=torch.int32, device=device)
        table[0, :num_pages] = pages
        lens = torch.tensor([q_len], dtype=torch.int32, device=device)
        cu = torch.tensor([0, q_len], dtype=torch.int32, device=device)
        args = (
            randn(q_len, shape.num_heads, head_dim), caches[0], caches[1], table, cu, lens,
            head_dim**-0.5,
        )  # fmt: skip
        return cls(args, k_new, v_new, q_len)

    def paged(self) -> torch.Tensor:
        return paged_attention_triton(*self.args, None, self.q_len)

    def dense(self, cfg: DenseConfig) -> torch.Tensor:
        return dense_prefill_attention(*self.args, self.k_new, self.v_new, self.q_len, cfg)


def _tune(case: _Case) -> PrefillPlan:
    """The fastest of the paged kernel and the dense candidates that agree with it."""
    configs: dict[str, DenseConfig | None] = {"paged": None}
    configs.update((cfg.describe(), cfg) for cfg in DENSE_CANDIDATES)
    runs = {
        name: case.paged if cfg is None else functools.partial(case.dense, cfg)
        for name, cfg in configs.items()
    }
    best = fastest(runs, _time_us, within(2e-2, 1e-3))
    return PrefillPlan(best.name, configs[best.name], best.timings_us)


def _decide(key: tuple, make_case: Callable[[], _Case]) -> PrefillPlan:
    with _plans_lock:
        plan = _plans.get(key)
        if plan is None:
            try:
                plan = _tune(make_case())
            except Exception as exc:  # never worse than the paged kernel
                plan = PrefillPlan(f"paged (tuning failed: {type(exc).__name__})", None)
            _plans[key] = plan
    return plan


def _nearest(key: tuple) -> PrefillPlan:
    """The decided plan of the bucket nearest `key`'s (by ratio; the larger on a tie) in
    its shape class; the paged kernel where none of the class was decided."""
    bucket = key[-1]
    decided = [(k[-1], plan) for k, plan in list(_plans.items()) if k[:-1] == key[:-1]]
    if not decided:
        return PAGED
    distance = lambda b: (abs(math.log2(b / bucket)), -b)  # noqa: E731
    return min(decided, key=lambda d: distance(d[0]))[1]


def prefill_plan(key: tuple, make_case: Callable[[], _Case]) -> PrefillPlan:
    """The plan of a shape class. After `decide_plans` (serving): the decided one, or the
    nearest bucket's, or the paged kernel, never timed. Before it (a bare kernel caller):
    tuned on the first call outside graph capture, on the inputs `make_case` builds."""
    plan = _plans.get(key)
    if plan is not None:
        return plan
    if _decided_only:
        return _nearest(key)
    if torch.cuda.is_current_stream_capturing():
        return PAGED
    return _decide(key, make_case)


def q_len_bucket(q_len: int) -> int:
    """The power-of-two bucket (16, 32, ...) of a step's longest new-token count."""
    return 1 << max(q_len - 1, 15).bit_length()


MAX_STARTUP_BUCKETS = 8
"""At most this many buckets are decided at start-up (128 .. 16,384 new tokens); a longer
step takes the largest one's plan."""


def startup_buckets(max_q_len: int) -> tuple[int, ...]:
    """The buckets a step of up to `max_q_len` new tokens in one sequence can fall in that
    the dense kernel may serve (from MIN_DENSE_Q_LEN's), at most MAX_STARTUP_BUCKETS."""
    if max_q_len < MIN_DENSE_Q_LEN:
        return ()
    first, last = q_len_bucket(MIN_DENSE_Q_LEN), q_len_bucket(max_q_len)
    count = min(last.bit_length() - first.bit_length() + 1, MAX_STARTUP_BUCKETS)
    return tuple(first << i for i in range(count))


def _other_width(bucket: int, page_size: int) -> int:
    """A page-table width of the other class than the bucket's own timing case has (a
    multiple of 16 or not: the compiler specializes the row stride on it)."""
    width = -(-bucket // page_size)
    return width + 1 if width % 16 == 0 else -(-width // 16) * 16


def decide_plans(shape: ShapeClass, buckets: tuple[int, ...]) -> dict[int, PrefillPlan]:
    """Every plan the shape class can need, made now (the start-up's work): each bucket
    timed as on a first call, then the chosen configuration run once more in the other
    integer specializations a serving call can hit (one token short, the page table's
    width of the other class), so serving compiles nothing. From
    then on no call times anything (`prefill_plan`). With RADIXMESH_PREFILL_ATTENTION
    paged or dense there is nothing to decide (empty)."""
    global _decided_only
    plans: dict[int, PrefillPlan] = {}
    if MODE == "auto":
        for bucket in buckets:
            plan = _decide(shape.key(bucket), functools.partial(_Case.build, shape, bucket))
            other = _Case.build(shape, bucket - 1, _other_width(bucket, shape.page_size))
            try:
                other.dense(plan.config) if plan.config is not None else other.paged()
            except Exception as exc:  # serve the bucket by the paged kernel instead
                plan = PrefillPlan(f"paged ({plan.name} failed: {type(exc).__name__})", None)
                _plans[shape.key(bucket)] = plan
            plans[bucket] = plan
    _decided_only = True
    return plans


def _timed_device(q: torch.Tensor) -> bool:
    """Calls on this device go by the per-shape plans (a GPU, not the interpreter)."""
    return not interpreting() and q.device.type == "cuda"


def prefill_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    max_q_len: int | None = None,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
) -> torch.Tensor:
    """`paged_attention_ref`, by the kernel chosen for the shape (module docstring)."""
    args = (q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens, scale)
    check(
        (k_new is None) == (v_new is None), "paged_attention: give both k_new and v_new or neither"
    )
    check_window("paged_attention", sliding_window)
    dense_ok = (
        k_new is not None
        and v_new is not None
        and MODE != "paged"
        and q.dim() == 3
        and k_cache.dim() == 4
        and k_cache.dtype == q.dtype  # the new K/V as the cache holds them
        and dense_supported(q, k_new, v_new, k_cache.shape[2], sliding_window)
    )
    if not dense_ok:
        return paged_attention_triton(*args, sliding_window, max_q_len)
    assert k_new is not None and v_new is not None
    num_seqs = seq_lens.shape[0]
    check(
        cu_seqlens_q.shape == (num_seqs + 1,) and cu_seqlens_q.dtype == torch.int32,
        "paged_attention: cu_seqlens_q must be [num_seqs + 1] int32",
    )
    check(seq_lens.dtype == torch.int32, "paged_attention: seq_lens must be int32")
    check(
        page_table.shape[0] >= num_seqs, "paged_attention: page_table has fewer rows than seq_lens"
    )
    if max_q_len is None:
        max_q_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) if num_seqs else 0
    q_len = max_q_len

    def dense(cfg: DenseConfig) -> torch.Tensor:
        return dense_prefill_attention(*args, k_new, v_new, q_len, cfg)

    if not _timed_device(q):
        return dense(INTERPRETER_CONFIG)
    if MODE == "dense":
        return dense(DENSE_CANDIDATES[0])
    bucket = q_len_bucket(q_len)
    key = (q.device, q.dtype, q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1], bucket)
    plan = prefill_plan(key, lambda: _Case.like(q, k_cache, bucket))
    if plan.config is None:
        return paged_attention_triton(*args, None, q_len)
    return dense(plan.config)


MIN_DENSE_Q_LEN = 128
"""Steps whose longest sequence runs fewer new tokens (verification steps, short chunks)
keep the paged kernel: a dense query tile would be mostly padding, and the caller can keep
its fused rotary + KV store. Published to callers as `prefill_attention_triton.min_dense_q_len`."""
prefill_attention_triton.min_dense_q_len = MIN_DENSE_Q_LEN  # type: ignore[attr-defined]


def chosen_plans() -> list[dict]:
    """Every shape class chosen so far: its key, the plan, and the timings it chose from."""
    return [
        {
            "dtype": str(key[1]).removeprefix("torch."), "heads": key[2], "kv_heads": key[3],
            "head_dim": key[4], "page_size": key[5], "max_q_len_bucket": key[6],
            "chosen": plan.name, "timings_us": dict(plan.timings_us),
        }
        for key, plan in _plans.items()
    ]  # fmt: skip


def reset_plans() -> None:
    """Forget every plan, and time shapes on their first call again (as before start-up)."""
    global _decided_only
    with _plans_lock:
        _plans.clear()
        _decided_only = False
