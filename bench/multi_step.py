"""Multi-step decode plans: steps/s and the Python time per token at k = 1, 4, 8.

    python bench/multi_step.py                       # tiny model, CPU, batch 1 and 16
    python bench/multi_step.py --device cuda --model /models/Llama-3.1-8B --steps 1 4 8

The in-process engine (scheduler and executor cores, no gRPC) decodes a batch
of B requests (short prompts, --output-len tokens each, EOS ignored) with
`SchedulerConfig.decode_steps_per_plan` k. Reported per (B, k), the median
over --rounds rounds (the values of k alternate within a round, so machine
noise falls on all of them alike):

- steps/s: executor steps (one forward each) over the decode phase's wall time;
- output tok/s;
- forward ms/step: the model's forward alone (timed around `Decoder.forward`,
  and the CUDA graph replay, synchronised on a GPU);
- python us/token: the wall time not spent in the forward, per output token:
  the scheduler's planning and result handling, the executor's prepare,
  sampling and finish checks, and the event loop between them;
- python cpu us/token: the same as CPU time (the process's, less the forward's
  on its thread; torch runs on --num-threads 1 by default), which a loaded
  machine inflates less than wall time; split into the scheduler's (the event
  loop thread: planning, results, the updates' fan-out) and the executor's (its
  step thread in prepare and execute, less the forward: batch building,
  sampling, finish checks).

With --mode services the same batch goes through the scheduler's Stream to
an executor service over its gRPC Step stream (bench/engine.py --mode
services), reporting output tok/s and TPOT per k.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mesh.engine import Engine, EngineConfig
from radixmesh.sampling import SamplingParams
from services.common.logging import configure_logging
from services.scheduler.core import SchedulerConfig

REPO = Path(__file__).resolve().parent.parent


class ForwardTimer:
    """Wraps the core's forward entries; `seconds` sums their wall time."""

    def __init__(self, core, device: str) -> None:
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        """CPU time of the calling thread inside the forward (torch on one thread: all of it)."""
        self._sync = device.startswith("cuda")
        self._wrap(core.model, "forward")
        graphs = getattr(core, "_graphs", None)
        if graphs is not None:
            self._wrap(graphs, "run")

    def _wrap(self, owner, name: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start, cpu = time.perf_counter(), time.thread_time()
            out = inner(*args, **kwargs)
            if self._sync:
                import torch

                torch.cuda.synchronize()
            self.seconds += time.perf_counter() - start
            self.cpu_seconds += time.thread_time() - cpu
            return out

        setattr(owner, name, timed)


async def one_run(args: argparse.Namespace, batch: int, k: int) -> dict:
    scheduler = SchedulerConfig(
        max_num_seqs=max(batch, 16), decode_steps_per_plan=k, max_queue_wait_s=None
    )
    fields = {"device": args.device, "page_size": args.page_size, "max_num_seqs": max(batch, 16)}
    if args.num_pages:
        fields["num_pages"] = args.num_pages
    config = EngineConfig.for_model(args.model, scheduler=scheduler, **fields)
    async with Engine(config) as engine:
        core = engine.executors[0]
        sampling = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
        await (await engine.generate([5, 6, 7], SamplingParams(max_tokens=4))).collect()  # warm
        timer = ForwardTimer(core, args.device)
        steps = [0]
        step_cpu = [0.0]  # the step thread's CPU time in prepare and execute
        execute, prepare, prepare_next = core.execute, core.prepare, core.prepare_next

        def on_step_thread(verb):
            def timed(*a):
                cpu = time.thread_time()
                try:
                    return verb(*a)
                finally:
                    step_cpu[0] += time.thread_time() - cpu

            return timed

        def counted(prepared):
            steps[0] += prepared.batch is not None
            return execute(prepared)

        core.execute = on_step_thread(counted)
        core.prepare, core.prepare_next = on_step_thread(prepare), on_step_thread(prepare_next)
        prompts = [[3 + (i * 7 + j) % 200 for j in range(args.prompt_len)] for i in range(batch)]
        streams = [await engine.generate(p, sampling) for p in prompts]
        first = await asyncio.gather(*(anext(aiter(s)) for s in streams))  # prefill done
        assert all(u.token_ids for u in first)
        start, cpu, steps[0] = time.perf_counter(), time.process_time(), 0
        loop_cpu = time.thread_time()  # this thread runs the event loop: the scheduler core
        timer.seconds = timer.cpu_seconds = step_cpu[0] = 0.0
        results = await asyncio.gather(*(s.collect() for s in streams))
        seconds = time.perf_counter() - start
        cpu_seconds = time.process_time() - cpu
        loop_cpu = time.thread_time() - loop_cpu
    num_tokens = sum(len(r.token_ids) for r in results)  # the tokens after the first
    assert num_tokens == batch * (args.output_len - 1), num_tokens
    return {
        "steps_per_s": steps[0] / seconds,
        "output_tokens_per_s": num_tokens / seconds,
        "forward_ms_per_step": 1e3 * timer.seconds / max(1, steps[0]),
        "python_us_per_token": 1e6 * (seconds - timer.seconds) / num_tokens,
        "python_cpu_us_per_token": 1e6 * (cpu_seconds - timer.cpu_seconds) / num_tokens,
        "scheduler_cpu_us_per_token": 1e6 * loop_cpu / num_tokens,
        "executor_cpu_us_per_token": 1e6 * (step_cpu[0] - timer.cpu_seconds) / num_tokens,
    }


async def bench_inprocess(args: argparse.Namespace) -> list[dict]:
    samples: dict[tuple[int, int], list[dict]] = {}
    for _ in range(args.rounds):
        for batch in args.batch:
            for k in args.steps:
                samples.setdefault((batch, k), []).append(await one_run(args, batch, k))
    rows = []
    for (batch, k), runs in samples.items():
        row = {"mode": "inprocess", "batch": batch, "k": k}
        for key in runs[0]:
            row[key] = statistics.median(r[key] for r in runs)
        rows.append(row)
    return rows


def bench_services(args: argparse.Namespace) -> list[dict]:
    rows = []
    for batch in args.batch:
        for k in args.steps:
            cmd = [sys.executable, str(REPO / "bench/engine.py"), "--mode", "services", "--json"]
            cmd += ["--device", args.device, "--num-requests", str(batch)]
            cmd += ["--prompt-len", str(args.prompt_len), "--output-len", str(args.output_len)]
            cmd += ["--decode-steps-per-plan", str(k), "--page-size", str(args.page_size)]
            if args.model:
                cmd += ["--model", args.model]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            report = json.loads(out.strip().splitlines()[-1])
            rows.append(
                {
                    "mode": "services",
                    "batch": batch,
                    "k": k,
                    "output_tokens_per_s": report["output_tokens_per_s"],
                    "tpot_p50_ms": report["tpot_p50_ms"],
                }
            )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="model folder (default: the tiny model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    p.add_argument("--steps", type=int, nargs="+", default=[1, 4, 8], help="values of k")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--output-len", type=int, default=129)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--num-pages", type=int, default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-threads", type=int, default=1, help="torch threads (0: torch's)")
    p.add_argument("--mode", choices=("inprocess", "services", "both"), default="inprocess")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    args = p.parse_args()
    configure_logging("warning")
    if args.num_threads:
        import torch

        torch.set_num_threads(args.num_threads)
    if args.model is None:
        from mesh.tiny_model import ensure_default_model

        args.model = str(ensure_default_model())
    rows = []
    if args.mode in ("inprocess", "both"):
        rows += asyncio.run(bench_inprocess(args))
    if args.mode in ("services", "both"):
        rows += bench_services(args)
    for row in rows:
        cells = "  ".join(
            f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}"
            for key, value in row.items()
        )
        print(cells, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
