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
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import tempfile
import time

import torch
import xgrammar as xgr

from radixmesh.tiny_model import corpus_text, write_tiny_model
from services.common.sampling import Constraint, ConstraintKind
from services.executor.core.grammar import GrammarConfig, GrammarService
from services.executor.core.grammar_matcher import ConstraintMatcher, fill_batch_bitmask

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
    from kernels import get_ops

    host = service.allocate_bitmask(batch_size)
    host.random_(-(2**31), 2**31 - 1)
    device = host.to("cuda")
    logits = torch.randn(batch_size, service.vocab_size, device="cuda")
    apply = get_ops("cuda").apply_bitmask
    return {
        "bitmask copy host->device (pinned, non_blocking)": _cuda_us(
            lambda: device.copy_(host, non_blocking=True)
        ),
        "apply_bitmask, fp32 logits (kernels.get_ops)": _cuda_us(lambda: apply(logits, device)),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a Hugging Face model folder (default: the tiny model)")
    parser.add_argument("--synthetic-vocab", type=int, default=128256, help="0 skips it")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=8, help="for xgrammar's batch matcher")
    parser.add_argument("--compile-repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"host: {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or write_tiny_model(tmp, arch="llama", seed=0)
        report("tiny model tokenizer", GrammarService.from_model_dir(model), args)
    if args.synthetic_vocab:
        info = synthetic_tokenizer_info(args.synthetic_vocab)
        report("synthetic vocabulary", GrammarService(info), args)


if __name__ == "__main__":
    main()
