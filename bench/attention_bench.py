"""Attention paths side by side: decode one-launch against split + merge over contexts, and
prefill (paged kernel, each dense-K/V configuration, the per-shape choice as the executor's
start-up makes it for every bucket, with the seconds it took) against torch SDPA's cuDNN
backend.

- decode: batch 1, 8 and 64 at contexts 128 .. 8192 (32 query / 8 KV heads, head_dim 128,
  bf16, page size 16, the page table exactly as wide as the context), each path timed as
  a replayed CUDA graph (as the executor runs decode); per batch, the longest context at
  which the one-launch path is still at least as fast: what `SINGLE_PASS_MAX_CONTEXT`
  (radixmesh_kernels/paged_decode_attention.py) should be;
- packed: steps of few new tokens a sequence (decodes beside short prompts, verification,
  a select's choices) through the paged kernel one head a program and with the group's
  heads packed in one tile, at the 8B and 1B shapes;
- prefill: one 4,096-token causal prompt (and a 1,024 one, and a 2,048-token extend over
  a 2,048-token paged prefix, which SDPA has no row for), TFLOP/s of causal work against
  SDPA cuDNN on the same tensors (target >= 0.85), and each kernel's host time per call
  (the device kept busy so no call waits), with a cProfile of the per-shape choice's calls.

Every timed kernel is first checked against its torch reference. `--quick` runs tiny
shapes (through Triton's interpreter without a GPU) to check that the script works.

    python bench/attention_bench.py [--quick] [--json attention.json]
    python bench/attention_bench.py --sections packed     # some sections only
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from kernel_bench import Shape, copy_bandwidth, paged_kv, sdpa_ms, time_ms
from torch.nn.attention import SDPBackend

from radixmesh_kernels import paged_decode_attention as pda
from radixmesh_kernels import prefill_attention
from radixmesh_kernels._triton import num_multiprocessors
from radixmesh_kernels.dense_prefill_attention import DenseConfig, dense_prefill_attention
from radixmesh_kernels.paged_attention import (
    gather_kv,
    packs_by_default,
    paged_attention_ref,
    paged_attention_triton,
)

PREFILL_TARGET = 0.85  # of SDPA cuDNN


def _decode_args(batch: int, context: int, shape: Shape, device: torch.device):
    k_cache, v_cache, page_table = paged_kv([context] * batch, shape, device, seed=context + batch)
    q = torch.randn((batch, shape.num_heads, shape.head_dim), device=device).to(shape.dtype)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return (q, k_cache, v_cache, page_table, lens, shape.head_dim**-0.5)


def decode_sweep(
    batches: list[int], contexts: list[int], shape: Shape, bandwidth: float,
    device: torch.device, quick: bool,
) -> list[dict]:  # fmt: skip
    rows = []
    for batch in batches:
        for context in contexts:
            args = _decode_args(batch, context, shape, device)
            ref = pda.paged_decode_attention_ref(*args)
            # the split path as the default would size it with no one-launch threshold
            saved, pda.SINGLE_PASS_MAX_CONTEXT = pda.SINGLE_PASS_MAX_CONTEXT, 0
            try:
                splits = pda.default_num_splits(
                    batch, shape.num_kv_heads, args[3].shape[1] * shape.page_size,
                    num_multiprocessors(device),
                )  # fmt: skip
            finally:
                pda.SINGLE_PASS_MAX_CONTEXT = saved
            row = {"batch": batch, "context": context, "split_count": splits}
            elem = torch.finfo(shape.dtype).bits // 8
            kv_bytes = 2 * batch * context * shape.num_kv_heads * shape.head_dim * elem
            for path, n in (("single", 1), ("split", max(splits, 2))):
                out = pda.paged_decode_attention_triton(*args, num_splits=n)
                torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
                ms = time_ms(
                    lambda n=n, a=args: pda.paged_decode_attention_triton(*a, num_splits=n),
                    device, quick, graph=True,
                )  # fmt: skip
                row[f"{path}_us"] = round(ms * 1e3, 2)
                row[f"{path}_of_copy"] = round(kv_bytes / ms / 1e6 / bandwidth, 3)
            row["split_used"] = max(splits, 2)
            rows.append(row)
            print(
                f"decode b={batch:<3} ctx={context:<5} one-launch {row['single_us']:>8.2f} us   "
                f"split x{row['split_used']:<3} + merge {row['split_us']:>8.2f} us"
            )
            del args, ref
    return rows


def crossover(rows: list[dict]) -> dict[int, int | None]:
    """Per batch, the longest context up to which the one-launch path is never slower."""
    best: dict[int, int | None] = {}
    for batch in sorted({r["batch"] for r in rows}):
        best[batch] = None
        for r in sorted((r for r in rows if r["batch"] == batch), key=lambda r: r["context"]):
            if r["single_us"] > r["split_us"]:
                break
            best[batch] = r["context"]
    return best


def _paged_args(pairs: list[tuple[int, int]], shape: Shape, device: torch.device, seed: int) -> tuple:
    """`paged_attention_triton`'s arguments for sequences of (new tokens, cached prefix):
    random queries over paged keys and values."""
    q_lens = [q for q, _ in pairs]
    seq_lens = [q + prefix for q, prefix in pairs]
    k_cache, v_cache, page_table = paged_kv(seq_lens, shape, device, seed=seed)
    q = torch.randn((sum(q_lens), shape.num_heads, shape.head_dim), device=device).to(shape.dtype)
    cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    return (q, k_cache, v_cache, page_table, cu, lens, shape.head_dim**-0.5)


def _prefill_case(q_len: int, prefix: int, shape: Shape, device: torch.device):
    seq_len = q_len + prefix
    args = _paged_args([(q_len, prefix)], shape, device, seed=seq_len)
    _, k_cache, v_cache, page_table = args[:4]
    k_new = gather_kv(k_cache, page_table[0], seq_len)[prefix:].contiguous()
    v_new = gather_kv(v_cache, page_table[0], seq_len)[prefix:].contiguous()
    return args, k_new, v_new


def host_us(fn, device: torch.device, calls: int = 200) -> float:
    """Host microseconds per call of `fn` with the device kept busy (a sleep queued first), so
    no call waits on the device: what a call costs the thread that launches it."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda._sleep(int(2e9))  # about a second of device time ahead of the calls
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.synchronize()
    return elapsed / calls * 1e6


def host_profile(fn, device: torch.device, calls: int = 200, top: int = 12) -> list[str]:
    """cProfile of `calls` calls (device kept busy as in host_us): the functions with the most
    own time, as `own us per call  name`."""
    import cProfile
    import pstats

    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda._sleep(int(2e9))
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    if device.type == "cuda":
        torch.cuda.synchronize()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [
        f"{tt / calls * 1e6:8.2f} us  {Path(file).name}:{line} {name}"
        for (file, line, name), (_cc, _nc, tt, _ct, _callers) in rows
    ]


def prefill_rows(
    q_len: int, prefix: int, shape: Shape, device: torch.device, quick: bool
) -> list[dict]:
    args, k_new, v_new = _prefill_case(q_len, prefix, shape, device)
    ref = paged_attention_ref(*args)
    # causal work: each query attends its prefix and the new tokens up to itself
    flops = 4 * shape.head_dim * shape.num_heads * q_len * (prefix + (q_len + 1) / 2)
    name = f"prefill {q_len}" + (f" over {prefix}" if prefix else "")
    candidates: dict[str, object] = {
        "paged": lambda: paged_attention_triton(*args, max_q_len=q_len)
    }
    configs = [DenseConfig(32, 16)] if quick else list(prefill_attention.DENSE_CANDIDATES)
    for cfg in configs:
        candidates[cfg.describe()] = (
            lambda cfg=cfg: dense_prefill_attention(*args, k_new, v_new, q_len, cfg)
        )
    prefill_attention.reset_plans()
    if device.type == "cuda":  # as the executor's start-up decides: every bucket up to q_len
        start = time.perf_counter()
        shape_class = prefill_attention.ShapeClass(
            args[0].device, shape.dtype, shape.num_heads, shape.num_kv_heads, shape.head_dim,
            shape.page_size,
        )  # fmt: skip
        buckets = prefill_attention.startup_buckets(q_len)
        prefill_attention.decide_plans(shape_class, buckets)
        print(f"  {name}: prefill_attention_choice over buckets {list(buckets)} took "
              f"{time.perf_counter() - start:.1f} s")  # fmt: skip
    candidates["auto"] = lambda: prefill_attention.prefill_attention_triton(
        *args, max_q_len=q_len, k_new=k_new, v_new=v_new
    )
    rows = []
    for label, fn in candidates.items():
        try:
            torch.testing.assert_close(fn(), ref, atol=2e-2, rtol=2e-2)  # type: ignore[operator]
            ms = time_ms(fn, device, quick)  # type: ignore[arg-type]
        except Exception as exc:  # a configuration this device cannot run: reported, skipped
            print(f"  {name} {label}: failed ({type(exc).__name__}: {str(exc)[:200]})")
            continue
        host = round(host_us(fn, device, 2 if quick else 200), 1)
        rows.append({"case": name, "kernel": label, "ms": ms, "host_us": host,
                     "tflops": round(flops / ms / 1e9, 1)})  # fmt: skip
    print(f"  {name}: host time per call of 'auto', by function (own time):")
    for line in host_profile(candidates["auto"], device, 2 if quick else 200):
        print(f"    {line}")
    for plan in prefill_attention.chosen_plans():
        print(f"  {name}: bucket {plan['max_q_len_bucket']} chose {plan['chosen']!r} from "
              f"{plan['timings_us']}")
    if prefix == 0:  # SDPA on the same tensors, [1, heads, seq, head_dim]
        def dense(t: torch.Tensor) -> torch.Tensor:
            return t.transpose(0, 1).unsqueeze(0).contiguous()

        sdpa = (dense(args[0]), dense(k_new), dense(v_new))
        backends = {"sdpa cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa flash": SDPBackend.FLASH_ATTENTION}
        for label, backend in backends.items():
            ms = sdpa_ms(*sdpa, args[6], quick, backend) if device.type == "cuda" else None
            if ms is None and label == "sdpa cudnn":
                ms = sdpa_ms(*sdpa, args[6], quick)  # the default dispatch stands in
                label = "sdpa default"
            if ms is not None:
                rows.append({"case": name, "kernel": label, "ms": ms,
                             "tflops": round(flops / ms / 1e9, 1)})  # fmt: skip
    ref_row = next((r for r in rows if r["kernel"].startswith("sdpa c")), None) or next(
        (r for r in rows if r["kernel"] == "sdpa default"), None
    )
    for r in rows:
        r["of_sdpa"] = round(ref_row["ms"] / r["ms"], 3) if ref_row else None
        host = f"{r['host_us']:>10.1f} us host" if "host_us" in r else " " * 16
        print(f"{name:<24}{r['kernel']:<34}{r['ms']:>9.3f} ms{r['tflops']:>9.1f} TFLOP/s{host}"
              f"   {r['of_sdpa'] if r['of_sdpa'] is not None else '-'} of SDPA")  # fmt: skip
    return rows


SECTIONS = ("decode", "packed", "prefill")
"""The parts `--sections` picks from, in the order they run."""

PACKED_CASES: dict[str, list[tuple[int, int]]] = {
    # (new tokens, cached prefix) per sequence
    "mixed: 240 decodes + 10 prompts of 64": [(1, 96)] * 240 + [(64, 0)] * 10,
    "mixed: 64 decodes + 2 chunks of 128": [(1, 700)] * 64 + [(128, 512)] * 2,
    "verify b1: 5 over 512": [(5, 512)],
    "verify b4: 5 over 512": [(5, 512)] * 4,
    "verify b8: 5 over 512": [(5, 512)] * 8,
    "verify b64: 5 over 512": [(5, 512)] * 64,
    "select: 20 choices of 24 over 400": [(24, 400)] * 20,
    "extend: 16 of 16 over 1024": [(16, 1024)] * 16,
}
"""Steps of few new tokens a sequence, as the executor runs them through the paged prefill
kernel: a request-rate step (decodes beside short prompts), chunked prefill beside decodes,
verification of 4 draft tokens, a select's choices, short extends of long contexts."""

QUICK_PACKED_CASES: dict[str, list[tuple[int, int]]] = {
    "mixed": [(1, 20)] * 6 + [(9, 0)] * 2,
    "verify": [(5, 33)] * 2,
}


def packed_rows(shape: Shape, device: torch.device, quick: bool) -> list[dict]:
    """Each case through the paged kernel one head a program (its tuned tiles) and packed
    (the group's heads in one tile), both checked against the reference, timed as
    replayed CUDA graphs (the device's time, not the launch's)."""
    rows = []
    for name, pairs in (QUICK_PACKED_CASES if quick else PACKED_CASES).items():
        q_lens = [q for q, _ in pairs]
        num_tokens = sum(q_lens)
        args = _paged_args(pairs, shape, device, seed=len(pairs))
        ref = paged_attention_ref(*args)
        row: dict = {"case": name, "num_seqs": len(pairs), "num_tokens": num_tokens}
        for label, packed in (("unpacked", False), ("packed", True)):
            fn = functools.partial(
                paged_attention_triton, *args, max_q_len=max(q_lens), pack_gqa=packed
            )

            torch.testing.assert_close(fn(), ref, atol=2e-2, rtol=2e-2)
            row[f"{label}_us"] = round(time_ms(fn, device, quick, graph=True) * 1e3, 2)
        row["packed_speedup"] = round(row["unpacked_us"] / row["packed_us"], 3)
        row["auto_packs"] = packs_by_default(max(q_lens), len(pairs) * shape.num_heads, device)
        rows.append(row)
        print(f"packed {name:<40} unpacked {row['unpacked_us']:>9.2f} us   packed "
              f"{row['packed_us']:>9.2f} us   x{row['packed_speedup']}"
              f"   auto: {'packed' if row['auto_packs'] else 'unpacked'}")  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes; checks the script runs")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS),
        help="which parts to run (default: all)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.quick:
        parser.error("the full benchmark needs a CUDA device; use --quick for a CPU smoke run")
    torch.manual_seed(0)
    if args.quick:
        shape = Shape(num_heads=4, num_kv_heads=2, head_dim=32, page_size=16, dtype=torch.float32)
        batches, contexts, prefills = [1, 2], [16, 40], [(48, 0), (24, 20)]
        packed_shapes = {"tiny": shape}
    else:
        shape = Shape(num_heads=32, num_kv_heads=8, head_dim=128, page_size=16, dtype=torch.bfloat16)
        batches = [1, 8, 64]
        contexts = [128, 256, 512, 1024, 2048, 4096, 8192]
        prefills = [(4096, 0), (1024, 0), (2048, 2048)]
        packed_shapes = {  # the bench models' attention: 8B and 1B shapes
            "8b": shape,
            "1b": Shape(num_heads=32, num_kv_heads=8, head_dim=64, page_size=16, dtype=torch.bfloat16),
        }
    sections = set(args.sections)
    bandwidth = copy_bandwidth(device, args.quick)
    print(f"copy bandwidth {bandwidth:,.0f} GB/s; SINGLE_PASS_MAX_CONTEXT now {pda.SINGLE_PASS_MAX_CONTEXT}")
    decode = decode_sweep(batches, contexts, shape, bandwidth, device, args.quick) if "decode" in sections else []
    cross = crossover(decode)
    for batch, context in cross.items():
        print(f"decode b={batch}: one launch is at least as fast up to context {context}")
    packed = {
        label: packed_rows(packed_shape, device, args.quick)
        for label, packed_shape in packed_shapes.items()
        if "packed" in sections
    }
    prefill = [
        r
        for q_len, prefix in prefills
        if "prefill" in sections
        for r in prefill_rows(q_len, prefix, shape, device, args.quick)
    ]
    main_case = f"prefill {prefills[0][0]}"
    ours = [r for r in prefill if r["case"] == main_case and not r["kernel"].startswith("sdpa")]
    best = min(ours, key=lambda r: r["ms"]) if ours else None
    auto = next((r for r in ours if r["kernel"] == "auto"), None)
    report = {
        "decode": decode,
        "decode_single_pass_max_context": {str(b): c for b, c in cross.items()},
        "prefill": prefill,
        "packed": packed,
        "prefill_target_of_sdpa": PREFILL_TARGET,
        "prefill_best": best,
        "prefill_auto": auto,
        "bandwidth_gbps": round(bandwidth, 1),
    }
    if best is not None:
        print(f"{main_case}: best {best['kernel']!r} {best['tflops']} TFLOP/s = {best['of_sdpa']} "
              f"of SDPA cuDNN (target {PREFILL_TARGET}); per-shape choice {auto and auto['of_sdpa']}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
