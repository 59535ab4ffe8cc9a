"""Multi-step decode plans: steps/s and the Python time per token at k = 1, 4, 8.

    python bench/multi_step.py                       # tiny model, CPU, batch 1 and 16
    python bench/multi_step.py --device cuda --model /models/Llama-3.1-8B --steps 1 4 8

One in-process engine (scheduler and executor cores, no gRPC) decodes batches
of B requests (random prompts of --prompt-len, --output-len tokens each, EOS
ignored) with `SchedulerConfig.decode_steps_per_plan` k, set between batches
(the scheduler reads it at each plan), timed from every request's first token
to the last. Reported per (B, k), the median
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
import dataclasses
import json
import random
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
        self.generation = 0
        """Bumped by a reset."""
        """CPU time of the calling thread inside the forward (torch on one thread: all of it)."""
        self._sync = device.startswith("cuda")
        self._wrap(core.model, "forward")
        graphs = getattr(core, "_graphs", None)
        if graphs is not None:
            self._wrap(graphs, "run")

    def _wrap(self, owner, name: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start, cpu, generation = time.perf_counter(), time.thread_time(), self.generation
            out = inner(*args, **kwargs)
            if self._sync:
                import torch

                torch.cuda.synchronize()
            if generation == self.generation:  # a call begun before a reset counts for none
                self.seconds += time.perf_counter() - start
                self.cpu_seconds += time.thread_time() - cpu
            return out

        setattr(owner, name, timed)


class Probe:
    """Counters wrapped around the engine's executor core: executed steps, the step
    thread's CPU time in prepare and execute, and the forward's (ForwardTimer)."""

    def __init__(self, core, device: str) -> None:
        self.forward = ForwardTimer(core, device)
        self.steps = 0
        self.step_cpu = 0.0
        execute = core.execute

        def counted(prepared):
            generation = self.forward.generation
            result = execute(prepared)
            if generation == self.forward.generation:
                self.steps += prepared.batch is not None
            return result

        core.execute = self._cpu_timed(counted)
        core.prepare = self._cpu_timed(core.prepare)
        core.prepare_next = self._cpu_timed(core.prepare_next)

    def _cpu_timed(self, verb):
        def timed(*args):
            cpu, generation = time.thread_time(), self.forward.generation
            try:
                return verb(*args)
            finally:
                if generation == self.forward.generation:
                    self.step_cpu += time.thread_time() - cpu

        return timed

    def reset(self) -> None:
        """Count from here: calls under way now count for nothing (a few steps of the
        decode phase go unmeasured; the ratios per step and per token stay exact)."""
        self.steps, self.step_cpu = 0, 0.0
        self.forward.seconds = self.forward.cpu_seconds = 0.0
        self.forward.generation += 1


async def one_run(args: argparse.Namespace, engine, probe: Probe, batch: int, k: int, seed: int):
    """One decode batch with k steps per plan (the scheduler reads its config per plan)."""
    engine.scheduler.config = dataclasses.replace(engine.scheduler.config, decode_steps_per_plan=k)
    sampling = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    rng = random.Random(seed)
    vocab = engine.executors[0].info.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(batch)]
    streams = [await engine.generate(p, sampling) for p in prompts]
    first = await asyncio.gather(*(anext(aiter(s)) for s in streams))  # prefill done
    assert all(u.token_ids for u in first)
    probe.reset()
    start, cpu, loop_cpu = time.perf_counter(), time.process_time(), time.thread_time()
    results = await asyncio.gather(*(s.collect() for s in streams))
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu
    loop_cpu = time.thread_time() - loop_cpu  # this thread runs the event loop: the scheduler
    num_tokens = sum(len(r.token_ids) for r in results)  # the tokens after the first
    assert num_tokens == batch * (args.output_len - 1), num_tokens
    forward = probe.forward
    num_steps = args.output_len - 1  # decode steps after the first token: each gives `batch`
    counted = max(1, probe.steps)  # those begun after the reset (the per-step ratios)
    forward_s, forward_cpu_s = forward.seconds / counted, forward.cpu_seconds / counted
    return {
        "steps_per_s": num_steps / seconds,
        "output_tokens_per_s": num_tokens / seconds,
        "forward_ms_per_step": 1e3 * forward_s,
        "python_us_per_token": 1e6 * (seconds / num_steps - forward_s) / batch,
        "python_cpu_us_per_token": 1e6 * (cpu_seconds / num_steps - forward_cpu_s) / batch,
        "scheduler_cpu_us_per_token": 1e6 * loop_cpu / num_tokens,
        "executor_cpu_us_per_token": 1e6 * (probe.step_cpu / counted - forward_cpu_s) / batch,
    }


async def bench_inprocess(args: argparse.Namespace) -> list[dict]:
    max_batch = max(args.batch)
    scheduler = SchedulerConfig(max_num_seqs=max_batch, max_queue_wait_s=None)
    fields = {"device": args.device, "page_size": args.page_size, "max_num_seqs": max_batch}
    if args.num_pages:
        fields["num_pages"] = args.num_pages
    config = EngineConfig.for_model(args.model, scheduler=scheduler, **fields)
    samples: dict[tuple[int, int], list[dict]] = {}
    async with Engine(config) as engine:
        probe = Probe(engine.executors[0], args.device)
        await (await engine.generate([5, 6, 7], SamplingParams(max_tokens=8))).collect()  # warm
        seed = 0
        for _ in range(args.rounds):
            for batch in args.batch:
                for k in args.steps:
                    seed += 1
                    run = await one_run(args, engine, probe, batch, k, seed)
                    samples.setdefault((batch, k), []).append(run)
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
