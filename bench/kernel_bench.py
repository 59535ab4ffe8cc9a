"""Kernel benchmark: the Triton attention kernels against the device's own ceilings.

- decode attention (batch 64, context 4096, 32 query / 8 KV heads, head_dim 128,
  bf16, page size 16): KV bytes read per second as a fraction of the measured
  device copy bandwidth (target >= 0.7);
- prefill attention (one 4096-token causal sequence, same heads), the op as the
  executor calls it (the new tokens' K/V handed in, so the per-shape choice of
  radixmesh_kernels/prefill_attention.py serves it; the paged kernel alone is printed
  beside it): TFLOP/s as a fraction of torch's scaled_dot_product_attention on
  the same shape in the same run (target >= 0.8).

Every timed kernel is first checked against its torch reference. `--quick`
runs tiny shapes (through Triton's interpreter when there is no GPU) to check
that the script works; its numbers mean nothing.

    python bench/kernel_bench.py [--quick] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from radixmesh_kernels import paged_attention, paged_decode_attention, prefill_attention
from radixmesh_kernels._triton import (
    triton,  # first: sets up the interpreter on a machine without CUDA
)
from radixmesh_kernels.paged_attention import gather_kv, paged_attention_ref, paged_attention_triton
from radixmesh_kernels.paged_decode_attention import (
    paged_decode_attention_ref,
    paged_decode_attention_triton,
)
from radixmesh_kernels.prefill_attention import prefill_attention_triton

DECODE_TARGET = 0.7  # of copy bandwidth
PREFILL_TARGET = 0.8  # of torch SDPA


@dataclass(frozen=True, slots=True)
class Shape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype


@dataclass(slots=True)
class Row:
    name: str
    ms: float
    value: float  # GB/s or TFLOP/s
    unit: str
    ceiling: float
    ratio: float
    target: float | None


def time_ms(
    fn: Callable[[], object], device: torch.device, quick: bool, graph: bool = False
) -> float:
    """Mean milliseconds per call, by CUDA events on a GPU (graph: replayed from a
    captured CUDA graph, as the executor runs decode, so launch cost is not counted)."""
    if device.type == "cuda":
        if graph:
            try:
                return float(triton.testing.do_bench_cudagraph(fn, rep=200))
            except RuntimeError as exc:
                print(f"  (graph capture failed, timing eagerly: {exc})")
        return float(triton.testing.do_bench(fn, warmup=25, rep=200))
    fn()
    reps = 2 if quick else 10
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e3


def copy_bandwidth(device: torch.device, quick: bool) -> float:
    """Measured device copy bandwidth in GB/s (bytes read + bytes written)."""
    num_bytes = (64 << 20) if quick else (2 << 30)
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, quick)
    return 2 * num_bytes / ms / 1e6


def paged_kv(
    seq_lens: list[int], shape: Shape, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Caches holding every sequence's KV in shuffled pages, and their page table."""
    gen = torch.Generator(device=device).manual_seed(seed)
    pages_per_seq = [-(-n // shape.page_size) for n in seq_lens]
    num_pages = sum(pages_per_seq)
    cache_shape = (num_pages, shape.page_size, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.randn(cache_shape, generator=gen, device=device).to(shape.dtype)
    v_cache = torch.randn(cache_shape, generator=gen, device=device).to(shape.dtype)
    order = torch.randperm(num_pages, generator=gen, device=device).to(torch.int32)
    page_table = torch.zeros((len(seq_lens), max(pages_per_seq)), dtype=torch.int32, device=device)
    used = 0
    for b, n in enumerate(pages_per_seq):
        page_table[b, :n] = order[used : used + n]
        used += n
    return k_cache, v_cache, page_table


def bench_decode(
    batch: int,
    context: int,
    target: float | None,
    shape: Shape,
    bandwidth: float,
    device: torch.device,
    quick: bool,
) -> Row:
    seq_lens = [context] * batch
    k_cache, v_cache, page_table = paged_kv(seq_lens, shape, device, seed=batch)
    q = torch.randn((batch, shape.num_heads, shape.head_dim), device=device).to(shape.dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    scale = shape.head_dim**-0.5
    args = (q, k_cache, v_cache, page_table, lens, scale)
    torch.testing.assert_close(
        paged_decode_attention_triton(*args),
        paged_decode_attention_ref(*args),
        atol=2e-2,
        rtol=2e-2,
    )
    ms = time_ms(lambda: paged_decode_attention_triton(*args), device, quick, graph=True)
    elem = torch.finfo(shape.dtype).bits // 8
    kv_bytes = 2 * sum(seq_lens) * shape.num_kv_heads * shape.head_dim * elem
    io_bytes = 2 * q.numel() * elem + page_table.numel() * 4
    gbps = (kv_bytes + io_bytes) / ms / 1e6
    return Row(
        f"decode b={batch} ctx={context}",
        ms,
        gbps,
        "GB/s",
        bandwidth,
        gbps / bandwidth,
        target,
    )


def sdpa_ms(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, quick: bool, backend=None
) -> float | None:
    """torch SDPA on [1, heads, seq, head_dim] inputs: its default dispatch, or one
    backend (None when that backend refuses the shape)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # the flash backend wants equal head counts
    v = v.repeat_interleave(group, dim=1)

    def run() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    if backend is None:
        return time_ms(run, q.device, quick)
    try:
        with sdpa_kernel([backend]):
            return time_ms(run, q.device, quick)
    except RuntimeError:
        return None


def bench_prefill(
    seq_len: int, target: float | None, shape: Shape, device: torch.device, quick: bool
) -> Row:
    k_cache, v_cache, page_table = paged_kv([seq_len], shape, device, seed=seq_len)
    q = torch.randn((seq_len, shape.num_heads, shape.head_dim), device=device).to(shape.dtype)
    cu_seqlens_q = torch.tensor([0, seq_len], dtype=torch.int32, device=device)
    lens = torch.tensor([seq_len], dtype=torch.int32, device=device)
    scale = shape.head_dim**-0.5
    args = (q, k_cache, v_cache, page_table, cu_seqlens_q, lens, scale)
    # the op as the executor calls it: the new tokens' K/V handed in densely
    k_new = gather_kv(k_cache, page_table[0], seq_len).contiguous()
    v_new = gather_kv(v_cache, page_table[0], seq_len).contiguous()

    def served() -> torch.Tensor:
        return prefill_attention_triton(*args, max_q_len=seq_len, k_new=k_new, v_new=v_new)

    expected = paged_attention_ref(*args)
    torch.testing.assert_close(served(), expected, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(paged_attention_triton(*args), expected, atol=2e-2, rtol=2e-2)
    ms = time_ms(served, device, quick)
    paged_ms = time_ms(lambda: paged_attention_triton(*args, max_q_len=seq_len), device, quick)
    # the same tensors in SDPA's layout: [1, heads, seq, head_dim]
    num_pages = -(-seq_len // shape.page_size)
    pages = page_table[0, :num_pages].long()

    def dense(cache: torch.Tensor) -> torch.Tensor:
        return cache[pages].flatten(0, 1)[:seq_len].transpose(0, 1).unsqueeze(0).contiguous()

    sdpa_args = (q.transpose(0, 1).unsqueeze(0).contiguous(), dense(k_cache), dense(v_cache))
    peer_ms = sdpa_ms(*sdpa_args, scale, quick)
    flops = 4 * shape.head_dim * shape.num_heads * seq_len * (seq_len + 1) / 2
    tflops, peer_tflops = flops / ms / 1e9, flops / peer_ms / 1e9
    plans = prefill_attention.chosen_plans()
    print(
        f"  prefill {seq_len}: served by {plans[-1]['chosen'] if plans else 'the untimed default'!r}; "
        f"the paged kernel alone {flops / paged_ms / 1e9:,.1f} TFLOP/s"
    )
    if device.type == "cuda":  # what each SDPA backend gets on this shape, for context
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            backend_ms = sdpa_ms(*sdpa_args, scale, quick, backend)
            shown = f"{flops / backend_ms / 1e9:,.1f} TFLOP/s" if backend_ms else "unavailable"
            print(f"  sdpa {backend.name.lower():<20} prefill {seq_len}: {shown}")
    return Row(
        f"prefill causal {seq_len}",
        ms,
        tflops,
        "TFLOP/s",
        peer_tflops,
        tflops / peer_tflops,
        target,
    )


def print_header(device: torch.device, bandwidth: float) -> None:
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu"
    )
    print(f"device   {name}")
    print(
        f"versions python {platform.python_version()}  torch {torch.__version__}  triton {triton.__version__}"
    )
    if device.type == "cuda":
        print(
            f"         cuda {torch.version.cuda}  sdpa flash={torch.backends.cuda.flash_sdp_enabled()}"
        )
    print(
        f"ceiling  copy bandwidth {bandwidth:,.0f} GB/s (measured); prefill peer: torch SDPA, same run"
    )


def print_table(rows: list[Row], quick: bool) -> None:
    print(
        f"{'kernel':<26}{'ms':>10}{'achieved':>12}{'ceiling':>12}  {'unit':<8}{'ratio':>7}{'target':>8}  ok"
    )
    for r in rows:
        target = f"{r.target:.2f}" if r.target is not None else "-"
        ok = "-" if quick or r.target is None else ("yes" if r.ratio >= r.target else "NO")
        print(
            f"{r.name:<26}{r.ms:>10.3f}{r.value:>12,.1f}{r.ceiling:>12,.1f}  {r.unit:<8}{r.ratio:>7.2f}{target:>8}  {ok}"
        )


def print_tuned_configs() -> None:
    """The autotuner's pick for each attention kernel (the last shape tuned)."""
    for name, tuned in (
        ("prefill", paged_attention._paged_prefill_tuned),
        ("decode split", paged_decode_attention._decode_split_tuned),
    ):
        print(f"tuned    {name}: {getattr(tuned, 'best_config', None)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes; checks the script runs")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.quick:
        parser.error("the full benchmark needs a CUDA device; use --quick for a CPU smoke run")
    torch.manual_seed(0)
    bandwidth = copy_bandwidth(device, args.quick)
    print_header(device, bandwidth)
    if args.quick:
        shape = Shape(num_heads=4, num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float32)
        decode = [(2, 40, DECODE_TARGET)]
        prefill = [(48, PREFILL_TARGET)]
    else:  # the targets' shapes first, then context rows without a target
        shape = Shape(
            num_heads=32, num_kv_heads=8, head_dim=128, page_size=16, dtype=torch.bfloat16
        )
        decode = [(64, 4096, DECODE_TARGET), (1, 4096, None), (16, 1024, None), (256, 1024, None)]
        prefill = [(4096, PREFILL_TARGET), (1024, None)]
    rows = [bench_decode(*d, shape, bandwidth, device, args.quick) for d in decode]
    rows += [bench_prefill(*p, shape, device, args.quick) for p in prefill]
    print_table(rows, args.quick)
    if device.type == "cuda":
        print_tuned_configs()
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
