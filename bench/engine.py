"""Engine throughput: output tokens/s, TTFT and TPOT on N requests, in-process or as services.

    python bench/engine.py --num-requests 64 --prompt-len 128 --output-len 32
    python bench/engine.py --workload shared-prefix --shared-len 96 --model /models/Llama-3.1-8B
    python bench/engine.py --mode services --device cpu
    python bench/engine.py --workload chat-words --prompt-len 512   # what `radixmesh bench` sends

Every request is submitted at once (offline batch); each one ignores EOS so
it generates exactly --output-len tokens. With no --model, the tiny default
model is used (created once in the cache folder).

Workloads: `random` draws --prompt-len token ids per prompt; `shared-prefix` puts the same
--shared-len ids first in each; `chat-words` makes the prompts `radixmesh bench --workload
random --input-len N` sends (N = --prompt-len random words, the same generator and --seed)
and tokenizes them as the gateway does (a user message through the model's chat template),
so an in-process run prefills the tokens a run through the mesh does (with
--bench-warmup N, the same prompts as a bench run with --warmup N); the report's
`prompt_tokens` is their total (`total_input_tokens` in the bench's report).

Modes: `inprocess` drives the in-process Engine (one executor core, no gRPC);
`services` starts a cache, one executor and a scheduler as processes and
drives the same workload through the scheduler's Stream (SchedulerClient);
`both` runs the two one after the other and adds the ratio services /
in-process. The default is `both` on CPU and `inprocess` on a GPU. With
--json one object is printed: the first mode's numbers at the top level,
and in `both` mode the services numbers under "services" and the ratios
under "services_over_inprocess".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mesh.engine import Engine, EngineConfig
from radixmesh.sampling import SamplingParams
from radixmesh.updates import RequestUpdate
from radixmesh_kernels import _triton, gemv_chain
from services.common.logging import configure_logging
from services.executor.core.spec.config import SPECULATIVE_METHODS
from services.scheduler.core import SchedulerConfig

REPO = Path(__file__).resolve().parent.parent
MODES = ("inprocess", "services", "both")

Generate = Callable[[str, list[int], SamplingParams], AsyncIterator[RequestUpdate]]
"""(req_id, prompt, sampling) -> the request's updates."""


@dataclass(slots=True)
class Timing:
    submitted: float
    first: float = 0.0
    last: float = 0.0
    num_tokens: int = 0
    num_cached_tokens: int = 0


@dataclass(slots=True)
class Report:
    mode: str
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
    steps: int | None = None
    """In-process: steps the executor ran, warm-up included (each step of a multi-step plan
    counts)."""
    steps_launched_ahead: int | None = None
    """In-process: of them, queued on the device before the step before was read back."""
    steps_launched_on_prepare: int | None = None
    """In-process: of those, launched by the prepare thread (their plan came while the step
    before ran)."""
    steps_in_extend_graphs: int | None = None
    """In-process with --extend-graph-tokens: steps that replayed an extend graph."""
    idle_gaps: int | None = None
    """Times the step thread ran out of steps and the next plan then came, warm-up
    included (in-process: `PipelineCounts`; services: the executor's
    `radixmesh_executor_idle_gap_seconds` count)."""
    idle_gap_s: float | None = None
    """Their summed seconds: under an offline load, the scheduler's round trip not hidden."""
    steps_in_flight_target: int | None = None
    """The scheduler's depth toward the executor as the run ended (pipeline_depth.py)."""
    prompt_tokens: int = 0
    """Prompt tokens of the measured requests, in all."""
    decode_weight_bytes: int | None = None
    """In-process: bytes a decode step reads from the weights, as loaded (FP8 projections
    with their scales under --quantization fp8): the batch-1 floor's numerator."""


def make_prompts(args: argparse.Namespace, vocab_size: int) -> list[list[int]]:
    if args.workload == "chat-words":
        return chat_word_prompts(args)
    rng = random.Random(args.seed)
    low = min(10, vocab_size // 2)  # stay clear of the special ids at the start

    def draw(n: int) -> list[int]:
        return [rng.randrange(low, vocab_size) for _ in range(n)]

    if args.workload == "random":
        return [draw(args.prompt_len) for _ in range(args.num_requests)]
    shared = draw(args.shared_len)
    return [shared + draw(args.prompt_len - args.shared_len) for _ in range(args.num_requests)]


def chat_word_prompts(args: argparse.Namespace) -> list[list[int]]:
    """The first --num-requests prompts of `radixmesh bench --workload random` (its words and
    seed), as the gateway tokenizes a chat request of each."""
    from bench.best_hit_rate import bench_prompts
    from gateway.core.tokenizer import Tokenizer
    from mesh.loadgen.workloads import WorkloadConfig

    config = WorkloadConfig(
        name="random", seed=args.seed, input_len=args.prompt_len, output_len=args.output_len
    )
    tokenizer = Tokenizer.from_folder(model_dir(args))
    return bench_prompts(tokenizer, config, args.num_requests, skip=args.bench_warmup)


async def run_requests(
    generate: Generate, prompts: list[list[int]], output_len: int, tag: str
) -> list[Timing]:
    sampling = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    timings = []

    async def one(i: int, prompt: list[int]) -> None:
        timing = Timing(time.perf_counter())
        timings.append(timing)
        async for update in generate(f"{tag}-{i}", prompt, sampling):
            if update.error is not None:
                raise update.error
            if update.num_cached_tokens is not None:
                timing.num_cached_tokens = update.num_cached_tokens
            if update.token_ids:
                now = time.perf_counter()
                timing.first = timing.first or now
                timing.last = now
                timing.num_tokens += len(update.token_ids)

    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return timings


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def model_dir(args: argparse.Namespace) -> str:
    if args.model is not None:
        return args.model
    from mesh.tiny_model import ensure_default_model

    return str(ensure_default_model())


def warmup_prompts(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    """Other tokens than the timed prompts, so nothing of theirs is cached."""
    rng = random.Random(args.seed + 1)
    return [[rng.randrange(vocab // 2, vocab) for _ in range(8)] for _ in range(4)]


async def timed(
    args: argparse.Namespace, generate: Generate, vocab: int
) -> tuple[list[list[int]], list[Timing], float]:
    """(prompts, timings, seconds) of the workload, after the warm-up."""
    prompts = make_prompts(args, vocab)
    if args.warmup:
        await run_requests(generate, warmup_prompts(args, vocab), 2, "warmup")
    start = time.perf_counter()
    timings = await run_requests(generate, prompts, args.output_len, "bench")
    return prompts, timings, time.perf_counter() - start


async def bench_inprocess(args: argparse.Namespace) -> Report:
    executor_fields = {
        "device": args.device,
        "page_size": args.page_size,
        "quantization": args.quantization,
    }
    if args.num_pages:
        executor_fields["num_pages"] = args.num_pages
    executor_fields["max_num_seqs"] = args.max_num_seqs
    if args.extend_graph_tokens:
        executor_fields["extend_graph_tokens"] = args.extend_graph_tokens
    executor_fields["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.speculative != "off":
        from services.executor.core.spec import SpeculativeConfig

        executor_fields["speculative"] = SpeculativeConfig(
            method=args.speculative, max_batch_size=args.max_num_seqs
        )
    scheduler = SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_queue_len=max(1024, args.num_requests),
        decode_steps_per_plan=args.decode_steps_per_plan,
        max_steps_in_flight=args.max_steps_in_flight,
    )
    config = EngineConfig.for_model(
        model_dir(args), scheduler=scheduler, launch_ahead=args.launch_ahead, **executor_fields
    )
    if args.num_threads:
        import torch

        torch.set_num_threads(args.num_threads)
    async with Engine(config) as engine:
        if args.stand_in_device_ms is not None:
            from bench.device_stand_in import install

            install(
                engine.executors[0],
                args.stand_in_device_ms,
                hashed=args.stand_in_logits == "hashed",
                spec_ratio=args.stand_in_spec_ratio,
            )

        async def generate(req_id, prompt, sampling):
            async for update in await engine.generate(prompt, sampling, req_id=req_id):
                yield update

        vocab = engine.executors[0].info.vocab_size
        prompts, timings, seconds = await timed(args, generate, vocab)
        num_preemptions = engine.scheduler.num_preemptions
        (load,) = engine.scheduler.executor_loads()
        counts = engine.ports[0].pipeline_counts
        extend_graphs = engine.executors[0].forward.extend
        weights = getattr(engine.executors[0].model, "weights", None)
        read_bytes = weights.decode_read_bytes() if weights is not None else None
    report = summarize(args, "inprocess", prompts, timings, seconds, num_preemptions)
    report.steps, report.steps_launched_ahead = counts.steps, counts.launched_ahead
    report.idle_gaps, report.idle_gap_s = counts.idle_starts - 1, round(counts.idle_s, 4)
    report.steps_in_flight_target = load.steps_in_flight_target
    report.steps_launched_on_prepare = counts.launched_on_prepare
    report.steps_in_extend_graphs = extend_graphs.num_runs if extend_graphs else None
    report.decode_weight_bytes = read_bytes
    return report


def release_device_memory() -> None:
    """Give the in-process engine's freed device memory back to the driver, so that the
    executor process of the services run that follows can allocate it (the caching
    allocator keeps what the closed engine freed: on an 80 GB card the 8B shape's
    executor then ran out of memory)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def model_vocab_size(model: str) -> int:
    config = json.loads((Path(model) / "config.json").read_text())
    return int(config.get("vocab_size") or config["text_config"]["vocab_size"])


def summarize(
    args: argparse.Namespace,
    mode: str,
    prompts: list[list[int]],
    timings: list[Timing],
    seconds: float,
    num_preemptions: int,
) -> Report:
    ttft = [(t.first - t.submitted) * 1e3 for t in timings]
    tpot = [(t.last - t.first) * 1e3 / (t.num_tokens - 1) for t in timings if t.num_tokens > 1]
    num_out = sum(t.num_tokens for t in timings)
    num_prompt = sum(len(p) for p in prompts)
    page_size = args.page_size
    shared = args.shared_len // page_size * page_size if args.workload == "shared-prefix" else 0
    best = (len(prompts) - 1) * shared / num_prompt
    return Report(
        mode=mode,
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
        prompt_tokens=num_prompt,
    )


RATIO_KEYS = ("output_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms")


def ratios(services: Report, inprocess: Report) -> dict[str, float]:
    """services / in-process for throughput (higher is better) and latencies (lower is)."""
    a, b = asdict(services), asdict(inprocess)
    return {k: round(a[k] / b[k], 3) if b[k] else 0.0 for k in RATIO_KEYS}


def default_mode(device: str) -> str:
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "both" if device == "cpu" else "inprocess"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=None, help="model folder (default: the tiny model)")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument(
        "--workload",
        choices=("random", "shared-prefix", "chat-words"),
        default="random",
        help="random token ids, a shared prefix of them, or the bench's chat prompts of "
        "--prompt-len words (see above)",
    )
    p.add_argument("--shared-len", type=int, default=96, help="shared-prefix tokens")
    p.add_argument(
        "--bench-warmup",
        type=int,
        default=0,
        help="chat-words: the bench run's --warmup, whose scripts precede its measured ones",
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument(
        "--quantization",
        default="auto",
        choices=("auto", "none", "fp8"),
        help="projection weights (fp8: quantize at load, FP8 tensor cores on CUDA)",
    )
    p.add_argument("--num-pages", type=int, default=None, help="default: sized from memory")
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="ranks of the executor (services mode: one process per device)",
    )
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument(
        "--extend-graph-tokens",
        type=int,
        default=0,
        help="in-process on CUDA: steps of up to this many tokens that are not plain decodes "
        "replay CUDA graphs (the executor's --extend-graph-tokens; 0: off)",
    )
    p.add_argument(
        "--decode-steps-per-plan",
        type=int,
        default=SchedulerConfig().decode_steps_per_plan,
        help="the scheduler's multi-step decode plans; 1: a plan per step (default %(default)s)",
    )
    p.add_argument(
        "--max-steps-in-flight",
        type=int,
        default=SchedulerConfig().max_steps_in_flight,
        help="the most steps the scheduler keeps in flight (above 2, more only while plans "
        "reach the executor after its steps ran out; default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--stand-in-device-ms",
        type=float,
        default=None,
        help="CPU only: the forward waits this long, lock released, and returns fixed logits "
        "(bench/device_stand_in.py), so the service path shows beside a GPU-sized step",
    )
    p.add_argument(
        "--speculative",
        choices=SPECULATIVE_METHODS,
        default="off",
        help="the executor's speculation, its cap at --max-num-seqs (with --stand-in-device-ms "
        "and --stand-in-spec-ratio: a speculating executor whose drafts never pay)",
    )
    p.add_argument(
        "--stand-in-logits",
        choices=("fixed", "hashed"),
        default="fixed",
        help="with --stand-in-device-ms: fixed logits (each greedy sequence repeats a token) "
        "or hashed ones (text that never repeats, as on random prompts: nothing to draft)",
    )
    p.add_argument(
        "--stand-in-spec-ratio",
        type=float,
        default=None,
        help="with --stand-in-device-ms and --speculative: the switch's verify/decode ratio "
        "at every bucket, as a GPU's start-up would measure it; outputs never repeat, so it "
        "declines (bench/device_stand_in.py)",
    )
    p.add_argument(
        "--no-launch-ahead",
        dest="launch_ahead",
        action="store_const",
        const=False,
        default=None,
        help="in-process: read each step back before the next is queued on the device",
    )
    p.add_argument(
        "--dependent-launch",
        choices=("on", "off"),
        default=None,
        help="the decode chain's kernels as programmatic dependents on Hopper, or plain launches "
        "(RADIXMESH_DEPENDENT_LAUNCH, for this process and the services it starts; default: "
        "the environment's, else on)",
    )
    p.add_argument(
        "--gemv-fusion",
        choices=("auto", "on", "off"),
        default=None,
        help="the decode GEMV chain where timed faster (auto), always (on), or the unfused ops "
        "(off) (RADIXMESH_GEMV_FUSION, for this process and the services it starts; default: "
        "the environment's, else auto)",
    )
    p.add_argument("--no-warmup", dest="warmup", action="store_false")
    p.add_argument(
        "--num-threads",
        type=int,
        default=0,
        help="torch CPU threads of the engine / executor process (default: torch's own)",
    )
    p.add_argument(
        "--mode",
        choices=MODES,
        default=None,
        help="inprocess, services or both (default: both on CPU, inprocess on a GPU)",
    )
    p.add_argument(
        "--switch-interval-us",
        type=float,
        default=0.0,
        help="the interpreter's thread switch interval in this process (default: Python's 5000)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.switch_interval_us < 0:
        p.error("--switch-interval-us must be >= 0")
    if args.workload == "shared-prefix" and not 0 < args.shared_len < args.prompt_len:
        p.error("--shared-len must be in (0, --prompt-len)")
    if args.bench_warmup < 0:
        p.error("--bench-warmup must be >= 0")
    if args.num_threads < 0:
        p.error("--num-threads must be >= 0")
    if args.stand_in_device_ms is not None and (
        args.stand_in_device_ms < 0 or args.device != "cpu"
    ):
        p.error("--stand-in-device-ms must be >= 0 and needs --device cpu")
    if args.stand_in_spec_ratio is not None and (
        args.stand_in_device_ms is None
        or args.speculative == "off"
        or args.stand_in_logits != "hashed"
        or args.stand_in_spec_ratio <= 0
    ):
        p.error(
            "--stand-in-spec-ratio must be > 0 and needs --stand-in-device-ms, "
            "--stand-in-logits hashed and --speculative"
        )
    if args.tensor_parallel_size < 1:
        p.error("--tensor-parallel-size must be >= 1")
    if args.tensor_parallel_size > 1 and args.mode != "services":
        p.error("--tensor-parallel-size above 1 needs --mode services (the executor service)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging("bench", "warning", json=False)  # stdout is left to the results
    mode = args.mode or default_mode(args.device)
    if args.switch_interval_us:
        sys.setswitchinterval(args.switch_interval_us * 1e-6)
    if args.dependent_launch is not None:
        os.environ["RADIXMESH_DEPENDENT_LAUNCH"] = args.dependent_launch
        _triton.DEPENDENT_LAUNCH = args.dependent_launch
    if args.gemv_fusion is not None:
        os.environ["RADIXMESH_GEMV_FUSION"] = args.gemv_fusion
        gemv_chain.FUSION = args.gemv_fusion
    reports = []
    if mode in ("inprocess", "both"):
        reports.append(asyncio.run(bench_inprocess(args)))
    if mode == "both":
        release_device_memory()
    if mode in ("services", "both"):
        from bench.engine_services import bench_services

        reports.append(asyncio.run(bench_services(args)))
    out = asdict(reports[0])
    out["dependent_launch"] = _triton.DEPENDENT_LAUNCH
    out["gemv_fusion"] = gemv_chain.FUSION
    out["gemv_chain_decisions"] = gemv_chain.GEMV_CHAIN.decisions()  # in-process runs only
    if len(reports) == 2:
        out["services"] = asdict(reports[1])
        out["services_over_inprocess"] = ratios(reports[1], reports[0])
    if args.json:
        print(json.dumps(out))
        return 0
    for report in reports:
        print_table(asdict(report))
        print()
    if len(reports) == 2:
        print_table({f"services/inprocess {k}": v for k, v in ratios(*reports[::-1]).items()})
    return 0


def print_table(rows: dict) -> None:
    width = max(len(k) for k in rows)
    for key, value in rows.items():
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    sys.exit(main())
