"""Structured output costs: compile times, and the per-step host bitmask at batch 64.

Per step, an executor with constrained sequences fills one bitmask row per
sequence on the host (overlapped with the device's forward pass), copies the
bitmask to the device, applies it to the logits, and after sampling advances
each matcher by its token. This script times each part on a batch of
sequences held at different points of their outputs (random logits sampled
through the mask), and the cold compile of a set of constraints.

Vocabularies: the tiny model's tokenizer (`--model DIR`, default: written to a
temporary folder), and a synthetic one of `--synthetic-vocab` tokens (default
128256, Llama 3's width) cut from the tiny corpus, for a realistic mask width.

    python -m bench.structured                       # both vocabularies, batch 64
    python -m bench.structured --batch-size 128 --steps 200

`--mode engine` runs the in-process Engine instead: `--batch-size` requests under a JSON
Schema (an array of PERSON records, long enough that every request runs to max_tokens) and
the same prompts unconstrained (ignore_eos), in alternating rounds, and reports time per
output token of both, their ratio, where the constrained step's extra time goes, and how
many output tokens the grammar forced (one allowed token: what jump-forward could skip).

    python -m bench.structured --mode engine --rounds 3 --output-len 64

`--mode corpus` compiles the project's schema corpus (bench/structured_compile.py): plan,
cold and cached compile p50/p99 per schema, and the JSON decode latency of a cached schema.

    python -m bench.structured --mode corpus --mask-us-per-token 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import statistics
import tempfile
import time

import numpy as np
import torch
import xgrammar as xgr

from mesh.tiny_model import corpus_text, ensure_default_model, write_tiny_model
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from services.common.logging import configure_logging
from services.executor.core.grammar import (
    ConstraintMatcher,
    GrammarConfig,
    GrammarService,
    PendingMasks,
    fill_batch_bitmask,
)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "[a-z]{1,12}@[a-z]{1,12}\\.(com|org|net)"},
        "tags": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 60},
                "city": {"type": "string", "maxLength": 30},
                "zip": {"type": "string", "pattern": "\\d{5}"},
            },
            "required": ["street", "city"],
        },
        "score": {"type": "number", "minimum": -10, "maximum": 10},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "address"],
}


def _wide_schema(num_props: int) -> dict:
    names = [f"field_{i}" for i in range(num_props)]
    kinds = [{"type": "string", "maxLength": 20}, {"type": "integer"}, {"type": "boolean"}]
    properties = {name: kinds[i % 3] for i, name in enumerate(names)}
    return {"type": "object", "properties": properties, "required": names[::2]}


def _nested_schema(depth: int) -> dict:
    schema: dict = {"type": "string", "maxLength": 10}
    for level in range(depth):
        schema = {
            "type": "object",
            "properties": {f"level{level}": schema, "items": {"type": "array", "items": schema}},
            "required": [f"level{level}"],
        }
    return schema


def compile_set() -> dict[str, Constraint]:
    js = ConstraintKind.JSON_SCHEMA
    return {
        "json_object": Constraint(ConstraintKind.JSON_OBJECT),
        "schema person (7 props, nested)": Constraint(js, json.dumps(PERSON)),
        "schema 50 props": Constraint(js, json.dumps(_wide_schema(50))),
        "schema 200 props": Constraint(js, json.dumps(_wide_schema(200))),
        "schema nested depth 6": Constraint(js, json.dumps(_nested_schema(6))),
        "regex phone": Constraint(ConstraintKind.REGEX, r"\(\d{3}\) \d{3}-\d{4}"),
        "regex email": Constraint(
            ConstraintKind.REGEX, r"[a-z0-9._]{1,20}@[a-z]{1,15}\.[a-z]{2,4}"
        ),
        "ebnf arithmetic": Constraint(
            ConstraintKind.EBNF,
            'root ::= expr\nexpr ::= term (("+" | "-") term)*\n'
            'term ::= factor (("*" | "/") factor)*\nfactor ::= [0-9]+ | "(" expr ")"',
        ),
        "choices 20": Constraint(
            ConstraintKind.CHOICES, choices=tuple(f"option {i}" for i in range(20))
        ),
    }


def synthetic_tokenizer_info(vocab_size: int, seed: int = 0) -> xgr.TokenizerInfo:
    """A BPE-like vocabulary of any width: an end token at id 0, the 256 single bytes,
    pieces of the tiny corpus's words (with and without a leading space, capitalized or
    not), numbers below 1000, short punctuation runs and whitespace runs; random letter
    strings fill the rest. About 1% of its tokens hold a double quote, as in real ones."""
    rng = random.Random(seed)
    words = sorted(set(re.findall(r"[a-z]+", corpus_text().lower())))
    pieces = {w[i:j] for w in words for i in range(len(w)) for j in range(i + 2, len(w) + 1)}
    punct = " \"'{}[]()<>,.:;!?-_/\\=+*&%$#@"
    candidates = [b"<|eos|>"] + [bytes([b]) for b in range(256)]
    candidates += [s.encode() for n in range(1000) for s in (str(n), f" {n}")]
    candidates += [(a + b).encode() for a in punct for b in punct]
    candidates += [b"\n", b"\n\n", b"\t", b"  ", b"    ", b"        "]
    ordered = sorted(pieces, key=lambda p: (len(p), p))
    for piece in ordered[: vocab_size // 100]:  # a punctuation mark fused to a word
        candidates += [f'"{piece}'.encode(), f" ({piece}".encode(), f".{piece}".encode()]
    for piece in ordered:
        candidates += [piece.encode(), f" {piece}".encode()]
        candidates += [piece.capitalize().encode(), f" {piece.capitalize()}".encode()]
    vocab = list(dict.fromkeys(candidates))[:vocab_size]
    seen = set(vocab)
    letters = "abcdefghijklmnopqrstuvwxyz"
    while len(vocab) < vocab_size:
        piece = "".join(rng.choice(letters) for _ in range(rng.randint(3, 8)))
        token = (" " + piece if rng.random() < 0.5 else piece).encode()
        if token not in seen:
            seen.add(token)
            vocab.append(token)
    return xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, stop_token_ids=[0])


def percentiles(samples_ns: list[int]) -> tuple[float, float]:
    ordered = sorted(samples_ns)
    return statistics.median(ordered) / 1e3, ordered[int(0.9 * (len(ordered) - 1))] / 1e3


def bench_compiles(service: GrammarService, repeats: int) -> list[tuple[str, float]]:
    rows = []
    for name, constraint in compile_set().items():
        times = []
        for _ in range(repeats):
            fresh = GrammarService(service.tokenizer_info, GrammarConfig(compile_timeout_s=120))
            times.append(fresh.compile_sync(constraint).compile_seconds)
            fresh.close()
        rows.append((name, statistics.median(times) * 1e3))
    return rows


def _advance(matchers: list[ConstraintMatcher], bitmask: torch.Tensor, gen: torch.Generator):
    """One sampling step through the mask for every live matcher (restarting finished ones)."""
    fill_batch_bitmask(matchers, bitmask)
    logits = torch.randn(len(matchers), bitmask.shape[1] * 32, generator=gen)
    xgr.apply_token_bitmask_inplace(logits, bitmask[: len(matchers)])
    token_ids = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen).flatten()
    for matcher, token_id in zip(matchers, token_ids.tolist(), strict=True):
        if not matcher.accept(token_id) or matcher.is_terminated:
            matcher.reset()


def bench_steps(service: GrammarService, args: argparse.Namespace) -> dict[str, float]:
    """Host costs of one decode step of `batch_size` sequences under the PERSON schema."""
    compiled = service.compile_sync(Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(PERSON)))
    matchers = [service.new_matcher(compiled) for _ in range(args.batch_size)]
    bitmask = service.allocate_bitmask(args.batch_size)
    gen = torch.Generator().manual_seed(0)
    for i, matcher in enumerate(matchers):  # spread the batch over positions in the output
        for _ in range(i % 24):
            _advance([matcher], bitmask, gen)
    batch = xgr.BatchGrammarMatcher(max_threads=args.threads)
    fill_ns, batch_fill_ns, accept_ns, apply_ns = [], [], [], []
    logits = torch.randn(args.batch_size, service.vocab_size)
    clock = time.perf_counter_ns
    for _ in range(args.steps):
        t0 = clock()
        fill_batch_bitmask(matchers, bitmask)
        fill_ns.append(clock() - t0)
        t0 = clock()
        batch.batch_fill_next_token_bitmask([m._matcher for m in matchers], bitmask)
        batch_fill_ns.append(clock() - t0)
        x = logits.clone()
        t0 = clock()
        xgr.apply_token_bitmask_inplace(x, bitmask)
        apply_ns.append(clock() - t0)
        chosen = torch.multinomial(torch.softmax(x, dim=-1), 1, generator=gen).flatten().tolist()
        t0 = clock()
        for matcher, token_id in zip(matchers, chosen, strict=True):
            if not matcher.accept(token_id) or matcher.is_terminated:
                matcher.reset()  # a finished sequence is replaced by a fresh one
        accept_ns.append(clock() - t0)
    out = {}
    for name, samples in (
        ("fill_batch_bitmask (ours, 1 thread)", fill_ns),
        (f"xgrammar BatchGrammarMatcher ({args.threads} threads, no token mask)", batch_fill_ns),
        ("accept (all rows)", accept_ns),
        ("apply on host logits (xgrammar cpu)", apply_ns),
    ):
        median, p90 = percentiles(samples)
        out[name] = (median, p90)
    return out


def _cuda_us(fn, reps: int = 200) -> float:
    """Median device time of fn() in us, by CUDA events."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def bench_device(service: GrammarService, batch_size: int) -> dict[str, float]:
    """Device side of a constrained step: bitmask copy to the GPU, then the apply op."""
    from radixmesh_kernels import get_ops

    host = service.allocate_bitmask(batch_size)
    host.random_(-(2**31), 2**31 - 1)
    device = host.to("cuda")
    logits = torch.randn(batch_size, service.vocab_size, device="cuda")
    apply = get_ops("cuda").apply_bitmask
    return {
        "bitmask copy host->device (pinned, non_blocking)": _cuda_us(
            lambda: device.copy_(host, non_blocking=True)
        ),
        "apply_bitmask, fp32 logits (radixmesh_kernels.get_ops)": _cuda_us(lambda: apply(logits, device)),
        "apply, fp32 logits (xgrammar triton)": _cuda_us(
            lambda: xgr.apply_token_bitmask_inplace(logits, device)
        ),
    }


def report(title: str, service: GrammarService, args: argparse.Namespace) -> None:
    print(f"\n### {title}: vocab {service.vocab_size}, batch {args.batch_size}\n")
    print("| per step (host) | median us | p90 us | median us per sequence |")
    print("| --- | ---: | ---: | ---: |")
    for name, (median, p90) in bench_steps(service, args).items():
        print(f"| {name} | {median:.0f} | {p90:.0f} | {median / args.batch_size:.1f} |")
    if torch.cuda.is_available():
        print(f"\n| per step (device: {torch.cuda.get_device_name()}) | median us |")
        print("| --- | ---: |")
        for name, us in bench_device(service, args.batch_size).items():
            print(f"| {name} | {us:.1f} |")
    print("\n| cold compile | median ms |")
    print("| --- | ---: |")
    for name, ms in bench_compiles(service, args.compile_repeats):
        print(f"| {name} | {ms:.1f} |")


# -- engine mode ---------------------------------------------------------------

PEOPLE = {
    "type": "object",
    "properties": {"people": {"type": "array", "items": PERSON, "minItems": 8}},
    "required": ["people"],
}
"""A list of person records: at least 8 records, so outputs outlast --output-len."""


class _Timers:
    """Seconds and calls per part of the executor's step, per kind of round (`kind`)."""

    def __init__(self) -> None:
        self.kind = "warm-up"
        self.seconds: dict[tuple[str, str], float] = {}
        self.calls: dict[tuple[str, str], int] = {}

    def wrap(self, owner: object, name: str, label: str) -> None:
        """Replaces owner.name (an instance attribute) by a timed call of it."""
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.add(label, time.perf_counter() - start)

        setattr(owner, name, timed)

    def add(self, label: str, seconds: float) -> None:
        key = (self.kind, label)
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds
        self.calls[key] = self.calls.get(key, 0) + 1

    def per_step_us(self, kind: str, label: str) -> float:
        """Mean us per executed step of `kind` rounds (0 if never called)."""
        num_steps = self.calls.get((kind, STEP_LABEL), 0)
        return self.seconds.get((kind, label), 0.0) / max(num_steps, 1) * 1e6


STEP_LABEL = "execute (whole step)"
FILL_LABEL = "bitmask fill (host, incl. accept)"
ACCEPT_LABEL = "grammar accept (the last tokens)"


async def _run_round(engine, prompts, sampling, constraint) -> tuple[list[float], list]:
    """Submits every prompt at once; per-request TPOT (ms) from its token arrival times."""

    async def one(prompt: list[int]):
        first = last = 0.0
        num_tokens = 0
        result = []
        stream = await engine.generate(prompt, sampling, constraint=constraint)
        async for update in stream:
            if update.error is not None:
                raise update.error
            if update.token_ids:
                now = time.perf_counter()
                first, last = first or now, now
                num_tokens += len(update.token_ids)
                result += update.token_ids
        tpot = (last - first) * 1e3 / (num_tokens - 1) if num_tokens > 1 else float("nan")
        return tpot, result

    done = await asyncio.gather(*(one(p) for p in prompts))
    return [t for t, _ in done], [r for _, r in done]


def count_forced(service: GrammarService, constraint: Constraint, outputs: list[list[int]]):
    """(forced, total): output tokens at which the grammar allowed exactly one token."""
    compiled = service.compile_sync(constraint)
    bitmask = service.allocate_bitmask(1)
    forced = total = 0
    for tokens in outputs:
        matcher = service.new_matcher(compiled)
        for token_id in tokens:
            matcher.fill_bitmask(bitmask, 0)
            bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")
            forced += int(bits[: service.vocab_size].sum()) == 1
            total += 1
            if not matcher.accept(token_id):
                break
    return forced, total


async def bench_engine(args: argparse.Namespace, model: str) -> None:
    from mesh.engine import Engine, EngineConfig
    from services.scheduler.core import SchedulerConfig

    service = GrammarService.from_model_dir(model, config=GrammarConfig(compile_timeout_s=120))
    timers = _Timers()
    scheduler = SchedulerConfig(max_num_seqs=args.batch_size, max_queue_len=4 * args.batch_size)
    # room for every request and its lookahead pages at once: no preemption skews the rounds
    pages_per_seq = -(-(args.prompt_len + args.output_len) // 16) + scheduler.page_lookahead + 1
    config = EngineConfig.for_model(
        model,
        scheduler=scheduler,
        device=args.device,
        page_size=16,
        num_pages=args.batch_size * pages_per_seq,
        max_num_seqs=args.batch_size,
    )
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(PEOPLE))
    rng = random.Random(0)
    rounds: list[dict] = []
    async with Engine(config, grammar=service) as engine:
        core = engine.executors[0]
        vocab = core.info.vocab_size
        prompts = [
            [rng.randrange(vocab // 4, vocab) for _ in range(args.prompt_len)]
            for _ in range(args.batch_size)
        ]
        timers.wrap(core, "execute", STEP_LABEL)
        timers.wrap(core.model, "forward", "forward")
        if args.fill == "serial":  # profiling: the fill after the forward, on the step's thread
            step = core._grammar
            step.start = lambda rows, output_lens: PendingMasks(step, rows, output_lens, None)
        timers.wrap(core._grammar, "_fill", FILL_LABEL)
        timers.wrap(core._grammar, "_upload", "bitmask upload")
        timers.wrap(core.sampler, "sample", "sample (incl. bitmask apply)")
        timers.wrap(service, "accept_batch", ACCEPT_LABEL)  # inside the fill, beside the forward
        warm = SamplingParams(max_tokens=8, temperature=0.0)
        await _run_round(engine, prompts[:8], warm, constraint)
        await _run_round(engine, prompts[:8], warm, None)
        sampling = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
        for _ in range(args.rounds):
            row: dict = {}
            for kind in ("unconstrained", "constrained"):
                timers.kind = kind
                tpots, outputs = await _run_round(
                    engine, prompts, sampling, constraint if kind == "constrained" else None
                )
                row[kind] = (statistics.mean(tpots), statistics.median(tpots))
                row[f"{kind} outputs"] = outputs
            rounds.append(row)
    _report_engine(args, rounds, timers)
    outputs = rounds[-1]["constrained outputs"]
    forced, total = count_forced(service, constraint, outputs)
    share = forced / max(total, 1)
    print(f"\nforced output tokens (the grammar allowed exactly one): {forced} of {total}")
    print(f"({100 * share:.1f}%): jump-forward could save at most that share of decode steps")
    print(f"(at most {1 / (1 - share):.2f}x fewer steps per output)")
    service.close(wait=True)


def _report_engine(args: argparse.Namespace, rounds: list[dict], timers: _Timers) -> None:
    print(f"\n### engine, batch {args.batch_size}, prompt {args.prompt_len}, ", end="")
    print(f"output {args.output_len} tokens, greedy, device {args.device}, fill {args.fill}\n")
    print("| round | unconstrained TPOT mean / p50 ms | constrained TPOT mean / p50 ms |", end="")
    print(" ratio (mean) | constrained outputs short of max_tokens |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for i, row in enumerate(rounds):
        (um, up), (cm, cp) = row["unconstrained"], row["constrained"]
        short = sum(len(o) < args.output_len for o in row["constrained outputs"])
        print(f"| {i + 1} | {um:.2f} / {up:.2f} | {cm:.2f} / {cp:.2f} | {cm / um:.3f} | {short} |")
    labels = [
        STEP_LABEL,
        "forward",
        "sample (incl. bitmask apply)",
        FILL_LABEL,
        ACCEPT_LABEL,
        "bitmask upload",
    ]
    print("\n| per executed step (all rounds) | unconstrained us | constrained us |")
    print("| --- | ---: | ---: |")
    for label in labels:
        u = timers.per_step_us("unconstrained", label)
        c = timers.per_step_us("constrained", label)
        print(f"| {label} | {u:.0f} | {c:.0f} |")
    ratios = sorted(row["constrained"][0] / row["unconstrained"][0] for row in rounds)
    print(f"\nTPOT ratio constrained / unconstrained over {len(rounds)} rounds: median ", end="")
    print(f"{statistics.median(ratios):.3f}, range {ratios[0]:.3f} to {ratios[-1]:.3f}")
    step_u, step_c = (timers.per_step_us(k, STEP_LABEL) for k in ("unconstrained", "constrained"))
    fwd_u, fwd_c = (timers.per_step_us(k, "forward") for k in ("unconstrained", "constrained"))
    extra = (step_c - fwd_c) - (step_u - fwd_u)
    print(f"grammar cost outside the forward: {extra:.0f} us per step, ", end="")
    print(f"{100 * extra / step_u:.1f}% of the unconstrained step")


def _corpus(args: argparse.Namespace) -> None:
    from bench.structured_compile import report_corpus

    def mask_us(service: GrammarService) -> float:
        """Host mask cost per token: our fill, apply and accept at --batch-size, per row."""
        if args.mask_us_per_token:
            return args.mask_us_per_token
        steps = bench_steps(service, args)
        ours = [m for name, (m, _) in steps.items() if not name.startswith("xgrammar Batch")]
        return sum(ours) / args.batch_size

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or write_tiny_model(tmp, arch="llama", seed=0)
        service = GrammarService.from_model_dir(model)
        report_corpus("model tokenizer", service, mask_us(service), args.output_len)
    if args.synthetic_vocab:
        service = GrammarService(synthetic_tokenizer_info(args.synthetic_vocab))
        report_corpus("synthetic vocabulary", service, mask_us(service), args.output_len)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a Hugging Face model folder (default: the tiny model)")
    parser.add_argument("--synthetic-vocab", type=int, default=128256, help="0 skips it")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=8, help="for xgrammar's batch matcher")
    parser.add_argument("--compile-repeats", type=int, default=3)
    parser.add_argument("--mode", choices=("host", "engine", "corpus"), default="host")
    parser.add_argument(
        "--mask-us-per-token",
        type=float,
        default=0.0,
        help="corpus: host mask cost per token (default: measured at --batch-size)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="engine: rounds of both kinds")
    parser.add_argument("--prompt-len", type=int, default=32, help="engine: prompt tokens")
    parser.add_argument("--output-len", type=int, default=64, help="engine: output tokens")
    parser.add_argument("--device", default="auto", help="engine: cpu, cuda or auto")
    parser.add_argument(
        "--fill",
        choices=("overlap", "serial"),
        default="overlap",
        help="engine, CPU: fill the bitmask beside the forward (the executor's way) or after it",
    )
    args = parser.parse_args()
    print(f"host: {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}")
    if args.mode == "engine":
        configure_logging("bench", level="warning", json=False)
        model = args.model or str(ensure_default_model())
        asyncio.run(bench_engine(args, model))
        return
    if args.mode == "corpus":
        _corpus(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or write_tiny_model(tmp, arch="llama", seed=0)
        report("tiny model tokenizer", GrammarService.from_model_dir(model), args)
    if args.synthetic_vocab:
        info = synthetic_tokenizer_info(args.synthetic_vocab)
        report("synthetic vocabulary", GrammarService(info), args)


if __name__ == "__main__":
    main()
