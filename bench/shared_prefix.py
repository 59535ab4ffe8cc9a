"""Prefix reuse when requests sharing a system prompt arrive together, on the scheduler and
cache cores (no model): the hit rate the requests got against the best possible.

    python bench/shared_prefix.py --concurrency 8 64 256 --executors 1 2

The shared-prefix workload of `radixmesh bench` in token ids: G groups of P
prompts, each a group's system prompt and a question of its own, in a shuffled
order, sent closed-loop at each concurrency. A timed null executor stands for
the model (each step takes a fixed cost plus a cost per scheduled token), over
the real cache core. Per run it prints:

- served: prompt tokens served from the cache at admission / prompt tokens (the
  bench report's kv_cache_hit_rate);
- best: the same if each group's shared full pages were computed once in the
  whole fleet;
- lookups: the cache's hit tokens / looked-up tokens (kv_cache_lookup_hit_rate),
  which counts routing's match on every pool at arrival as a lookup;
- TTFT p50 / p90 from submit to the first token, over every request and over the
  followers (the requests of a group after its first): what the issue's shared-prefix
  TTFT p90 measures, in the timed executor's milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scheduler_core import NullExecutor

from mesh.engine.ports import InProcessCache
from radixmesh.executor_info import ExecutorInfo
from radixmesh.sampling import SamplingParams
from radixmesh.step import StepResult
from services.cache.core import CacheCore
from services.scheduler.core import SchedulerConfig, SchedulerCore, StepUpdates


class TimedExecutor(NullExecutor):
    """A null executor whose step takes step_s plus token_s per scheduled token."""

    def __init__(self, info: ExecutorInfo, step_s: float, token_s: float) -> None:
        super().__init__(info)
        self._step_s, self._token_s = step_s, token_s

    async def next_result(self) -> StepResult:
        plan = self._plans[0]
        seqs = [*plan.new_seqs, *plan.running_seqs]
        await asyncio.sleep(self._step_s + self._token_s * sum(s.num_scheduled_tokens for s in seqs))
        return await super().next_result()


async def run(args: argparse.Namespace, concurrency: int, num_executors: int) -> dict[str, float]:
    rng = random.Random(args.seed)

    def draw(n: int) -> list[int]:
        return [rng.randrange(10, 30000) for _ in range(n)]

    systems = [draw(args.system_len) for _ in range(args.groups)]
    questions = [[draw(args.question_len) for _ in range(args.prompts_per_group)] for _ in systems]
    prompts = [s + q for s, qs in zip(systems, questions, strict=True) for q in qs]
    rng.shuffle(prompts)
    seen: set[int] = set()  # a group's first prompt in send order leads, the rest follow
    followers = set()
    for i, prompt in enumerate(prompts):
        group = next(g for g, system in enumerate(systems) if prompt[: len(system)] == system)
        if group in seen:
            followers.add(f"r{i}")
        seen.add(group)
    page_size = args.page_size
    cache = CacheCore()
    executors = []
    for e in range(num_executors):
        cache.register_pool(f"x{e}", "m", args.num_pages, page_size)
        info = ExecutorInfo(f"x{e}", "m", page_size, args.num_pages, 1 << 20, 1 << 20)
        executors.append(TimedExecutor(info, args.step_ms / 1e3, args.token_us / 1e6))
    done: dict[str, asyncio.Event] = {}
    cached: dict[str, int] = {}
    sent: dict[str, float] = {}
    ttft: dict[str, float] = {}
    loop = asyncio.get_running_loop()

    def sink(batch: StepUpdates) -> None:
        for update in batch.updates:
            if update.token_ids and update.req_id not in ttft:
                ttft[update.req_id] = loop.time() - sent[update.req_id]
            if update.num_cached_tokens is not None:
                cached[update.req_id] = update.num_cached_tokens
            if update.finished:
                done[update.req_id].set()

    core = SchedulerCore(SchedulerConfig(), InProcessCache(cache), executors, sink)
    await core.start()
    sampling = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    todo = iter(enumerate(prompts))

    async def user() -> None:
        for i, prompt in todo:
            req_id = f"r{i}"
            done[req_id] = asyncio.Event()
            sent[req_id] = loop.time()
            await core.submit(req_id, prompt, sampling)
            await done[req_id].wait()

    await asyncio.gather(*(user() for _ in range(concurrency)))
    await core.stop()
    total = sum(len(p) for p in prompts)
    shared = args.system_len // page_size * page_size
    pools = cache.stats()
    return {
        "served": sum(cached.values()) / total,
        "best": shared * (len(prompts) - args.groups) / total,
        "lookups": sum(p.num_prefix_hit_tokens for p in pools)
        / max(1, sum(p.num_query_tokens for p in pools)),
        "preemptions": core.num_preemptions,
        "ttft_p50": _quantile(list(ttft.values()), 0.5),
        "ttft_p90": _quantile(list(ttft.values()), 0.9),
        "follower_ttft_p90": _quantile([t for r, t in ttft.items() if r in followers], 0.9),
    }


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (NaN for none)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


async def main_async(args: argparse.Namespace) -> None:
    print(f"{'executors':>9} {'in flight':>9} {'served':>7} {'best':>7} {'lookups':>7} "
          f"{'TTFT p50 ms':>11} {'p90':>7} {'followers p90':>13}")  # fmt: skip
    for num_executors in args.executors:
        for concurrency in args.concurrency:
            r = await run(args, concurrency, num_executors)
            print(
                f"{num_executors:>9} {concurrency:>9} {r['served']:>7.3f} {r['best']:>7.3f} "
                f"{r['lookups']:>7.3f} {r['ttft_p50'] * 1e3:>11.1f} {r['ttft_p90'] * 1e3:>7.1f} "
                f"{r['follower_ttft_p90'] * 1e3:>13.1f}"
            )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--concurrency", type=int, nargs="+", default=[8, 64])
    p.add_argument("--executors", type=int, nargs="+", default=[1, 2])
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--prompts-per-group", type=int, default=32)
    p.add_argument("--system-len", type=int, default=1400, help="tokens (1,024 words)")
    p.add_argument("--question-len", type=int, default=45, help="tokens (32 words)")
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--num-pages", type=int, default=8192)
    p.add_argument("--step-ms", type=float, default=2.0)
    p.add_argument("--token-us", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
