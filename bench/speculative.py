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
medians (every repeat's tok/s in "output_tok_s_runs"). With
--batch-invariant every engine runs in that mode (`batch_invariant` in each JSON row and
in the table's header line), where they must be identical at every batch size too:
"same_as_smaller_batches" says whether a row's outputs begin with every smaller batch's of
its workload (a batch's prompts are the first ones of every larger batch's), and in the
mode the exit status is 1 when one does not. `--mode serve`
runs the same through `radixmesh serve` (bench/spec_serve.py), one mesh per mode.

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
import json
import random
import re
import statistics
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
    found = []
    for text in sources:
        for m in re.finditer(r"\n(def [^\n]+\n(?:(?:    [^\n]*)?\n){4,40})", text):
            found.append(m.group(1))
    return found


def docstrings(sources: list[str]) -> list[str]:
    return [m.group(1) for t in sources if (m := re.match(r'\s*"""(.{200,1500}?)"""', t, re.S))]


def json_value(rng: random.Random, sources: list[str]) -> str | int:
    """A word from a random source (or a number half the time, or when the pick has none)."""
    words = rng.choice(sources)[rng.randrange(1000) :][:12].split()
    return words[0] if words and rng.random() < 0.5 else rng.randrange(10**6)


def make_texts(workload: str, n: int, rng: random.Random, sources: list[str]) -> list[str]:
    if workload == "code_edit":
        funcs = functions(sources)
        picks = [rng.choice(funcs) for _ in range(n)]
        return [f"{f}\n# The same function with one name changed:\n{f.splitlines()[0]}\n" for f in picks]
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


def make_prompts(workload: str, n: int, tokenizer, vocab: int, seed: int, prompt_len: int) -> list[list[int]]:
    rng = random.Random(seed + 7919 if workload == "repeat" else seed)  # not random's prompts
    if workload in ("random", "repeat"):
        return [[rng.randrange(10, vocab) for _ in range(prompt_len)] for _ in range(n)]
    texts = make_texts("code_edit" if workload == "multi_turn" else workload, n, rng, stdlib_sources())
    return [tokenizer.encode(t, add_special_tokens=False)[-prompt_len:] for t in texts]


WARM_OUTPUT_LEN = 32
WARM_SEED = 10_007
"""The warm-up's prompts' seed: token ids no measured prompt starts with."""


def warm_prompts(args, workload: str, batch: int, tokenizer, vocab: int) -> list[list[int]]:
    """Prompts of the measured shape of (workload, batch): the same lengths (multi_turn's
    second turn: prompt + answer + prompt), random token ids of WARM_SEED."""
    measured = make_prompts(workload, batch, tokenizer, vocab, args.seed, args.prompt_len)
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


async def bench_mode(args, mode: str, tokenizer) -> dict:
    spec = SpeculativeConfig(
        method=mode, max_draft_tokens=args.num_speculative_tokens, max_batch_size=args.speculative_max_batch_size
    )
    config = EngineConfig.for_model(
        args.model,
        scheduler=SchedulerConfig(max_num_seqs=max(args.batch_sizes), max_queue_len=4096),
        device=args.device,
        max_num_seqs=max(args.batch_sizes),
        speculative=spec,
        batch_invariant=args.batch_invariant,
        **({"num_pages": args.num_pages} if args.num_pages else {}),
    )
    rows = {}
    async with Engine(config) as engine:
        vocab = engine.executors[0].info.vocab_size
        switch = engine.executors[0].spec_switch
        print(f"{mode:<7} speculation switch: {switch.describe()}; CUDA graph bytes (estimated, "
              f"measured): {engine.executors[0].graph_bytes}", flush=True)
        for prompts in warm_shapes(args, tokenizer, vocab):  # untimed: every measured shape
            await run_batch(engine, prompts, min(args.output_len, WARM_OUTPUT_LEN))
        for workload in args.workloads:
            for batch in args.batch_sizes:
                before = engine.executors[0].spec_stats.snapshot()
                runs = []
                for repeat in range(args.repeats):  # new prompts each: nothing drafts from the last
                    seed = args.seed + REPEAT_SEED * repeat
                    prompts = make_prompts(workload, batch, tokenizer, vocab, seed, args.prompt_len)
                    if workload == "multi_turn":  # turn 1, then its prompt + answer + the prompt again
                        answers, _, _ = await run_batch(engine, prompts, args.output_len)
                        prompts = [p + a + p for p, a in zip(prompts, answers, strict=True)]
                    if workload == "repeat":  # the first round, unmeasured
                        await run_batch(engine, prompts, args.output_len)
                    outputs, seconds, tpots = await run_batch(engine, prompts, args.output_len)
                    runs.append((outputs, seconds, tpots, sum(map(len, outputs))))
                after = engine.executors[0].spec_stats.snapshot()
                drafts = after.num_drafts - before.num_drafts
                accepted = after.num_accepted_tokens - before.num_accepted_tokens
                rows[f"{workload}/b{batch}"] = {
                    **median_of(runs),
                    "num_drafts": drafts,
                    "acceptance_rate": accepted / max(1, after.num_draft_tokens - before.num_draft_tokens),
                    "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
                    "switch": switch.describe(),
                    **tree_lookups(engine),
                }
                print(f"{mode:<7} {workload:<11} b{batch:<4} {rows[f'{workload}/b{batch}']['output_tok_s']:10.1f} tok/s  "
                      f"TPOT {rows[f'{workload}/b{batch}']['tpot_ms']:7.2f} ms (slowest "
                      f"{rows[f'{workload}/b{batch}']['tpot_ms_slowest']:.2f})  drafts {drafts}", flush=True)
    return rows


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
    from bench.spec_serve import ServedMesh
    from bench.spec_serve import run_batch as serve_batch

    vocab = len(tokenizer)
    extra = ["--max-restarts", "0", *(["--batch-invariant"] if args.batch_invariant else [])]
    mesh = ServedMesh(args.model, args.device, mode, args.port, extra)
    rows = {}
    try:
        for prompts in warm_shapes(args, tokenizer, vocab):  # untimed: every measured shape
            serve_batch(mesh.url, prompts, min(args.output_len, WARM_OUTPUT_LEN))
        for workload in args.workloads:
            for batch in args.batch_sizes:
                runs, totals = [], {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
                for repeat in range(args.repeats):  # new prompts each: nothing drafts from the last
                    seed = args.seed + REPEAT_SEED * repeat
                    prompts = make_prompts(workload, batch, tokenizer, vocab, seed, args.prompt_len)
                    if workload == "multi_turn":
                        answers, _, _, _ = serve_batch(mesh.url, prompts, args.output_len)
                        prompts = [
                            p + tokenizer.encode(a, add_special_tokens=False) + p
                            for p, a in zip(prompts, answers, strict=True)
                        ]
                    if workload == "repeat":  # the first round, unmeasured
                        serve_batch(mesh.url, prompts, args.output_len)
                    texts, seconds, tpots, spec = serve_batch(mesh.url, prompts, args.output_len)
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
    finally:
        mesh.stop()
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


def summarize(results: dict[str, dict], batch_invariant: bool = False) -> dict:
    off = results["off"]
    summary = {}
    for mode, rows in results.items():
        for key, row in rows.items():
            entry = {k: v for k, v in row.items() if k not in ("outputs", "all_outputs")}
            entry["speedup_vs_off"] = row["output_tok_s"] / off[key]["output_tok_s"]
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
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--speculative-max-batch-size", type=int, default=None,
                   help="a fixed cap (default: measured at start-up on CUDA, 8 on the CPU)")
    p.add_argument("--num-pages", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1,
                   help="timed batches per row, each of new prompts; the row's numbers are their medians")
    p.add_argument("--json", default=None)
    p.add_argument("--mode", default="inprocess", choices=("inprocess", "serve"))
    p.add_argument("--port", type=int, default=18080, help="--mode serve: the public port")
    p.add_argument("--smoke", action="store_true", help="batch 1 and 2, short outputs")
    p.add_argument("--batch-invariant", action="store_true",
                   help="every engine (mesh) in the batch-invariant mode: outputs must be identical at every batch size")
    args = p.parse_args(argv)
    if args.smoke:
        args.batch_sizes, args.output_len, args.prompt_len = [1, 2], 8, 96
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model is None:
        from mesh.tiny_model import ensure_default_model

        args.model = str(ensure_default_model())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if "off" not in args.modes:
        args.modes = ["off", *args.modes]
    if args.mode == "serve":
        results = {mode: bench_serve(args, mode, tokenizer) for mode in args.modes}
    else:
        results = {mode: asyncio.run(bench_mode(args, mode, tokenizer)) for mode in args.modes}
    summary = summarize(results, args.batch_invariant)
    print(f"batch-invariant mode: {'on' if args.batch_invariant else 'off'}")
    for key, row in summary.items():
        print(f"{key:<28} x{row['speedup_vs_off']:.2f}  identical {row['identical']}  "
              f"same as smaller batches {row['same_as_smaller_batches']}  "
              f"acceptance length {row['mean_acceptance_length']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": summary}, indent=1))
    identical = all(r["identical"] for r in summary.values())
    if args.batch_invariant:  # the mode also promises the same outputs at every batch size
        identical = identical and all(r["same_as_smaller_batches"] for r in summary.values())
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
