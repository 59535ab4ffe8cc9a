"""All-reduce latency of a tensor-parallel group, at the sizes one decode step reduces.

A row-parallel projection ends in one all-reduce of [batch, hidden] activations, two per
layer. This times `torch.distributed.all_reduce` over `--world-size` ranks (NCCL on CUDA
with NVLink multicast off, gloo on CPU) for each batch size, eager and (on CUDA) replayed
from a captured CUDA graph of `--layers` x 2 all-reduces, as the executor's decode graphs
replay them. Medians over `--iters`; per all-reduce and per layer.

    python bench/allreduce.py --world-size 2 --hidden 4096 --batch-sizes 1 8 64 256 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _time_eager(x: torch.Tensor, iters: int, cuda: bool) -> float:
    samples = []
    for _ in range(iters):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        dist.all_reduce(x)
        if cuda:
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def _time_graph(x: torch.Tensor, iters: int, count: int) -> float:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(count):
            dist.all_reduce(x)
    samples = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / count)
    return statistics.median(samples)


def _rank(rank: int, args: argparse.Namespace, init: str, out: str) -> None:
    cuda = args.device == "cuda"
    if cuda:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=init, rank=rank,
                            world_size=args.world_size)  # fmt: skip
    dtype = torch.bfloat16 if cuda else torch.float32
    rows = []
    for batch in args.batch_sizes:
        x = torch.ones(batch, args.hidden, dtype=dtype, device="cuda" if cuda else "cpu")
        for _ in range(5):
            dist.all_reduce(x)
        eager = _time_eager(x, args.iters, cuda)
        graph = _time_graph(x, args.iters, 2 * args.layers) if cuda else None
        rows.append({"batch_size": batch, "bytes": x.numel() * x.element_size(),
                     "eager_us": round(eager, 2), "graph_us": graph and round(graph, 2),
                     "per_layer_us": round(2 * (graph or eager), 2)})  # fmt: skip
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--hidden", type=int, default=4096, help="Llama-3.1-8B: 4096")
    p.add_argument("--layers", type=int, default=32, help="all-reduces per graph: 2 per layer")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < args.world_size:
        sys.exit(f"allreduce: {args.world_size} GPUs needed, {torch.cuda.device_count()} visible")
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rows.json")
        init = f"file://{tmp}/init"
        mp.start_processes(_rank, args=(args, init, out), nprocs=args.world_size, start_method="spawn")
        rows = json.loads(Path(out).read_text())
    for row in rows:
        print(f"batch {row['batch_size']:4d} ({row['bytes']:>9,} B): eager {row['eager_us']:8.1f} us"
              f"  graph {row['graph_us'] or '-':>8} us  per layer {row['per_layer_us']:8.1f} us")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"world_size": args.world_size, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
