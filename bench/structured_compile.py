"""JSON-schema compile times over the project's schema corpus, cold and cached.

For each schema of tests/data/schema_corpus.jsonl that strict mode accepts:
the plan (radixmesh.schema: classification and rewrite, run at the gateway and
again at the executor), the cold compile (an empty grammar cache), and the
cached compile (the same constraint again: the cache lookup a repeated schema
pays). Reports p50/p99 of each in ms, and the JSON decode latency a cached
schema adds to a request of `--output-len` tokens at the measured per-token
mask cost (`--mask-us-per-token`, from `python -m bench.structured` at batch 64).

    python -m bench.structured --mode corpus --model DIR [--synthetic-vocab 128256]
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Constraint, ConstraintKind
from radixmesh.schema import check_enforceable, plan_json_schema, plan_schema_text
from services.executor.core.grammar import GrammarConfig, GrammarService

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "data" / "schema_corpus.jsonl"


def _p(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def strict_schemas() -> list[dict]:
    out = []
    for line in CORPUS.read_text().splitlines():
        schema = json.loads(line)["schema"]
        try:
            check_enforceable(plan_json_schema(schema), "schema")
        except InvalidArgument:
            continue
        out.append(schema)
    return out


def bench_corpus(service: GrammarService) -> dict[str, list[float]]:
    """Seconds per schema: plan (first and cached), cold compile (a fresh cache), cached compile."""
    cold_service = GrammarService(
        service.tokenizer_info, GrammarConfig(compile_timeout_s=120, cache_size=4096)
    )
    times: dict[str, list[float]] = {"plan": [], "plan_cached": [], "cold": [], "cached": []}
    try:
        for schema in strict_schemas():
            text = json.dumps(schema)
            start = time.perf_counter()
            plan_json_schema(schema)
            times["plan"].append(time.perf_counter() - start)
            plan_schema_text(text)
            start = time.perf_counter()
            plan_schema_text(text)  # the gateway's plan of a schema it has seen
            times["plan_cached"].append(time.perf_counter() - start)
            constraint = Constraint(ConstraintKind.JSON_SCHEMA, text)
            start = time.perf_counter()
            cold_service.compile_sync(constraint)
            times["cold"].append(time.perf_counter() - start)
            start = time.perf_counter()
            cold_service.compile_sync(constraint)
            times["cached"].append(time.perf_counter() - start)
    finally:
        cold_service.close()
    return times


def report_corpus(title: str, service: GrammarService, mask_us: float, output_len: int) -> None:
    times = bench_corpus(service)
    print(f"\n### {title}: {len(times['cold'])} corpus schemas, vocab {service.vocab_size}\n")
    print("| per schema | p50 ms | p99 ms | max ms |")
    print("| --- | ---: | ---: | ---: |")
    for name, samples in times.items():
        ms = [s * 1e3 for s in samples]
        print(f"| {name} | {statistics.median(ms):.2f} | {_p(ms, 0.99):.2f} | {max(ms):.2f} |")
    cached_p99 = (_p(times["cached"], 0.99) + _p(times["plan_cached"], 0.99)) * 1e3
    decode_ms = cached_p99 + mask_us * output_len / 1e3
    print(
        f"\nJSON decode latency, cached schema, {output_len} output tokens at {mask_us:.1f} us "
        f"mask per token: {decode_ms:.2f} ms (plan + cache lookup p99 {cached_p99:.2f} ms)"
    )
