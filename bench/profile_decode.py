"""Where a decode step's time goes: the executor core's steps under the torch profiler.

    python bench/profile_decode.py --model /tmp/llama8b --batch-sizes 1 64 --json out.json

For each batch size, the core (loaded once, CUDA graphs on) runs a prefill of
--prompt-len tokens per sequence, then greedy decode steps driven directly
through `ExecutorCore.step`:
- wall time per step (CUDA-synchronised by the step itself, which reads the
  sampled tokens back), median over --steps steps;
- the device kernels of --profile-steps steps, grouped by what they do
  (matrix products, attention, norms, rotary, KV store, activation, sampling,
  the rest), as time per step, kernel launches per step and share of the
  device's busy time; the device's busy time against the step's wall time
  is the share lost to host work and launch gaps;
- the matrix products' achieved bandwidth: the weight bytes each step must
  read over the time the matrix kernels took, against --copy-gbps (the
  measured copy bandwidth; bench/ceilings.py) when given.

Kernels replayed from a CUDA graph reach the profiler on current CUDA/CUPTI;
if none does, the report says so and the device busy time is missing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from radixmesh.sampling import SamplingParams
from radixmesh.step import NewSequence, RunningSequence, StepPlan
from services.common.profiling import group_of
from services.executor.core.config import ExecutorConfig
from services.executor.core.executor import ExecutorCore


class Driver:
    """Plans for `batch` sequences on one core: a prefill step, then decode steps."""

    def __init__(self, core: ExecutorCore, batch: int, prompt_len: int, max_steps: int) -> None:
        self.core, self.batch = core, batch
        page_size = core.info.page_size
        pages_per_seq = -(-(prompt_len + max_steps + 1) // page_size)
        if batch * pages_per_seq > core.info.num_pages:
            raise SystemExit(f"batch {batch}: the pool holds {core.info.num_pages} pages")
        gen = torch.Generator().manual_seed(batch)
        vocab = core.info.vocab_size
        self.req_ids = [f"b{batch}-{i}" for i in range(batch)]
        self.new = [
            NewSequence(
                req_id=req_id,
                token_ids=torch.randint(vocab // 4, vocab, (prompt_len,), generator=gen).tolist(),
                num_prompt_tokens=prompt_len,
                num_computed_tokens=0,
                num_scheduled_tokens=prompt_len,
                page_ids=list(range(i * pages_per_seq, (i + 1) * pages_per_seq)),
                sampling=SamplingParams(max_tokens=max_steps + 2, temperature=0.0, ignore_eos=True),
            )
            for i, req_id in enumerate(self.req_ids)
        ]
        self.step_id = 0

    def plan(self, new: bool = False) -> StepPlan:
        self.step_id += 1
        if new:
            return StepPlan(self.step_id, new_seqs=self.new)
        running = [RunningSequence(r, 1) for r in self.req_ids]
        return StepPlan(self.step_id, running_seqs=running)

    def step(self, plan: StepPlan) -> None:
        result = self.core.step(plan)
        if plan.running_seqs and len(result.outputs) != self.batch:
            raise RuntimeError(f"step {plan.step_id}: {len(result.outputs)} outputs")

    def finish(self) -> None:
        self.core.step(StepPlan(self.step_id + 1, finished_req_ids=self.req_ids))


def profile_batch(
    core: ExecutorCore, args: argparse.Namespace, batch: int, step_bytes: int
) -> dict:
    warm, steps, prof_steps = 5, args.steps, args.profile_steps
    driver = Driver(core, batch, args.prompt_len, warm + steps + prof_steps)
    driver.step(driver.plan(new=True))
    for _ in range(warm):
        driver.step(driver.plan())
    walls = []
    for _ in range(steps):
        plan = driver.plan()
        start = time.perf_counter()
        driver.step(plan)
        walls.append(time.perf_counter() - start)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if core.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    plans = [driver.plan() for _ in range(prof_steps)]
    with torch.profiler.profile(activities=activities) as prof:
        for plan in plans:
            driver.step(plan)  # reads the sampled tokens back: the device is done
    driver.finish()

    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])  # name -> [us, count]
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name][0] += event.device_time
            kernels[event.name][1] += 1
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, (us, count) in kernels.items():
        g = groups[group_of(name)]
        g[0] += us / prof_steps
        g[1] += count / prof_steps
    busy_us = sum(us for us, _ in groups.values())
    wall_ms = statistics.median(walls) * 1e3
    report = {
        "batch": batch,
        "step_wall_ms_p50": round(wall_ms, 3),
        "step_wall_ms_min": round(min(walls) * 1e3, 3),
        "device_busy_ms_per_step": round(busy_us / 1e3, 3) if busy_us else None,
        "kernels_per_step": round(sum(c for _, c in groups.values()), 1),
        "groups": {
            g: {
                "us_per_step": round(us, 1),
                "kernels_per_step": round(count, 1),
                "share_of_busy": round(us / busy_us, 3) if busy_us else None,
            }
            for g, (us, count) in sorted(groups.items(), key=lambda kv: -kv[1][0])
        },
        "top_kernels": [
            {
                "name": name[:120],
                "us_per_step": round(us / prof_steps, 1),
                "per_step": round(count / prof_steps, 1),
            }
            for name, (us, count) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:15]
        ],
    }
    matmul_us = groups["matrix products"][0] if "matrix products" in groups else 0.0
    if matmul_us:
        gbps = step_bytes / (matmul_us * 1e-6) / 1e9
        report["matmul_weight_gbps"] = round(gbps, 1)
        if args.copy_gbps:
            report["matmul_share_of_copy_bw"] = round(gbps / args.copy_gbps, 3)
    return report


def print_report(report: dict) -> None:
    b, wall, busy = report["batch"], report["step_wall_ms_p50"], report["device_busy_ms_per_step"]
    print(f"\n### batch {b}: step {wall:.3f} ms (min {report['step_wall_ms_min']:.3f}), ", end="")
    if busy:
        print(f"device busy {busy:.3f} ms ({100 * busy / wall:.1f}% of the step), ", end="")
    else:
        print("no device kernels reached the profiler, ", end="")
    print(f"{report['kernels_per_step']:.0f} kernels per step")
    if "matmul_weight_gbps" in report:
        share = report.get("matmul_share_of_copy_bw")
        extra = f", {share:.3f} of copy bandwidth" if share else ""
        print(f"matrix products read the weights at {report['matmul_weight_gbps']:.0f} GB/s{extra}")
    print("\n| group | us / step | kernels / step | share of busy |")
    print("| --- | ---: | ---: | ---: |")
    for g, row in report["groups"].items():
        share = row["share_of_busy"]
        share_text = "-" if share is None else f"{100 * share:.1f}%"
        print(f"| {g} | {row['us_per_step']:.1f} | {row['kernels_per_step']:.1f} | {share_text} |")
    print("\ntop kernels:")
    for k in report["top_kernels"]:
        print(f"  {k['us_per_step']:>9.1f} us  x{k['per_step']:<5} {k['name']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model folder")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=50, help="timed decode steps")
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--copy-gbps", type=float, default=0.0, help="measured copy bandwidth")
    parser.add_argument("--num-pages", type=int, default=8192)
    parser.add_argument("--quantization", default="auto", choices=("auto", "none", "fp8"))
    parser.add_argument("--json", help="write the reports here")
    args = parser.parse_args()
    if not torch.cuda.is_available() and args.device.startswith("cuda"):
        raise SystemExit("profile_decode needs a CUDA device (or --device cpu for a smoke run)")
    for name in ("batch_sizes", "prompt_len", "steps", "profile_steps", "num_pages"):
        values = getattr(args, name)
        if any(v < 1 for v in (values if isinstance(values, list) else [values])):
            parser.error(f"--{name.replace('_', '-')} must be >= 1")

    start = time.perf_counter()
    core = ExecutorCore(
        ExecutorConfig(
            model_path=args.model,
            device=args.device,
            num_pages=args.num_pages,
            quantization=args.quantization,
            max_num_seqs=max(args.batch_sizes),
            max_num_batched_tokens=max(8192, max(args.batch_sizes) * args.prompt_len),
        )
    )
    step_bytes = core.model.weights.decode_read_bytes()
    print(
        f"loaded in {time.perf_counter() - start:.1f} s; "
        f"weights read per decode step: {step_bytes / 1e9:.2f} GB"
    )
    reports = []
    for batch in args.batch_sizes:
        report = profile_batch(core, args, batch, step_bytes)
        report["weight_bytes_per_step"] = step_bytes
        print_report(report)
        reports.append(report)
    core.shutdown()
    from radixmesh_kernels import gemv

    for plan in gemv.chosen_plans():  # the GEMV's choice per shape at batch 1-2
        print(f"gemv {plan['weight']} rows={plan['rows']} {plan['out']}x{plan['in']}: {plan['chosen']} "
              f"(us, cold L2: {json.dumps(plan['timings_us'])})")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=2) + "\n")


if __name__ == "__main__":
    main()
