"""Jump-forward on the JSON workload: output tokens/s and TPOT with it off and on.

The in-process Engine, greedy, `--batch-sizes` requests in flight (each slot taking
`--requests-per-slot` requests in turn) under the PEOPLE
schema of bench/structured.py (long enough that every request runs to
--output-len), speculation off. One engine per mode (jump-forward off and on, side by
side, each with its own KV pool of the size the batch needs), each warmed up with one
untimed round of every measured shape (each batch size, prompts as long as the measured
ones, of other token ids, WARM_OUTPUT_LEN tokens each, so that no first-use cost, a kernel
compile or tuning or a graph upload, lands in a measured round), then
`--rounds` rounds per batch size, alternating the modes. Greedy outputs are the same in both
modes (checked here), so both produce the same tokens and tokens/s compares directly.
Reported per batch size and mode: output tokens/s (all requests' tokens over the round's
wall time), mean and p50 TPOT, steps per request, and the share of output tokens that
were forced (verified as a draft and kept, each saving a step).

    python -m bench.jump_forward --model /tmp/llama8b --batch-sizes 1 64

`--json PATH` writes the rows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import time

import torch

from bench.structured import PEOPLE
from mesh.tiny_model import ensure_default_model
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from services.common.logging import configure_logging
from services.executor.core.grammar import GrammarConfig, GrammarService

MODES = ("off", "on")
WARM_OUTPUT_LEN = 32


async def _round(engine, prompts, sampling, constraint, concurrency: int) -> dict:
    """Every prompt, at most `concurrency` in flight (a new one as soon as one ends): wall
    time, tokens, per-request TPOT and TTFT (ms) and outputs."""
    slots = asyncio.Semaphore(concurrency)

    async def one(prompt: list[int]):
        async with slots:
            return await _request(prompt)

    async def _request(prompt: list[int]):
        sent = time.perf_counter()
        first = last = 0.0
        tokens: list[int] = []
        stream = await engine.generate(prompt, sampling, constraint=constraint)
        async for update in stream:
            if update.error is not None:
                raise update.error
            if update.token_ids:
                now = time.perf_counter()
                first, last = first or now, now
                tokens += update.token_ids
        tpot = (last - first) * 1e3 / (len(tokens) - 1) if len(tokens) > 1 else float("nan")
        return tpot, tokens, (first - sent) * 1e3

    start = time.perf_counter()
    done = await asyncio.gather(*(one(p) for p in prompts))
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "tpots": [t for t, _, _ in done],
        "outputs": [o for _, o, _ in done],
        "ttfts": [t for _, _, t in done],
    }


def _engine_config(args: argparse.Namespace, model: str, mode: str):
    from mesh.engine import EngineConfig
    from services.executor.core.spec import SpeculativeConfig
    from services.scheduler.core import SchedulerConfig

    max_batch = max(args.batch_sizes)
    scheduler = SchedulerConfig(max_num_seqs=max_batch, max_queue_len=4 * max_batch)
    pages_per_seq = -(-(args.prompt_len + args.output_len) // 16) + scheduler.page_lookahead + 2
    return EngineConfig.for_model(
        model,
        scheduler=scheduler,
        device=args.device,
        page_size=16,
        num_pages=max_batch * pages_per_seq,
        max_num_seqs=max_batch,
        speculative=SpeculativeConfig(
            jump_forward=mode == "on", max_forced_tokens=args.max_forced_tokens
        ),
    )


async def bench_modes(args: argparse.Namespace, model: str) -> dict[str, dict[int, list[dict]]]:
    """Both engines side by side (one grammar service), rounds alternating off / on so
    that a machine's drift falls on both modes alike."""
    from mesh.engine import Engine

    service = GrammarService.from_model_dir(model, config=GrammarConfig(compile_timeout_s=120))
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(PEOPLE))
    sampling = SamplingParams(max_tokens=args.output_len, temperature=0.0)
    rows: dict[str, dict[int, list[dict]]] = {mode: {} for mode in MODES}
    async with contextlib.AsyncExitStack() as stack:
        engines = {}
        for mode in MODES:
            engine = Engine(_engine_config(args, model, mode), grammar=service)
            engines[mode] = await stack.enter_async_context(engine)
        vocab = engines["off"].executors[0].info.vocab_size
        assert vocab is not None
        rng = random.Random(0)
        prompts = [
            [rng.randrange(vocab // 4, vocab) for _ in range(args.prompt_len)]
            for _ in range(max(args.batch_sizes) * args.requests_per_slot)
        ]
        warm = SamplingParams(max_tokens=min(args.output_len, WARM_OUTPUT_LEN), temperature=0.0)
        warm_rng = random.Random(1)  # not the measured prompts: nothing cached for them
        for batch in args.batch_sizes:  # untimed: every measured shape, on both engines
            warm_prompts = [
                [warm_rng.randrange(vocab // 4, vocab) for _ in range(args.prompt_len)]
                for _ in range(batch)
            ]
            for engine in engines.values():
                await _round(engine, warm_prompts, warm, constraint, batch)
        for batch in args.batch_sizes:
            work = prompts[: batch * args.requests_per_slot]
            for _ in range(args.rounds):
                for mode, engine in engines.items():
                    core = engine.executors[0]
                    steps = _count_steps(core)
                    before = core.spec_stats.snapshot()
                    replays = _verify_replays(core)
                    row = await _round(engine, work, sampling, constraint, batch)
                    after = core.spec_stats.snapshot()
                    row["num_steps"] = steps()
                    row["verify_graph_replays"] = _verify_replays(core) - replays
                    switch = core.forced_switch  # jump-forward's (None: not measured)
                    row["forced_switch"] = switch.describe() if switch is not None else None
                    row["num_forced"] = after.num_forced_tokens - before.num_forced_tokens
                    rows[mode].setdefault(batch, []).append(row)
    service.close(wait=True)
    return rows


def _verify_replays(core) -> int:
    """Steps the core verified as CUDA graph replays so far (0 without verification graphs)."""
    graphs = core.forward.verify
    return graphs.num_runs if graphs is not None else 0


def _count_steps(core):
    """Counts the core's executed steps from now on; returns a reader (and unhooks it)."""
    execute = core.execute
    count = [0]

    def counting(prepared):
        count[0] += prepared.batch is not None
        return execute(prepared)

    core.execute = counting

    def read() -> int:
        core.execute = execute
        return count[0]

    return read


def report(args: argparse.Namespace, results: dict[str, dict[int, list[dict]]]) -> list[dict]:
    print(f"\n### jump-forward, JSON workload (PEOPLE), prompt {args.prompt_len}, output ", end="")
    print(f"{args.output_len}, greedy, max_forced_tokens {args.max_forced_tokens}, ", end="")
    print(f"{args.requests_per_slot} requests per slot\n")
    print("| in flight | jump-forward | output tok/s | TPOT mean / p50 ms | TTFT p50 ms | steps |", end="")
    print(" forced share | graphed verifications |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    out: list[dict] = []
    differ: list[str] = []
    for batch in args.batch_sizes:
        for mode in MODES:
            rounds = results[mode][batch]
            tokens = sum(len(o) for o in rounds[0]["outputs"])
            tok_s = statistics.median(sum(len(o) for o in r["outputs"]) / r["wall_s"] for r in rounds)
            tpots = [t for r in rounds for t in r["tpots"]]
            forced = sum(r["num_forced"] for r in rounds) / len(rounds)
            steps = statistics.median(r["num_steps"] for r in rounds)
            replays = statistics.median(r["verify_graph_replays"] for r in rounds)
            ttft = statistics.median(t for r in rounds for t in r["ttfts"])
            row = {
                "batch_size": batch, "jump_forward": mode, "output_tok_s": tok_s,
                "tpot_mean_ms": statistics.mean(tpots), "tpot_p50_ms": statistics.median(tpots),
                "ttft_p50_ms": ttft, "num_steps": steps, "forced_share": forced / max(tokens, 1),
                "verify_graph_replays": replays, "forced_switch": rounds[-1]["forced_switch"],
            }  # fmt: skip
            out.append(row)
            print(f"| {batch} | {mode} | {tok_s:.1f} | {row['tpot_mean_ms']:.2f} / ", end="")
            print(f"{row['tpot_p50_ms']:.2f} | {ttft:.1f} | {steps:.0f} | ", end="")
            print(f"{100 * row['forced_share']:.1f}% | {replays:.0f} |")
        off_on = (results[mode][batch][0]["outputs"] for mode in ("off", "on"))
        pairs = zip(*off_on, strict=True)
        num_differ = sum(a != b for a, b in pairs)
        same = num_differ == 0
        differ += [f"batch {batch}: {num_differ} greedy outputs differ"] if num_differ else []
        off, on = (r for r in out[-2:])
        print(f"| {batch} | gain | {on['output_tok_s'] / off['output_tok_s']:.3f}x | ", end="")
        print(f"{on['tpot_mean_ms'] / off['tpot_mean_ms']:.3f}x | | | outputs equal: {same} |")
        print(f"| {batch} | switch | {results['on'][batch][-1]['forced_switch']} |")
    if differ:  # after every batch size's rows
        raise SystemExit("; ".join(differ) + " between the modes")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="a Hugging Face model folder (default: the tiny model)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--max-forced-tokens", type=int, default=8)
    parser.add_argument(
        "--requests-per-slot",
        type=int,
        default=4,
        help="requests per batch slot: a finished request's slot takes the next one, so a "
        "request that jumps ahead makes room sooner (1: one closed batch)",
    )
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto")
    parser.add_argument("--json", default=None, help="write the rows here")


def run(args: argparse.Namespace) -> None:
    configure_logging("bench", level="warning", json=False)
    print(f"host: {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}")
    model = args.model or str(ensure_default_model())
    results = asyncio.run(bench_modes(args, model))
    rows = report(args, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
