"""The executor service's host work per decode step, outside the model forward.

    python bench/executor_host.py                          # tiny model, CPU, batch 1 and 64, k 4
    python bench/executor_host.py --profile step.prof      # and a cProfile of the step thread
    python bench/executor_host.py --real-forward --device cuda --model /models/Llama-3.1-8B

The executor's servicer (`ExecutorServicer.Step`, without the gRPC transport:
plans go in as protobuf messages and results come out as the messages the
stream would send) serves one stream of plans: one that admits B sequences
(--prompt-len tokens each, pages for the whole run), then decode-only plans
of --steps-per-plan steps each, as the scheduler sends them when nothing else
changes. Everything per step is on the path: plan decoding, the pipeline, the
core's prepare and execute (plan checks, page tables, batch arrays, sampling
and its bookkeeping, finish checks), the result's protobuf, the step metrics.

By default the model's forward is replaced by fixed logits (what is left is the
host work alone, steady on a loaded machine); --real-forward runs the model and
subtracts its timed forward (synchronised on CUDA). Reported per batch size,
median over --rounds rounds, per decode step and less the forward: the wall
time, the process's CPU time, and the step thread's CPU time (on CPU every
prepare and execute runs there; the least disturbed by other processes on a
shared machine; its best round is reported too).

--profile FILE: cProfile of the step thread over one more round per batch size,
saved to FILE.b<B> and summarised as self time per step by where it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from radixmesh.sampling import SamplingParams
from radixmesh.step import NewSequence, RunningSequence, StepPlan
from radixmesh.v1 import executor_pb2
from radixmesh.wire import plan_to_proto
from services.common.logging import configure_logging
from services.executor.core.config import ExecutorConfig
from services.executor.core.executor import ExecutorCore
from services.executor.server import ExecutorServicer


class Forward:
    """The core's forward, timed (or replaced by fixed logits)."""

    def __init__(self, core: ExecutorCore, real: bool) -> None:
        self.seconds = 0.0
        self._inner = core.model.forward
        self._sync = core.device.type == "cuda"
        self._logits = None if real else torch.randn(
            core.config.max_num_seqs * 4, core.sampler.vocab_size, device=core.device
        )
        core.model.forward = self  # type: ignore[method-assign]
        core.forward.decode = core.forward.verify = None  # every forward through here

    def __call__(self, batch: Any, kv_pool: Any) -> torch.Tensor:
        if self._logits is not None:
            return self._logits[: batch.logits_indices.shape[0]]
        start = time.perf_counter()
        logits = self._inner(batch, kv_pool)
        if self._sync:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - start
        return logits


def plans(
    batch_size: int, prompt_len: int, num_plans: int, k: int, page_size: int, vocab: int, seed: int
) -> list[executor_pb2.StepPlan]:
    """The admitting plan, then `num_plans` decode plans of k steps each."""
    rng = random.Random(seed)
    total = prompt_len + num_plans * k + 2
    pages = -(-total // page_size)
    sampling = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=num_plans * k + 2)
    new = []
    for i in range(batch_size):
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        page_ids = list(range(i * pages, (i + 1) * pages))
        new.append(NewSequence(f"r{i}", prompt, prompt_len, 0, prompt_len, page_ids, sampling))
    out = [plan_to_proto(StepPlan(1, new_seqs=new))]
    for step_id in range(2, num_plans + 2):
        running = [RunningSequence(f"r{i}", 1) for i in range(batch_size)]
        out.append(plan_to_proto(StepPlan(step_id, running_seqs=running, num_steps=k)))
    return out


@dataclass(frozen=True, slots=True)
class Round:
    """One stream's decode phase: seconds outside the forward, and its decode steps."""

    wall: float
    cpu: float
    """The process's CPU time."""
    step_thread_cpu: float
    """The step thread's CPU time (prepares run there on CPU), the stream's drop included."""
    steps: int
    messages: int = 0
    """Stream messages carrying the decode steps (a message may carry several)."""


async def serve_round(
    servicer: ExecutorServicer, messages: list[executor_pb2.StepPlan], forward: Forward, k: int
) -> Round:
    """One stream of the plans."""

    async def requests() -> AsyncIterator[executor_pb2.StepPlan]:
        for msg in messages:
            yield msg

    steps = messages_sent = 0
    start = cpu = forward_start = thread_cpu = 0.0
    async for message in servicer.Step(requests(), None):  # type: ignore[arg-type]
        # steps that ended together (none from a tree before next_results)
        results = [message, *getattr(message, "next_results", ())]
        if message.step_id == 1:  # the prefill: the decode phase starts now
            start, cpu, forward_start = time.perf_counter(), time.process_time(), forward.seconds
            thread_cpu = await asyncio.wrap_future(servicer.step_thread.submit(time.thread_time))
            results = results[1:]
        steps += len(results)
        messages_sent += bool(results)
        for result in results:
            if any(out.finish_reason for out in result.outputs):
                raise RuntimeError(f"step {result.step_id}: the run ended early")
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu
    forward_seconds = forward.seconds - forward_start
    await servicer.wait_no_stream()  # the step thread's part ends with the stream's drop
    thread_cpu = await asyncio.wrap_future(servicer.step_thread.submit(time.thread_time)) - thread_cpu
    assert steps == (len(messages) - 1) * k, steps
    return Round(
        wall - forward_seconds, cpu - forward_seconds, thread_cpu - forward_seconds, steps,
        messages_sent,
    )


def where(filename: str, funcname: str) -> str:
    """A profile entry's part of the step, by its file."""
    path = filename.replace("\\", "/")
    if filename == "~":
        return f"builtin {funcname}"
    for part in ("services/", "radixmesh/", "google/protobuf/", "torch/", "concurrent/", "asyncio/"):
        if part in path:
            return path[path.index(part) :]
    return Path(path).name


def summarise(profile: cProfile.Profile, steps: int, top: int) -> list[tuple[str, float]]:
    """Self time per step (us) by file (builtins by name), largest first."""
    stats = pstats.Stats(profile)
    by_where: dict[str, float] = defaultdict(float)
    for (filename, _, funcname), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        by_where[where(filename, funcname)] += tottime
    rows = sorted(by_where.items(), key=lambda kv: -kv[1])[:top]
    return [(name, seconds / steps * 1e6) for name, seconds in rows]


async def measure(args: argparse.Namespace, model: str, batch_size: int) -> dict[str, Any]:
    config = ExecutorConfig(
        model_path=model, device=args.device, page_size=args.page_size,
        max_num_seqs=max(batch_size, 1), num_pages=None,
    )  # fmt: skip
    core = ExecutorCore(config)
    forward = Forward(core, args.real_forward)
    servicer = ExecutorServicer()
    servicer.attach(core, "bench")
    k = args.steps_per_plan
    messages = plans(
        batch_size, args.prompt_len, args.plans, k, args.page_size, core.sampler.vocab_size, 0
    )
    if core.info.num_pages * args.page_size < batch_size * (args.prompt_len + args.plans * k + 1):
        raise SystemExit(f"batch {batch_size}: the KV pool is too small for the run")
    await serve_round(servicer, messages[:3], forward, k)  # warm-up
    rounds = [await serve_round(servicer, messages, forward, k) for _ in range(args.rounds)]

    def per_step(name: str, pick: Any = statistics.median) -> float:
        return round(pick(getattr(r, name) / r.steps * 1e6 for r in rounds), 1)

    row: dict[str, Any] = {
        "batch_size": batch_size,
        "steps_per_plan": k,
        "host_us_per_step": per_step("wall"),
        "host_cpu_us_per_step": per_step("cpu"),
        "step_thread_cpu_us_per_step": per_step("step_thread_cpu"),
        "best_step_thread_cpu_us_per_step": per_step("step_thread_cpu", min),
        "steps_per_message": round(sum(r.steps for r in rounds) / sum(r.messages for r in rounds), 2),
    }
    if args.profile:
        profile = cProfile.Profile()
        servicer.step_thread.submit(profile.enable).result()
        steps = (await serve_round(servicer, messages, forward, k)).steps
        servicer.step_thread.submit(profile.disable).result()
        profile.dump_stats(f"{args.profile}.b{batch_size}")
        row["profile_us_per_step"] = [
            (name, round(us, 1)) for name, us in summarise(profile, steps, args.top)
        ]
    await servicer.close()
    return row


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    torch.set_num_threads(args.num_threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from mesh.tiny_model import write_tiny_model

            model = str(write_tiny_model(Path(tmp) / "tiny"))
        return [await measure(args, model, b) for b in args.batch_sizes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: the tiny model)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--steps-per-plan", type=int, default=4)
    parser.add_argument("--plans", type=int, default=50, help="decode plans per round")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--num-threads", type=int, default=1)
    parser.add_argument("--real-forward", action="store_true")
    parser.add_argument("--profile", default=None, help="cProfile the step thread into FILE.b<B>")
    parser.add_argument("--top", type=int, default=25, help="profile rows shown")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    configure_logging("executor-bench", "warning")
    rows = asyncio.run(main_async(args))
    for row in rows:
        print(
            f"batch {row['batch_size']:3d}, k {row['steps_per_plan']}: host "
            f"{row['host_us_per_step']:.0f} us/step, process cpu "
            f"{row['host_cpu_us_per_step']:.0f} us/step, step thread cpu "
            f"{row['step_thread_cpu_us_per_step']:.0f} us/step "
            f"(best round {row['best_step_thread_cpu_us_per_step']:.0f}), "
            f"{row['steps_per_message']:.2f} steps per stream message"
        )
        for name, us in row.get("profile_us_per_step", []):
            print(f"    {us:8.1f} us  {name}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
