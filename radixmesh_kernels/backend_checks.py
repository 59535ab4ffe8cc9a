"""Startup checks of kernel backends: each op against its torch reference on random inputs.

For every op a case builder draws seeded inputs of odd shapes (head dim 80,
lengths that are not multiples of a page, GQA) and names the arguments the op
writes in place. The candidate and the reference each run on their own copies;
their results and written arguments must agree within the dtype's tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from radixmesh_kernels.rotary import rope_cos_sin_cache


@dataclass(slots=True)
class Case:
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    written: tuple[int, ...] = ()
    """Indexes of the arguments the op writes in place (compared after the call)."""


def _dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return (2e-2, 2e-2) if dtype in (torch.bfloat16, torch.float16) else (1e-4, 1e-4)


def _rmsnorm(device: torch.device, gen: torch.Generator) -> list[Case]:
    dt = _dtype(device)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device, dt)

    x, weight, residual = rand(7, 80), 1.0 + 0.1 * rand(80), rand(7, 80)
    return [Case((x, weight, 1e-6)), Case((x, weight, 1e-6, residual))]


def _rotary(device: torch.device, gen: torch.Generator) -> list[Case]:
    dt = _dtype(device)
    positions = torch.randint(0, 40, (5,), generator=gen).to(device)
    cache = rope_cos_sin_cache(80, 48, 10000.0).to(device)
    q = torch.randn(5, 4, 80, generator=gen).to(device, dt)
    k = torch.randn(5, 2, 80, generator=gen).to(device, dt)
    return [Case((q, k, positions, cache))]


def _silu_and_mul(device: torch.device, gen: torch.Generator) -> list[Case]:
    return [Case((torch.randn(6, 2 * 96, generator=gen).to(device, _dtype(device)),))]


def _paged_kv(device: torch.device, gen: torch.Generator, num_pages: int = 12):
    dt = _dtype(device)
    k_cache = torch.randn(num_pages, 4, 2, 80, generator=gen).to(device, dt)
    v_cache = torch.randn(num_pages, 4, 2, 80, generator=gen).to(device, dt)
    return k_cache, v_cache


def _kv_store(device: torch.device, gen: torch.Generator) -> list[Case]:
    dt = _dtype(device)
    k_cache, v_cache = _paged_kv(device, gen)
    k = torch.randn(9, 2, 80, generator=gen).to(device, dt)
    v = torch.randn(9, 2, 80, generator=gen).to(device, dt)
    slots = torch.randperm(k_cache.shape[0] * 4, generator=gen)[:9].to(device)
    return [Case((k, v, k_cache, v_cache, slots), written=(2, 3))]


def _copy_kv_slots(device: torch.device, gen: torch.Generator) -> list[Case]:
    k_cache, v_cache = _paged_kv(device, gen)
    slots = torch.randperm(k_cache.shape[0] * 4, generator=gen)[:10].to(device)
    return [Case((k_cache, v_cache, slots[:5], slots[5:]), written=(0, 1))]


def _rotary_kv_store(device: torch.device, gen: torch.Generator) -> list[Case]:
    dt = _dtype(device)
    k_cache, v_cache = _paged_kv(device, gen)
    positions = torch.randint(0, 40, (5,), generator=gen).to(device)
    cache = rope_cos_sin_cache(80, 48, 10000.0).to(device)
    q = torch.randn(5, 4, 80, generator=gen).to(device, dt)
    k = torch.randn(5, 2, 80, generator=gen).to(device, dt)
    v = torch.randn(5, 2, 80, generator=gen).to(device, dt)
    slots = torch.randperm(k_cache.shape[0] * 4, generator=gen)[:5].to(device)
    slots[3] = -1  # a padding row: not stored
    args = (q, k, v, positions, cache, k_cache, v_cache, slots)
    return [Case(args, written=(5, 6))]


def _page_table(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32).to(device)


def _paged_attention(device: torch.device, gen: torch.Generator) -> list[Case]:
    """Two sequences: an extend of 5 tokens over 6 cached, a prefill of 7 (page size 4)."""
    k_cache, v_cache = _paged_kv(device, gen)
    q = torch.randn(12, 8, 80, generator=gen).to(device, _dtype(device))
    page_table = _page_table([[3, 7, 1], [5, 0]], device)
    cu_seqlens = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    seq_lens = torch.tensor([11, 7], dtype=torch.int32, device=device)
    args = (q, k_cache, v_cache, page_table, cu_seqlens, seq_lens, 80**-0.5)
    return [Case(args), Case(args, {"sliding_window": 4})]


def _paged_decode_attention(device: torch.device, gen: torch.Generator) -> list[Case]:
    k_cache, v_cache = _paged_kv(device, gen)
    q = torch.randn(3, 8, 80, generator=gen).to(device, _dtype(device))
    page_table = _page_table([[2, 9, 4], [6], [11, 8]], device)
    seq_lens = torch.tensor([10, 3, 8], dtype=torch.int32, device=device)
    args = (q, k_cache, v_cache, page_table, seq_lens, 80**-0.5)
    return [Case(args), Case(args, {"sliding_window": 5})]


def _apply_bitmask(device: torch.device, gen: torch.Generator) -> list[Case]:
    logits = torch.randn(3, 70, generator=gen).to(device)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 3), generator=gen, dtype=torch.int64)
    return [Case((logits, bitmask.to(torch.int32).to(device)), written=(0,))]


def _fp8_linear(device: torch.device, gen: torch.Generator) -> list[Case]:
    dt = _dtype(device)
    x = torch.randn(5, 64, generator=gen).to(device, dt)
    weight = (0.5 * torch.randn(48, 64, generator=gen)).to(torch.float8_e4m3fn).to(device)
    scale = (0.01 + torch.rand(48, generator=gen)).to(device)
    bias = torch.randn(48, generator=gen).to(device, dt)
    return [Case((x, weight, scale)), Case((x, weight, scale, bias))]


def _linear(device: torch.device, gen: torch.Generator) -> list[Case]:
    dt = _dtype(device)
    weight = torch.randn(48, 64, generator=gen).to(device, dt)
    bias = torch.randn(48, generator=gen).to(device, dt)
    cases = [Case((torch.randn(rows, 64, generator=gen).to(device, dt), weight)) for rows in (1, 2, 5)]
    return [*cases, Case((torch.randn(2, 64, generator=gen).to(device, dt), weight, bias))]


def _silu_mul_linear(device: torch.device, gen: torch.Generator) -> list[Case]:
    dt = _dtype(device)
    x = torch.randn(3, 2 * 40, generator=gen).to(device, dt)
    weight = torch.randn(24, 40, generator=gen).to(device, dt)
    fp8 = (0.5 * torch.randn(24, 40, generator=gen)).to(torch.float8_e4m3fn).to(device)
    scale = (0.01 + torch.rand(24, generator=gen)).to(device)
    bias = torch.randn(24, generator=gen).to(device, dt)
    return [Case((x, weight)), Case((x, weight, None, bias)), Case((x, fp8, scale))]


CASES: dict[str, Callable[[torch.device, torch.Generator], list[Case]]] = {
    "rmsnorm": _rmsnorm,
    "rotary": _rotary,
    "silu_and_mul": _silu_and_mul,
    "kv_store": _kv_store,
    "rotary_kv_store": _rotary_kv_store,
    "copy_kv_slots": _copy_kv_slots,
    "paged_attention": _paged_attention,
    "paged_decode_attention": _paged_decode_attention,
    "apply_bitmask": _apply_bitmask,
    "fp8_linear": _fp8_linear,
    "linear": _linear,
    "silu_mul_linear": _silu_mul_linear,
}
"""Op name -> its input cases: the ops a backend may replace."""


def _copy(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def _tensors(value: Any) -> list[torch.Tensor]:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(v)]
    raise TypeError(f"unexpected result type {type(value).__name__}")


def check(op: str, fn: Callable, reference: Callable, device: torch.device, source: str) -> None:
    """Raises KernelBackendError naming the op when `fn` disagrees with `reference`."""
    from radixmesh_kernels.backends import KernelBackendError

    build = CASES.get(op)
    if build is None:
        raise KernelBackendError(f"op {op!r} has no reference check; it cannot be replaced")
    gen = torch.Generator().manual_seed(0)
    for i, case in enumerate(build(device, gen)):
        where = f"kernel backend {source!r} for op {op!r} (case {i})"
        ref_args = tuple(_copy(a) for a in case.args)
        got_args = tuple(_copy(a) for a in case.args)
        expected = reference(*ref_args, **case.kwargs)
        try:
            got = fn(*got_args, **case.kwargs)
        except Exception as exc:
            raise KernelBackendError(f"{where} raised {type(exc).__name__}: {exc}") from None
        want = _tensors(expected) + [ref_args[j] for j in case.written]
        try:
            have = _tensors(got) + [got_args[j] for j in case.written]
        except TypeError as exc:
            raise KernelBackendError(f"{where} returned an {exc}") from None
        if len(have) != len(want):
            raise KernelBackendError(
                f"{where} returned {len(have)} tensors, the reference {len(want)}"
            )
        for a, b in zip(have, want, strict=True):
            _compare(a, b, where)


def _compare(got: torch.Tensor, want: torch.Tensor, where: str) -> None:
    from radixmesh_kernels.backends import KernelBackendError

    if got.shape != want.shape:
        raise KernelBackendError(
            f"{where} disagrees with the torch reference: shape {tuple(got.shape)}, "
            f"expected {tuple(want.shape)}"
        )
    atol, rtol = _tolerance(want.dtype)
    g, w = got.float(), want.float()
    finite = torch.isfinite(w)
    if not torch.equal(torch.isfinite(g), finite) or not torch.equal(g[~finite], w[~finite]):
        raise KernelBackendError(f"{where} disagrees with the torch reference on inf/nan entries")
    if not torch.allclose(g[finite], w[finite], atol=atol, rtol=rtol):
        worst = (g[finite] - w[finite]).abs().max().item()
        raise KernelBackendError(
            f"{where} disagrees with the torch reference: max abs error {worst:.3g} "
            f"(tolerance {atol:g} + {rtol:g} * |reference|)"
        )
