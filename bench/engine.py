"""In-process engine throughput: output tokens/s, TTFT and TPOT on N requests.

    python bench/engine.py --num-requests 64 --prompt-len 128 --output-len 32
    python bench/engine.py --workload shared-prefix --shared-len 96 --model /models/Llama-3.1-8B

Every request is submitted at once (offline batch); each one ignores EOS so
it generates exactly --output-len tokens. With no --model, the tiny default
model is used (created once in the cache folder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from radixmesh.engine import Engine, EngineConfig
from services.common.sampling import SamplingParams
from services.scheduler.core import SchedulerConfig


@dataclass(slots=True)
class Timing:
    submitted: float
    first: float = 0.0
    last: float = 0.0
    num_tokens: int = 0
    num_cached_tokens: int = 0


@dataclass(slots=True)
class Report:
    num_requests: int
    prompt_len: int
    output_len: int
    workload: str
    seconds: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    prefix_hit_rate: float
    """Prompt tokens served from the cache / prompt tokens."""
    best_prefix_hit_rate: float
    """The same if every request after the first found the whole shared prefix cached."""
    num_preemptions: int


def make_prompts(args: argparse.Namespace, vocab_size: int) -> list[list[int]]:
    rng = random.Random(args.seed)
    low = min(10, vocab_size // 2)  # stay clear of the special ids at the start

    def draw(n: int) -> list[int]:
        return [rng.randrange(low, vocab_size) for _ in range(n)]

    if args.workload == "random":
        return [draw(args.prompt_len) for _ in range(args.num_requests)]
    shared = draw(args.shared_len)
    return [shared + draw(args.prompt_len - args.shared_len) for _ in range(args.num_requests)]


async def run_requests(engine: Engine, prompts: list[list[int]], output_len: int) -> list[Timing]:
    sampling = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    timings = []

    async def one(prompt: list[int]) -> None:
        timing = Timing(time.perf_counter())
        timings.append(timing)
        async for update in await engine.generate(prompt, sampling):
            if update.error is not None:
                raise update.error
            if update.num_cached_tokens is not None:
                timing.num_cached_tokens = update.num_cached_tokens
            if update.token_ids:
                now = time.perf_counter()
                timing.first = timing.first or now
                timing.last = now
                timing.num_tokens += len(update.token_ids)

    await asyncio.gather(*(one(p) for p in prompts))
    return timings


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


async def bench(args: argparse.Namespace) -> Report:
    model = args.model
    if model is None:
        from radixmesh.tiny_model import ensure_default_model

        model = str(ensure_default_model())
    executor_fields = {"device": args.device, "page_size": args.page_size}
    if args.num_pages:
        executor_fields["num_pages"] = args.num_pages
    executor_fields["max_num_seqs"] = args.max_num_seqs
    executor_fields["max_num_batched_tokens"] = args.max_num_batched_tokens
    scheduler = SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_queue_len=max(1024, args.num_requests),
    )
    config = EngineConfig.for_model(model, scheduler=scheduler, **executor_fields)
    async with Engine(config) as engine:
        prompts = make_prompts(args, engine.executors[0].info.vocab_size)
        if args.warmup:  # other tokens than the timed prompts, so nothing of theirs is cached
            vocab = engine.executors[0].info.vocab_size
            rng = random.Random(args.seed + 1)
            warm = [[rng.randrange(vocab // 2, vocab) for _ in range(8)] for _ in range(4)]
            await run_requests(engine, warm, 2)
        start = time.perf_counter()
        timings = await run_requests(engine, prompts, args.output_len)
        seconds = time.perf_counter() - start
        num_preemptions = engine.scheduler.num_preemptions
    ttft = [(t.first - t.submitted) * 1e3 for t in timings]
    tpot = [(t.last - t.first) * 1e3 / (t.num_tokens - 1) for t in timings if t.num_tokens > 1]
    num_out = sum(t.num_tokens for t in timings)
    num_prompt = sum(len(p) for p in prompts)
    page_size = args.page_size
    shared = args.shared_len // page_size * page_size if args.workload == "shared-prefix" else 0
    best = (len(prompts) - 1) * shared / num_prompt
    return Report(
        num_requests=args.num_requests,
        prompt_len=args.prompt_len,
        output_len=args.output_len,
        workload=args.workload,
        seconds=round(seconds, 3),
        output_tokens_per_s=round(num_out / seconds, 1),
        total_tokens_per_s=round((num_out + num_prompt) / seconds, 1),
        ttft_p50_ms=round(pct(ttft, 50), 2),
        ttft_p99_ms=round(pct(ttft, 99), 2),
        tpot_p50_ms=round(pct(tpot, 50), 2) if tpot else 0.0,
        tpot_p99_ms=round(pct(tpot, 99), 2) if tpot else 0.0,
        prefix_hit_rate=round(sum(t.num_cached_tokens for t in timings) / num_prompt, 4),
        best_prefix_hit_rate=round(best, 4),
        num_preemptions=num_preemptions,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="model folder (default: the tiny model)")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--workload", choices=("random", "shared-prefix"), default="random")
    p.add_argument("--shared-len", type=int, default=96, help="shared-prefix tokens")
    p.add_argument("--device", default="auto")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--num-pages", type=int, default=None, help="default: sized from memory")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-warmup", dest="warmup", action="store_false")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.workload == "shared-prefix" and not 0 < args.shared_len < args.prompt_len:
        p.error("--shared-len must be in (0, --prompt-len)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = asyncio.run(bench(args))
    if args.json:
        print(json.dumps(asdict(report)))
    else:
        width = max(len(k) for k in asdict(report))
        for key, value in asdict(report).items():
            print(f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
