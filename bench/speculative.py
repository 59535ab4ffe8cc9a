"""Speculative decoding: output tok/s, TPOT and acceptance with speculation off, prompt
lookup (ngram), cross-request suffix drafts and drafts from the cache's radix tree
(radix), on workloads where drafts can be right and
one where they cannot, at batch 1, 8, 32 and 128, through the in-process engine.

    python bench/train_tiny.py --out /tmp/tiny-trained          # a model that has learned
    python bench/speculative.py --model /tmp/tiny-trained --json /tmp/spec.json
    python bench/speculative.py --smoke --device cpu            # the flow, numbers meaningless
    python bench/speculative.py --model M --batch-invariant     # the batch-invariant mode

Workloads (text from the standard library's source, tokenized with the model's tokenizer):
  code_edit   a function, then "the same with one name changed:" and its first line
              (bench/train_tiny.py's edit_prompt); the functions are those whose prompt
              fits --prompt-len and whose body has --output-len tokens or more, so the
              measured output of a model that copies is the function's copy
  quote       a module's docstring, then "Quote:" and its first words
  json        key: value lines, then a JSON object of them begun
  multi_turn  an earlier turn's prompt and answer, then the same prompt again (the answer
              repeats: drafts from the request itself and from the earlier request's output)
  repeat      random token ids sent twice, the second round measured: only an earlier
              request's output can draft (radix: the cache's tree; suffix: recent outputs)
  random      random token ids (drafts cannot be right: the automatic switch must hold)
Every request is greedy with exactly --output-len tokens; the outputs of every mode are
compared token for token with speculation off ("identical" in the JSON). With --repeats N
each row runs N batches, each of new prompts (seed + 1,000 x repeat), and reports the
medians (every repeat's tok/s in "output_tok_s_runs"). In process, every mode's engine is
alive for the whole run and each row's repeats take turns across the modes (the order
rotated each repeat), so a drift of the machine's speed falls on every mode alike;
--control adds a second speculation-off engine whose ratio to off is the run's noise
floor. Each row also reports what its steps waited for ("pipeline": the share prepared
only after the step before ended, the share queued to an idle step thread). With
--batch-invariant every engine runs in that mode (`batch_invariant` in each JSON row and
in the table's header line), where they must be identical at every batch size too:
"same_as_smaller_batches" says whether a row's outputs begin with every smaller batch's of
its workload (a batch's prompts are the first ones of every larger batch's), and in the
mode the exit status is 1 when a row is not identical or not the same as smaller batches
(outside the mode, greedy outputs may part at a near-tie and the status stays 0). `--mode serve`
runs the same through `radixmesh serve` (bench/spec_serve.py), one mesh per mode, each
batch's streams dealt to `--client-processes` asyncio clients so that the client is not
what a batch-128 row times.

Before any row is timed, each engine (or mesh) serves one untimed batch of every measured
shape: every (workload, batch size), its prompts as long as the measured ones (multi_turn:
as its second turn's) but of random token ids from another seed, so nothing a measured
row reads from the cache or the drafts' sources comes from them, WARM_OUTPUT_LEN tokens
each. So a first-use cost (a kernel compile or tuning, a graph upload) never lands in a
measured row.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import os
import random
import re
import signal
import statistics
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.train_tiny import edit_prompt, functions_in
from mesh.engine import Engine, EngineConfig
from radixmesh.sampling import SamplingParams
from services.executor.core.spec import SpeculativeConfig
from services.scheduler.core import SchedulerConfig

WORKLOADS = ("code_edit", "quote", "json", "multi_turn", "repeat", "random")
MODES = ("off", "ngram", "suffix", "radix")


def stdlib_sources(limit: int = 200) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.glob("*.py"))[:limit]:
        try:
            out.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return out


def functions(sources: list[str]) -> list[str]:
    return functions_in(sources, top_level=True)


@functools.lru_cache(maxsize=8)
def edit_functions(tokenizer, prompt_len: int, min_body_len: int) -> tuple[str, ...]:
    """code_edit's functions (the top-level modules' top-level ones) whose prompt has at most
    prompt_len tokens and whose body, the edit a model that copies writes, has at least
    min_body_len; every one where none has (a toy tokenizer, --smoke's short prompts)."""
    funcs = functions(stdlib_sources())

    def num_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    fit = [f for f in funcs
           if num_tokens(edit_prompt(f)) <= prompt_len and num_tokens(f.partition("\n")[2]) >= min_body_len]
    return tuple(fit or funcs)


def docstrings(sources: list[str]) -> list[str]:
    return [m.group(1) for t in sources if (m := re.match(r'\s*"""(.{200,1500}?)"""', t, re.S))]


def json_value(rng: random.Random, sources: list[str]) -> str | int:
    """A word from a random source (or a number half the time, or when the pick has none)."""
    words = rng.choice(sources)[rng.randrange(1000) :][:12].split()
    return words[0] if words and rng.random() < 0.5 else rng.randrange(10**6)


def make_texts(workload: str, n: int, rng: random.Random, sources: list[str]) -> list[str]:
    """quote's and json's texts (code_edit's: edit_texts)."""
    if workload == "quote":
        docs = docstrings(sources)
        picks = [rng.choice(docs) for _ in range(n)]
        return [f'"""{d}"""\n\nQuote: "{" ".join(d.split()[:4])}' for d in picks]
    if workload == "json":
        out = []
        for _ in range(n):
            keys = rng.sample(["name", "path", "mode", "size", "owner", "group", "kind", "level", "count", "label"], 6)
            lines = "\n".join(f"{k}: {json_value(rng, sources)}" for k in keys)
            out.append(f"{lines}\n\nAs JSON: {{\"{keys[0]}\": ")
        return out
    raise ValueError(workload)


def edit_texts(n: int, rng: random.Random, funcs: list[str] | tuple[str, ...]) -> list[str]:
    """code_edit's texts: the edit prompts of n functions drawn from funcs."""
    return [edit_prompt(rng.choice(funcs)) for _ in range(n)]


def make_prompts(
    workload: str, n: int, tokenizer, vocab: int, seed: int, prompt_len: int, output_len: int = 0
) -> list[list[int]]:
    """n prompts of the workload, each at most prompt_len tokens (cut from the left);
    code_edit's (and multi_turn's) of functions with output_len body tokens or more."""
    rng = random.Random(seed + 7919 if workload == "repeat" else seed)  # not random's prompts
    if workload in ("random", "repeat"):
        return [[rng.randrange(10, vocab) for _ in range(prompt_len)] for _ in range(n)]
    if workload in ("code_edit", "multi_turn"):
        texts = edit_texts(n, rng, edit_functions(tokenizer, prompt_len, output_len))
    else:
        texts = make_texts(workload, n, rng, stdlib_sources())
    return [tokenizer.encode(t, add_special_tokens=False)[-prompt_len:] for t in texts]


WARM_OUTPUT_LEN = 32
WARM_SEED = 10_007
"""The warm-up's prompts' seed: token ids no measured prompt starts with."""


def warm_prompts(args, workload: str, batch: int, tokenizer, vocab: int) -> list[list[int]]:
    """Prompts of the measured shape of (workload, batch): the same lengths (multi_turn's
    second turn: prompt + answer + prompt), random token ids of WARM_SEED."""
    measured = make_prompts(workload, batch, tokenizer, vocab, args.seed, args.prompt_len, args.output_len)
    lengths = [
        2 * len(p) + args.output_len if workload == "multi_turn" else len(p) for p in measured
    ]
    rng = random.Random(WARM_SEED + batch)
    return [[rng.randrange(10, vocab) for _ in range(n)] for n in lengths]


def warm_shapes(args, tokenizer, vocab: int) -> list[list[list[int]]]:
    """One batch of prompts per measured (workload, batch size), in the order they run."""
    return [
        warm_prompts(args, workload, batch, tokenizer, vocab)
        for workload in args.workloads
        for batch in args.batch_sizes
    ]


async def run_batch(engine, prompts: list[list[int]], output_len: int) -> tuple[list[list[int]], float, list[float]]:
    """(outputs, seconds, TPOT per request) of the prompts sent together."""
    sampling = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()

    async def one(prompt: list[int]) -> tuple[list[int], float]:
        first = last = None
        tokens: list[int] = []
        async for update in await engine.generate(prompt, sampling):
            if update.error is not None:
                raise update.error
            if update.token_ids:
                now = time.perf_counter()
                first = first or now
                last = now
                tokens += update.token_ids
        assert first is not None and last is not None
        return tokens, (last - first) / max(1, len(tokens) - 1)

    done = await asyncio.gather(*(one(p) for p in prompts))
    return [d[0] for d in done], time.perf_counter() - start, [d[1] for d in done]


CONTROL = "off2"
"""--control: a second engine with speculation off, measured like the others (the A/A
row: its ratio to "off" is the noise floor of every other ratio of the same run)."""


def engine_config(args, mode: str) -> EngineConfig:
    method = "off" if mode == CONTROL else mode
    spec = SpeculativeConfig(
        method=method, max_draft_tokens=args.num_speculative_tokens, max_batch_size=args.speculative_max_batch_size
    )
    return EngineConfig.for_model(
        args.model,
        scheduler=SchedulerConfig(max_num_seqs=max(args.batch_sizes), max_queue_len=4096),
        tune_gc=not args.default_gc,
        device=args.device,
        max_num_seqs=max(args.batch_sizes),
        speculative=spec,
        batch_invariant=args.batch_invariant,
        num_pages=args.num_pages or pages_for(args),
    )


def pages_for(args, page_size: int = 16) -> int:
    """KV pages for the largest batch of the longest prompts (multi_turn's second turn:
    two prompts and an answer), twice over: every engine of the run is alive at once, so
    none may take the device's free memory for its pool."""
    longest = 2 * args.prompt_len + 2 * args.output_len + 64
    return 2 * max(args.batch_sizes) * -(-longest // page_size)


async def bench_modes(args, tokenizer) -> dict[str, dict]:
    """Every mode's engine started (and warmed on every measured shape) before any row is
    timed, then each row's repeats run in turn across the modes, the order rotated from
    one repeat to the next, so drift in the machine (clocks, other load) lands on every
    mode alike rather than on whichever ran later."""
    async with contextlib.AsyncExitStack() as stack:
        engines = {}
        for mode in args.modes:
            engine = await stack.enter_async_context(Engine(engine_config(args, mode)))
            switch = engine.executors[0].spec_switch
            print(f"{mode:<7} speculation switch: {switch.describe()}; CUDA graph bytes (estimated, "
                  f"measured): {engine.executors[0].graph_bytes}", flush=True)
            engines[mode] = engine
        vocab = next(iter(engines.values())).executors[0].info.vocab_size
        for engine in engines.values():
            for prompts in warm_shapes(args, tokenizer, vocab):  # untimed: every measured shape
                await run_batch(engine, prompts, min(args.output_len, WARM_OUTPUT_LEN))
        rows: dict[str, dict] = {mode: {} for mode in engines}
        pauses = GcPauses()
        for workload in args.workloads:
            for batch in args.batch_sizes:
                gc_before = pauses.snapshot()
                before = {m: (e.executors[0].spec_stats.snapshot(), e.ports[0].pipeline_counts)
                          for m, e in engines.items()}
                runs: dict[str, list] = {mode: [] for mode in engines}
                for repeat in range(args.repeats):  # new prompts each: nothing drafts from the last
                    seed = args.seed + REPEAT_SEED * repeat
                    order = list(engines)[repeat % len(engines):] + list(engines)[:repeat % len(engines)]
                    for mode in order:
                        runs[mode].append(await measured_batch(engines[mode], args, workload, batch, tokenizer, vocab, seed))
                gc_row = gc_over(gc_before, pauses.snapshot())  # the row's, every mode's batches
                print(f"row {workload}/b{batch}: collector passes by generation {gc_row['passes']}, "
                      f"{gc_row['ms']} ms", flush=True)
                for mode, engine in engines.items():
                    rows[mode][f"{workload}/b{batch}"] = row = summarize_row(engine, runs[mode], *before[mode])
                    row["gc"] = gc_row
                    print(f"{mode:<7} {workload:<11} b{batch:<4} {row['output_tok_s']:10.1f} tok/s  "
                          f"TPOT {row['tpot_ms']:7.2f} ms (slowest {row['tpot_ms_slowest']:.2f})  drafts "
                          f"{row['num_drafts']}  steps {row['pipeline']['steps']} (serial "
                          f"{row['pipeline']['serial_share']:.2f}, idle starts "
                          f"{row['pipeline']['idle_start_share']:.2f}, prepare wait "
                          f"{row['pipeline']['prepare_wait_us_per_step']:.0f} us/step)", flush=True)
    return rows


async def measured_batch(engine, args, workload: str, batch: int, tokenizer, vocab: int, seed: int):
    """One timed batch of a row: (outputs, seconds, TPOTs, output tokens)."""
    prompts = make_prompts(workload, batch, tokenizer, vocab, seed, args.prompt_len, args.output_len)
    if workload == "multi_turn":  # turn 1, then its prompt + answer + the prompt again
        answers, _, _ = await run_batch(engine, prompts, args.output_len)
        prompts = [p + a + p for p, a in zip(prompts, answers, strict=True)]
    if workload == "repeat":  # the first round, unmeasured
        await run_batch(engine, prompts, args.output_len)
    outputs, seconds, tpots = await run_batch(engine, prompts, args.output_len)
    return outputs, seconds, tpots, sum(map(len, outputs))


def summarize_row(engine, runs: list, stats_before, counts_before) -> dict:
    """A row of one mode: its medians, drafts and acceptance, the switch's state, what the
    steps waited for, the tree's lookups."""
    after = engine.executors[0].spec_stats.snapshot()
    drafts = after.num_drafts - stats_before.num_drafts
    accepted = after.num_accepted_tokens - stats_before.num_accepted_tokens
    return {
        **median_of(runs),
        "num_drafts": drafts,
        "acceptance_rate": accepted / max(1, after.num_draft_tokens - stats_before.num_draft_tokens),
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
        "switch": engine.executors[0].spec_switch.describe(),
        "pipeline": step_waits(counts_before, engine.ports[0].pipeline_counts),
        **tree_lookups(engine),
    }


class GcPauses:
    """The process's cyclic-collector passes and their wall time, as they happen (every
    engine of the run shares the process, so a pass stalls every one of them)."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.seconds = 0.0
        self._start = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.passes[info["generation"]] += 1
            self.seconds += time.perf_counter() - self._start

    def snapshot(self) -> tuple[list[int], float]:
        return list(self.passes), self.seconds


def gc_over(before: tuple[list[int], float], after: tuple[list[int], float]) -> dict:
    return {"passes": [b - a for a, b in zip(before[0], after[0], strict=True)],
            "ms": round(1e3 * (after[1] - before[1]), 1)}


def step_waits(before, after) -> dict:
    """What a row's steps waited for (the pipeline's counts over the row): how many, the
    share prepared after the step before them ended (serial), the share queued to an idle
    step thread, and the prepares' mean wait."""
    steps = max(1, after.steps - before.steps)
    return {
        "steps": after.steps - before.steps,
        "serial_share": (after.serial_steps - before.serial_steps) / steps,
        "idle_start_share": (after.idle_starts - before.idle_starts) / steps,
        "prepare_wait_us_per_step": 1e6 * (after.prepare_wait_s - before.prepare_wait_s) / steps,
    }


REPEAT_SEED = 1_000
"""A repeat's prompts come from seed + REPEAT_SEED x repeat."""


def median_of(runs: list[tuple[list, float, list[float], int]]) -> dict:
    """A row's output tok/s, TPOT and its slowest request's TPOT: the medians over its
    repeats, each (outputs, seconds, TPOTs, output tokens); `outputs` are the first
    repeat's, `all_outputs` every repeat's."""
    rates = [num_tokens / seconds for _, seconds, _, num_tokens in runs]
    tpots = [1e3 * sum(t) / max(1, len(t)) for _, _, t, _ in runs]
    slowest = [1e3 * max(t, default=0.0) for _, _, t, _ in runs]
    return {
        "output_tok_s": statistics.median(rates),
        "tpot_ms": statistics.median(tpots),
        "tpot_ms_slowest": statistics.median(slowest),  # a batch ends with its slowest request
        "output_tok_s_runs": rates,
        "outputs": runs[0][0],
        "all_outputs": [o for outputs, _, _, _ in runs for o in outputs],
    }


def tree_lookups(engine) -> dict:
    """radix: the tree lookups so far (count, found, mean wall time on the loop)."""
    if not engine.prefetches:
        return {}
    p = engine.prefetches[0]
    return {"tree_lookups": p.num_lookups, "tree_found": p.num_found,
            "tree_lookup_ms": 1e3 * p.lookup_seconds / max(1, p.num_lookups),
            "tree_drafts": p.proposer.num_tree_drafts}


def bench_serve(args, mode: str, tokenizer) -> dict:
    from bench.spec_serve import BatchClient, ServedMesh

    vocab = len(tokenizer)
    extra = [
        "--max-restarts", "0", "--num-speculative-tokens", str(args.num_speculative_tokens),
        "--num-pages", str(args.num_pages or pages_for(args)),  # as in process; a quick start
        *(["--batch-invariant"] if args.batch_invariant else []),
    ]  # fmt: skip
    mesh = ServedMesh(args.model, args.device, "off" if mode == CONTROL else mode, args.port, extra)
    rows = {}
    failed = True
    client = None
    try:
        client = BatchClient(mesh.url, args.client_processes)
        serve_batch = client.run_batch
        started = time.perf_counter()
        for prompts in warm_shapes(args, tokenizer, vocab):  # untimed: every measured shape
            serve_batch(prompts, min(args.output_len, WARM_OUTPUT_LEN))
        print(f"serve --speculative {mode}: warm-up of every measured shape in "
              f"{time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        for workload in args.workloads:
            for batch in args.batch_sizes:
                runs, totals = [], {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
                for repeat in range(args.repeats):  # new prompts each: nothing drafts from the last
                    seed = args.seed + REPEAT_SEED * repeat
                    prompts = make_prompts(workload, batch, tokenizer, vocab, seed, args.prompt_len, args.output_len)
                    if workload == "multi_turn":
                        answers, _, _, _ = serve_batch(prompts, args.output_len)
                        prompts = [
                            p + tokenizer.encode(a, add_special_tokens=False) + p
                            for p, a in zip(prompts, answers, strict=True)
                        ]
                    if workload == "repeat":  # the first round, unmeasured
                        serve_batch(prompts, args.output_len)
                    texts, seconds, tpots, spec = serve_batch(prompts, args.output_len)
                    runs.append((texts, seconds, tpots, spec["num_tokens"]))
                    for name in totals:
                        totals[name] += spec[name]
                drafts = totals["num_drafts"]
                rows[f"{workload}/b{batch}"] = {
                    **median_of(runs),
                    "num_drafts": drafts,
                    "acceptance_rate": totals["num_accepted_tokens"] / max(1, totals["num_draft_tokens"]),
                    "mean_acceptance_length": 1 + totals["num_accepted_tokens"] / drafts if drafts else None,
                }
                row = rows[f"{workload}/b{batch}"]
                print(f"{mode:<7} {workload:<11} b{batch:<4} {row['output_tok_s']:10.1f} tok/s  "
                      f"TPOT {row['tpot_ms']:7.2f} ms  drafts {drafts}", flush=True)
        switch = mesh.switch_state()
        print(f"{mode:<7} speculation switch through serve: {json.dumps(switch)}", flush=True)
        for row in rows.values():
            row["switch"] = switch  # the executor's, after the mode's last row
        failed = False
    finally:
        mesh.stop(failed)  # first: a stream still open ends with the mesh
        if client is not None:
            client.close()
    return rows


def same_as_smaller_batches(rows: dict[str, dict], key: str) -> bool:
    """Whether the row's outputs begin with those of every smaller batch of its workload (a
    batch's prompts are the first ones of every larger batch's)."""
    workload, batch = key.rsplit("/b", 1)
    outputs = rows[key]["outputs"]
    smaller = [int(k.rsplit("/b", 1)[1]) for k in rows if k.rsplit("/b", 1)[0] == workload]
    return all(
        rows[f"{workload}/b{b}"]["outputs"] == outputs[:b] for b in smaller if b < int(batch)
    )


def speedups(rates: list[float], off_rates: list[float]) -> dict:
    """A row's speed over speculation off, three ways: the ratio of the medians
    (speedup_vs_off); the median of each repeat's ratio to off's batch of the same prompts,
    run next to it (speedup_paired: a drift of the machine's speed cancels in each pair);
    the ratio of the fastest batches (speedup_best: a stall from outside the process only
    ever slows a batch, so each side's fastest is its least disturbed)."""
    return {
        "speedup_vs_off": statistics.median(rates) / statistics.median(off_rates),
        "speedup_paired": statistics.median(a / b for a, b in zip(rates, off_rates, strict=True)),
        "speedup_best": max(rates) / max(off_rates),
    }


def summarize(results: dict[str, dict], batch_invariant: bool = False) -> dict:
    off = results["off"]
    summary = {}
    for mode, rows in results.items():
        for key, row in rows.items():
            entry = {k: v for k, v in row.items() if k not in ("outputs", "all_outputs")}
            entry.update(speedups(row["output_tok_s_runs"], off[key]["output_tok_s_runs"]))
            entry["identical"] = row["all_outputs"] == off[key]["all_outputs"]
            entry["same_as_smaller_batches"] = same_as_smaller_batches(rows, key)
            entry["batch_invariant"] = batch_invariant
            summary[f"{mode}/{key}"] = entry
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model folder (bench/train_tiny.py's)")
    p.add_argument("--device", default="auto")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--prompt-len", type=int, default=512, help="most prompt tokens (cut from the left)")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-speculative-tokens", type=int, default=SpeculativeConfig().max_draft_tokens)
    p.add_argument("--speculative-max-batch-size", type=int, default=None,
                   help="a fixed cap (default: measured at start-up on CUDA, 8 on the CPU)")
    p.add_argument("--num-pages", type=int, default=None,
                   help="KV pages of each engine, and of the served executor (default: pages_for)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1,
                   help="timed batches per row, each of new prompts; the row's numbers are their medians")
    p.add_argument("--json", default=None)
    p.add_argument("--default-gc", action="store_true",
                   help="leave the collector at CPython's defaults (the engines tune it: services/common/gc_policy.py)")
    p.add_argument("--control", action="store_true",
                   help=f"a second speculation-off engine ({CONTROL!r}): its ratio to off is the run's noise floor")
    p.add_argument("--switch-interval-us", type=int, default=0,
                   help="the interpreter's thread switch interval (default: CPython's 5,000 us)")
    p.add_argument("--mode", default="inprocess", choices=("inprocess", "serve"))
    p.add_argument("--port", type=int, default=18080, help="--mode serve: the public port")
    p.add_argument("--client-processes", type=int, default=min(8, max(1, (os.cpu_count() or 2) // 2)),
                   help="--mode serve: processes the batch's streams are dealt to (bench/spec_serve.py)")
    p.add_argument("--smoke", action="store_true", help="batch 1 and 2, short outputs")
    p.add_argument("--batch-invariant", action="store_true",
                   help="every engine (mesh) in the batch-invariant mode: outputs must be identical at every batch size")
    args = p.parse_args(argv)
    if args.smoke:
        args.batch_sizes, args.output_len, args.prompt_len = [1, 2], 8, 96
    if "off" not in args.modes:
        args.modes = ["off", *args.modes]
    if args.control and CONTROL not in args.modes:
        args.modes = [*args.modes, CONTROL]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model is None:
        from mesh.tiny_model import ensure_default_model

        args.model = str(ensure_default_model())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if args.switch_interval_us:
        sys.setswitchinterval(args.switch_interval_us * 1e-6)
    if args.mode == "serve":
        # a time limit's SIGTERM unwinds like an error: each mesh is stopped and its logs shown
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        results = {mode: bench_serve(args, mode, tokenizer) for mode in args.modes}
    else:
        results = asyncio.run(bench_modes(args, tokenizer))
    summary = summarize(results, args.batch_invariant)
    print(f"batch-invariant mode: {'on' if args.batch_invariant else 'off'}")
    for key, row in summary.items():
        print(f"{key:<28} x{row['speedup_vs_off']:.2f} (paired x{row['speedup_paired']:.2f}, best "
              f"x{row['speedup_best']:.2f})  identical {row['identical']}  "
              f"same as smaller batches {row['same_as_smaller_batches']}  "
              f"acceptance length {row['mean_acceptance_length']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": summary}, indent=1))
    return exit_status(summary, args.batch_invariant)


def exit_status(summary: dict[str, dict], batch_invariant: bool) -> int:
    """1 when a promise of identical outputs was broken, else 0. Only the batch-invariant
    mode promises them: outside it a verification's k + 1 rows may run other matrix kernels
    than a one-row decode, so greedy outputs can part at a near-tie (reported per row as
    "identical", not a failure of the run)."""
    if not batch_invariant:
        return 0
    return 0 if all(r["identical"] and r["same_as_smaller_batches"] for r in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
