"""The scheduler core's own cost per step: planning and result handling, no model.

    python bench/scheduler_core.py --num-requests 256 --prompt-len 512 --output-len 128
    python bench/scheduler_core.py --in-flight 1000 --max-num-seqs 512 --num-requests 20000 \
        --prompt-len 87 --output-len 32      # the request rate the core alone sustains

A null executor answers every plan at once with one token per sampling
sequence (no forward pass), over the real cache core, so the time per step is
what the scheduler adds to each step on a real executor. Compare it with a
decode step of the model (4 to 40 ms for an 8B model on an H200).

With --in-flight N the load is closed-loop, as `radixmesh bench --concurrency N` offers
it: N requests are submitted at the start and each one that finishes is replaced by a
new one until --num-requests were sent; the report is the requests per second the core
sustains, with --max-num-seqs running and the rest waiting (the `rps` step's short
requests are 87 prompt tokens and 32 output tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mesh.engine.ports import InProcessCache
from radixmesh.errors import ResourceExhausted
from radixmesh.executor_info import ExecutorInfo
from radixmesh.sampling import SamplingParams
from radixmesh.step import RunningSequence, SequenceOutput, StepPlan, StepResult
from services.cache.core import CacheCore
from services.common.gc_policy import tune_gc
from services.scheduler.core import SchedulerConfig, SchedulerCore, StepUpdates


class NullExecutor:
    """Answers a plan with token 7 for every sequence that reaches its end; keeps lengths."""

    def __init__(self, info: ExecutorInfo) -> None:
        self._info = info
        self._plans: collections.deque[StepPlan] = collections.deque()
        self._seqs: dict[str, list[int]] = {}  # req_id -> [num_known, num_computed, max_tokens]
        self.num_steps = 0

    @property
    def info(self) -> ExecutorInfo:
        return self._info

    def submit(self, plan: StepPlan) -> None:
        self._plans.append(plan)
        # a multi-step plan: its later steps decode each sequence still running
        decodes = [RunningSequence(r.req_id, 1) for r in plan.running_seqs]
        self._plans.extend(
            StepPlan(plan.step_id, running_seqs=decodes) for _ in range(plan.num_steps - 1)
        )

    async def next_result(self) -> StepResult:
        await asyncio.sleep(0)
        plan = self._plans.popleft()
        self.num_steps += 1
        for req_id in plan.finished_req_ids:
            self._seqs.pop(req_id, None)
        work = []
        for new in plan.new_seqs:
            num_generated = len(new.token_ids) - new.num_prompt_tokens  # a resumed sequence
            max_tokens = (new.sampling.max_tokens or 0) - num_generated
            state = [len(new.token_ids), new.num_computed_tokens, max_tokens]
            self._seqs[new.req_id] = state
            work.append(
                (new.req_id, new.num_scheduled_tokens, len(new.token_ids) - new.num_prompt_tokens)
            )
        for run in plan.running_seqs:
            if run.req_id in self._seqs:
                work.append((run.req_id, run.num_scheduled_tokens, None))
        outputs = []
        for req_id, n, _ in work:
            state = self._seqs[req_id]
            state[1] += n
            if state[1] < state[0]:
                outputs.append(SequenceOutput(req_id, None))
                continue
            state[0] += 1
            state[2] -= 1
            done = state[2] <= 0
            if done:
                del self._seqs[req_id]
            outputs.append(SequenceOutput(req_id, 7, None, "length" if done else None))
        return StepResult(plan.step_id, outputs)

    async def close(self) -> None:
        pass


async def bench(args: argparse.Namespace) -> None:
    page_size = 16
    num_seqs = args.max_num_seqs or args.num_requests
    in_flight = args.in_flight or args.num_requests
    num_pages = min(in_flight, num_seqs) * ((args.prompt_len + args.output_len) // page_size + 8)
    cache = CacheCore()
    cache.register_pool("null-0", "null", num_pages, page_size)
    executor = NullExecutor(ExecutorInfo("null-0", "null", page_size, num_pages, 1 << 20, 1 << 20))
    remaining = args.num_requests
    done = asyncio.Event()
    replace: asyncio.Queue[int] = asyncio.Queue()
    step_times: list[float] = []
    last = [time.perf_counter()]

    def ended(n: int) -> None:
        nonlocal remaining
        remaining -= n
        if remaining == 0:
            done.set()

    def sink(batch: StepUpdates) -> None:
        now = time.perf_counter()
        step_times.append(now - last[0])
        last[0] = now
        finished = sum(1 for u in batch.updates if u.finished)
        if finished:
            ended(finished)
            replace.put_nowait(finished)

    config = SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=num_seqs
    )
    core = SchedulerCore(config, InProcessCache(cache), [executor], sink)
    rng = random.Random(0)
    sampling = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    sent = refused = 0

    async def submit(n: int) -> None:
        nonlocal sent, refused
        for _ in range(min(n, args.num_requests - sent)):
            prompt = [rng.randrange(10, 30000) for _ in range(args.prompt_len)]
            sent += 1
            try:
                await core.submit(f"r{sent}", prompt, sampling)
            except ResourceExhausted:  # overload refused at once: counted, not replaced
                refused += 1
                ended(1)

    async def refill() -> None:
        while sent < args.num_requests:
            await submit(await replace.get())

    await submit(in_flight)
    tune_gc()  # as the scheduler service does once its startup is over
    start = time.perf_counter()
    last[0] = start
    await core.start()
    feeder = asyncio.create_task(refill())
    await done.wait()
    seconds = time.perf_counter() - start
    feeder.cancel()
    await core.stop()
    decode = step_times[len(step_times) // 4 :]  # past admission: full-batch decode steps
    print(
        f"requests {args.num_requests}  in flight {in_flight}  running at most {num_seqs}  "
        f"prompt {args.prompt_len}  output {args.output_len}  refused {refused}"
    )
    print(
        f"steps {executor.num_steps}  total {seconds:.3f} s  per step "
        f"{seconds / executor.num_steps * 1e3:.3f} ms  requests/s "
        f"{(args.num_requests - refused) / seconds:.1f}"
    )
    print(
        f"step p50 past the first quarter {statistics.median(decode) * 1e3:.3f} ms  "
        f"max {max(decode) * 1e3:.3f} ms"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--in-flight", type=int, default=0, help="closed loop: requests in flight")
    p.add_argument("--max-num-seqs", type=int, default=0, help="running batch (0: every request)")
    asyncio.run(bench(p.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
