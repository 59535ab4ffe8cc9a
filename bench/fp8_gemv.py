"""The FP8 linear op at decode sizes against bf16 cuBLAS, on the Llama-3.1-8B projections.

For each projection shape and row count: time per call as a decode graph runs it (48 calls
captured in one CUDA graph, weights rotated over enough copies that none stays in L2; no
host launch cost), the weight bytes it reads per second against the
device's copy bandwidth, and the same product in bf16 through F.linear. Rows 1-2 run in
two modes: `onepass` (the one-pass GEMV alone) and `auto` (the per-shape choice of
radixmesh_kernels/gemv.py, whose tuning timings per candidate are printed after the table).
With --sweep the one-pass GEMV's block shape, warps and stages are swept and the best
setting per shape printed.

    python bench/fp8_gemv.py --copy-gbps 4266 [--sweep] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from radixmesh_kernels import fp8_linear as op
from radixmesh_kernels import gemv

SHAPES = {  # name -> (out_features, in_features) of Llama-3.1-8B
    "qkv": (6144, 4096),
    "o_proj": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
}
L2_BYTES = 64 << 20


def time_ms(fn, copies: int, iters: int = 48) -> float:
    """Per call, as a decode graph runs it: `iters` calls over the rotated weight copies
    captured in one CUDA graph (no host launch cost, none of them warm in L2), replayed."""
    for i in range(copies):  # the first call of a shape tunes it; the others warm up
        fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(iters):
            fn(i % copies)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (3 * iters)


def measure(rows: int, out_f: int, in_f: int, copy_gbps: float) -> dict:
    copies = max(2, -(-2 * L2_BYTES // (out_f * in_f)))
    w_bf16 = [torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    scale = [w.float().abs().amax(1) / 448.0 for w in w_bf16]
    w_fp8 = [(w.float() / s[:, None]).to(op.FP8) for w, s in zip(w_bf16, scale, strict=True)]
    x = torch.randn(rows, in_f, device="cuda", dtype=torch.bfloat16)
    fp8_ms = time_ms(lambda i: op.fp8_linear_triton(x, w_fp8[i], scale[i]), copies)
    bf16_ms = time_ms(lambda i: F.linear(x, w_bf16[i]), copies)
    # bf16 through the `linear` op: cuBLAS or the split-K GEMV, per shape, at 1-2 rows
    bf16_op_ms = time_ms(lambda i: gemv.dense_linear_triton(x, w_bf16[i]), copies)
    fp8_gbps = out_f * in_f / (fp8_ms * 1e-3) / 1e9
    bf16_gbps = 2 * out_f * in_f / (bf16_ms * 1e-3) / 1e9
    return {
        "rows": rows, "out": out_f, "in": in_f,
        "fp8_us": round(fp8_ms * 1e3, 2), "fp8_gbps": round(fp8_gbps, 1),
        "fp8_of_copy": round(fp8_gbps / copy_gbps, 3) if copy_gbps else None,
        "bf16_us": round(bf16_ms * 1e3, 2), "bf16_gbps": round(bf16_gbps, 1),
        "speedup": round(bf16_ms / fp8_ms, 3),
        "bf16_op_us": round(bf16_op_ms * 1e3, 2),
        "bf16_op_of_copy": round(2 * out_f * in_f / (bf16_op_ms * 1e-3) / 1e9 / copy_gbps, 3)
        if copy_gbps else None,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64])
    parser.add_argument("--copy-gbps", type=float, default=0.0)
    parser.add_argument("--sweep", action="store_true", help="sweep the GEMV's settings")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    results = []
    if args.sweep:
        gemv.MODE = "legacy"
        settings = list(itertools.product((16, 32, 64), (2048, 4096, 8192), (4, 8), (4,)))
        for name, (out_f, in_f) in SHAPES.items():
            for rows in (1, 4):
                best = None
                for block_n, products, warps, stages in settings:
                    op.GEMV_BLOCK_N, op.GEMV_BLOCK_PRODUCTS = block_n, products
                    op.GEMV_NUM_WARPS, op.GEMV_NUM_STAGES = warps, stages
                    r = measure(rows, out_f, in_f, args.copy_gbps)
                    r.update(block_n=block_n, products=products, warps=warps, stages=stages)
                    if best is None or r["fp8_us"] < best["fp8_us"]:
                        best = r
                print(f"sweep {name} rows={rows}: {json.dumps(best)}", flush=True)
                results.append({"shape": name, "sweep_best": best})
        return_settings = (16, 4096, 4, 4)
        op.GEMV_BLOCK_N, op.GEMV_BLOCK_PRODUCTS, op.GEMV_NUM_WARPS, op.GEMV_NUM_STAGES = (
            return_settings
        )
    print("| shape | rows | mode | FP8 us | FP8 GB/s | of copy | bf16 us | bf16 GB/s | speed-up "
          "| bf16 op us | bf16 op of copy |")  # fmt: skip
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, (out_f, in_f) in SHAPES.items():
        for rows in args.rows:
            modes = ("legacy", "auto") if rows <= gemv.MAX_ROWS else ("auto",)
            for mode in modes:
                gemv.MODE = mode
                r = measure(rows, out_f, in_f, args.copy_gbps)
                label = "onepass" if mode == "legacy" else mode
                results.append({"shape": name, "mode": label, **r})
                print(f"| {name} | {rows} | {label} | {r['fp8_us']} | {r['fp8_gbps']} | "
                      f"{r['fp8_of_copy']} | {r['bf16_us']} | {r['bf16_gbps']} | "
                      f"{r['speedup']} | {r['bf16_op_us']} | {r['bf16_op_of_copy']} |",
                      flush=True)  # fmt: skip
    gemv.MODE = "auto"
    plans = gemv.chosen_plans()
    for plan in plans:
        print(f"plan {plan['weight']} rows={plan['rows']} {plan['out']}x{plan['in']}: {plan['chosen']} "
              f"(tuning, us, cold L2: {json.dumps(plan['timings_us'])})", flush=True)  # fmt: skip
    results.append({"plans": plans})
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
