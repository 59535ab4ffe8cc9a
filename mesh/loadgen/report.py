"""The bench report: plain JSON-ready data from the results and the metrics deltas, and its table.

duration_s runs from the first measured send to the end of the last measured
request; throughputs divide by it. Latency statistics are {mean, p50, p90,
p99} in seconds (percentiles by linear interpolation between order
statistics). Anything not measured is None (JSON null), never 0: GPU numbers
on CPU, server TTFT without the scheduler's histogram, JSON numbers without
JSON requests.

    kv_cache_hit_rate  = increase of radixmesh_scheduler_cached_prompt_tokens_sum
                         / increase of radixmesh_scheduler_prompt_tokens_total
                         (prompt tokens served from the KV cache at admission); where the
                         scheduler does not export them, kv_cache_lookup_hit_rate
    kv_cache_lookup_hit_rate = increase of radixmesh_cache_prefix_hit_tokens_total
                         / increase of radixmesh_cache_prefix_query_tokens_total
                         (every lookup: routing's match on each pool at arrival, before
                         a prefix that arrives with many requests is computed, counts
                         as a miss, so this falls with concurrency while the reuse
                         does not)
    prefix_reuse_rate  = sum of usage cached_tokens / sum of usage prompt_tokens
                         (what the requests of the run reused, as the server reports)
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from mesh.loadgen.client import RequestResult
from mesh.loadgen.goodput import held_share
from mesh.loadgen.runner import LoadRun
from mesh.loadgen.scrape import (
    HistogramDelta,
    Snapshot,
    TimePoint,
    delta,
    histogram_delta,
)

SERVER_TTFT = "radixmesh_scheduler_time_to_first_token_seconds"
BATCH_SEQUENCES = "radixmesh_executor_batch_sequences"
STEP_SECONDS = "radixmesh_executor_step_seconds"
STEP_TOKENS = "radixmesh_executor_tokens_total"
TOKEN_KINDS = ("prefill", "extend", "decode")
HIT_TOKENS = "radixmesh_cache_prefix_hit_tokens_total"
QUERY_TOKENS = "radixmesh_cache_prefix_query_tokens_total"
CACHED_PROMPT_TOKENS = "radixmesh_scheduler_cached_prompt_tokens_sum"
PROMPT_TOKENS = "radixmesh_scheduler_prompt_tokens_total"
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
SPEC_DRAFTS = "radixmesh_executor_spec_drafts_total"
SPEC_DRAFT_TOKENS = "radixmesh_executor_spec_draft_tokens_total"
SPEC_ACCEPTED = "radixmesh_executor_spec_accepted_tokens_total"
SPEC_FORCED = "radixmesh_executor_spec_forced_tokens_total"


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (q in [0, 1]) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def stats(values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {"mean": math.fsum(values) / len(values) if values else None}
    for key, q in QUANTILES:
        out[key] = percentile(values, q)
    return out


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def latency_block(results: Sequence[RequestResult]) -> dict[str, Any]:
    """TTFT, end-to-end, time per output token and inter-token latency of successful requests."""
    ok = [r for r in results if r.ok]
    tpot = [
        (r.e2e_s - r.ttft_s) / (r.completion_tokens - 1)
        for r in ok
        if r.ttft_s is not None and r.completion_tokens is not None and r.completion_tokens > 1
    ]
    itl = [b - a for r in ok for a, b in zip(r.chunk_times_s, r.chunk_times_s[1:], strict=False)]
    return {
        "num_requests": len(ok),
        "ttft_s": stats([r.ttft_s for r in ok if r.ttft_s is not None]),
        "e2e_s": stats([r.e2e_s for r in ok]),
        "tpot_s": stats(tpot),
        "itl_s": stats(itl),
    }


def _histogram_stats(hist: HistogramDelta | None) -> dict[str, float | None] | None:
    if hist is None or hist.count <= 0:
        return None
    return {"mean": hist.mean, **{k: hist.quantile(q) for k, q in QUANTILES}}


def _steps(before: Snapshot, after: Snapshot, steps: HistogramDelta) -> dict[str, Any]:
    """The executors' steps over the run: how many, their summed time, and the tokens they
    ran by kind (what an in-process run of the same workload is compared on)."""
    return {
        "count": steps.count,
        "seconds": steps.sum,
        "tokens": {
            kind: delta(before, after, "executor", STEP_TOKENS, kind=kind) for kind in TOKEN_KINDS
        },
    }


def _server_side(before: Snapshot, after: Snapshot, samples: Sequence[TimePoint]) -> dict[str, Any]:
    batch = histogram_delta(before, after, "executor", BATCH_SEQUENCES)
    running = [p.running for p in samples if p.running is not None]
    util = [p.gpu_utilization for p in samples if p.gpu_utilization is not None]
    memory = [p.gpu_memory_bytes for p in samples if p.gpu_memory_bytes is not None]
    lookups = _ratio(
        delta(before, after, "cache", HIT_TOKENS), delta(before, after, "cache", QUERY_TOKENS)
    )
    admitted = _ratio(
        delta(before, after, "scheduler", CACHED_PROMPT_TOKENS),
        delta(before, after, "scheduler", PROMPT_TOKENS),
    )
    steps = histogram_delta(before, after, "executor", STEP_SECONDS)
    return {
        "server_ttft_s": _histogram_stats(histogram_delta(before, after, "scheduler", SERVER_TTFT)),
        "executor_step_s": _histogram_stats(steps),
        "executor_steps": None if steps is None else _steps(before, after, steps),
        "batch_size": {
            "running_mean": math.fsum(running) / len(running) if running else None,
            "running_max": max(running) if running else None,
            "step_mean": batch.mean if batch is not None else None,
        },
        "gpu_utilization": math.fsum(util) / len(util) if util else None,
        "gpu_memory_bytes_max": max(memory) if memory else None,
        "kv_cache_hit_rate": admitted if admitted is not None else lookups,
        "kv_cache_lookup_hit_rate": lookups,
        "speculation": speculation_block(before, after),
    }


def speculation_block(before: Snapshot, after: Snapshot) -> dict[str, float | None] | None:
    """The executors' verified drafts over the run; None when they verified none."""
    drafts = delta(before, after, "executor", SPEC_DRAFTS)
    if not drafts:
        return None
    accepted = delta(before, after, "executor", SPEC_ACCEPTED) or 0.0
    return {
        "num_drafts": drafts,
        "num_draft_tokens": delta(before, after, "executor", SPEC_DRAFT_TOKENS),
        "num_accepted_tokens": accepted,
        "acceptance_rate": _ratio(accepted, delta(before, after, "executor", SPEC_DRAFT_TOKENS)),
        "mean_acceptance_length": 1.0 + accepted / drafts,
        "num_forced_tokens": delta(before, after, "executor", SPEC_FORCED) or 0.0,
    }


def _json_block(results: Sequence[RequestResult]) -> dict[str, Any] | None:
    sent = [r for r in results if r.is_json]
    if not sent:
        return None
    done = [r for r in sent if r.ok]
    # truncated outputs (length, abort) are not schema failures: counted apart
    finished = [r for r in done if r.finish_reason not in ("length", "abort")]
    passed = sum(1 for r in finished if r.json_valid)
    plain = latency_block([r for r in results if not r.is_json])
    constrained = latency_block(sent)
    tpot, plain_tpot = constrained["tpot_s"]["mean"], plain["tpot_s"]["mean"]
    tokens = [r.completion_tokens or 0 for r in done]
    decode_latency = (
        max(tpot - plain_tpot, 0.0) * math.fsum(tokens) / len(tokens)
        if tpot is not None and plain_tpot is not None and tokens
        else None
    )
    return {
        "num_requests": len(sent),
        "num_finished": len(finished),
        "schema_pass_rate": passed / len(finished) if finished else None,
        "truncation_rate": (len(done) - len(finished)) / len(done) if done else None,
        "json_decode_latency_s": decode_latency,
        "latency": constrained,
        "tpot_vs_unconstrained": _ratio(tpot, plain_tpot),
    }


MAX_ERROR_MESSAGES = 3
"""Distinct error texts a report keeps per status."""


def _error_messages(results: Sequence[RequestResult]) -> dict[str, dict[str, int]]:
    """Per error status, its first MAX_ERROR_MESSAGES distinct texts (numbers masked, so
    "retry after 3 s" and "retry after 4 s" are one) and how many requests had each."""
    out: dict[str, Counter[str]] = {}
    for r in results:
        if r.ok:
            continue
        texts = out.setdefault(r.status, Counter())
        text = re.sub(r"\d+(\.\d+)?", "N", r.error) or "(no message)"
        if text in texts or len(texts) < MAX_ERROR_MESSAGES:
            texts[text] += 1
    return {status: dict(texts.most_common()) for status, texts in sorted(out.items())}


def build_report(
    run: LoadRun,
    before: Snapshot,
    after: Snapshot,
    samples: Sequence[TimePoint] = (),
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    results = run.results
    ok = [r for r in results if r.ok]
    errors = Counter(r.status for r in results if not r.ok)
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    output = sum(r.completion_tokens or 0 for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    duration = run.duration_s
    latency = latency_block(results)
    e2e = latency["e2e_s"]
    report: dict[str, Any] = {
        "config": config or {},
        "duration_s": duration,
        "num_requests": len(results),
        "num_ok": len(ok),
        "num_errors": len(results) - len(ok),
        "errors_by_status": dict(sorted(errors.items())),
        "error_messages": _error_messages(results),
        "error_rate": (len(results) - len(ok)) / len(results) if results else None,
        "request_throughput": len(ok) / duration,
        "input_tokens_per_s": prompt / duration,
        "output_tokens_per_s": output / duration,
        "total_input_tokens": prompt,
        "total_output_tokens": output,
        "total_cached_tokens": cached,
        **{k: latency[k] for k in ("ttft_s", "e2e_s", "tpot_s", "itl_s")},
        "p99_p50_ratio": _ratio(e2e["p99"], e2e["p50"]),
        "held_share": held_share(results),
        "held_s": stats([r.held_s for r in results]),
        **_tail_within_groups(ok),
        **_server_side(before, after, samples),
        "prefix_reuse_rate": _ratio(cached, prompt),
        "json": _json_block(results),
        "by_priority": {
            p: latency_block([r for r in results if r.priority == p])
            for p in sorted({r.priority for r in results})
        },
    }
    return report


def _tail_within_groups(ok: Sequence[RequestResult]) -> dict[str, Any]:
    """e2e p99/p50 within each request group (a mix's length profile, a shared-prefix group),
    and the worst of them. Across a mix the ratio is mostly the mix's own: with 32 and 128
    output tokens the long requests' e2e is about 4x the short ones' at any load, so p99/p50
    over all requests cannot fall under 4 however the server schedules; within a group it
    is the server's tail."""
    by_group: dict[str, float | None] = {}
    for group in sorted({r.group for r in ok}):
        e2e = stats([r.e2e_s for r in ok if r.group == group])
        by_group[group] = _ratio(e2e["p99"], e2e["p50"])
    ratios = [v for v in by_group.values() if v is not None]
    return {
        "p99_p50_ratio_by_group": by_group,
        "p99_p50_ratio_within_group": max(ratios) if ratios else None,
    }


def flat_metrics(report: dict[str, Any]) -> dict[str, float | None]:
    """The report's numbers under the names --slo uses (ttft_p99, e2e_mean, error_rate, ...)."""
    flat: dict[str, float | None] = {}
    for key in ("ttft", "e2e", "tpot", "itl", "server_ttft", "executor_step"):
        block = report.get(f"{key}_s") or {}
        for stat in ("mean", "p50", "p90", "p99"):
            flat[f"{key}_{stat}"] = block.get(stat)
    for key in (
        "error_rate",
        "request_throughput",
        "input_tokens_per_s",
        "output_tokens_per_s",
        "p99_p50_ratio",
        "p99_p50_ratio_within_group",
        "kv_cache_hit_rate",
        "kv_cache_lookup_hit_rate",
        "prefix_reuse_rate",
        "gpu_utilization",
    ):
        flat[key] = report.get(key)
    spec = report.get("speculation") or {}
    flat["spec_acceptance_rate"] = spec.get("acceptance_rate")
    flat["spec_mean_acceptance_length"] = spec.get("mean_acceptance_length")
    js = report.get("json") or {}
    flat["schema_pass_rate"] = js.get("schema_pass_rate")
    flat["truncation_rate"] = js.get("truncation_rate")
    flat["json_decode_latency_s"] = js.get("json_decode_latency_s")
    for stat in ("mean", "p50", "p90", "p99"):
        flat[f"json_e2e_{stat}"] = ((js.get("latency") or {}).get("e2e_s") or {}).get(stat)
    return flat


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"


def _num(value: float | None, fmt: str = "{:.3f}") -> str:
    return "null" if value is None else fmt.format(value)


def format_table(report: dict[str, Any]) -> str:
    """The report as aligned text for the terminal."""
    lines = [
        f"requests      {report['num_ok']} ok / {report['num_requests']} sent in "
        f"{report['duration_s']:.2f} s   errors {report['num_errors']} "
        f"{report['errors_by_status'] or ''}".rstrip(),
        *(
            f"  {status}: {text} ({count})"
            for status, texts in (report.get("error_messages") or {}).items()
            for text, count in texts.items()
        ),
        f"throughput    {report['request_throughput']:.2f} req/s   "
        f"input {report['input_tokens_per_s']:.1f} tok/s   "
        f"output {report['output_tokens_per_s']:.1f} tok/s",
        "",
        f"{'latency (ms)':<22}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}",
    ]
    rows = (
        ("TTFT (client)", "ttft_s"),
        ("TTFT (server)", "server_ttft_s"),
        ("end-to-end", "e2e_s"),
        ("time per output tok", "tpot_s"),
        ("inter-token", "itl_s"),
        ("executor step", "executor_step_s"),
    )
    for label, key in rows:
        block = report.get(key) or {}
        cells = "".join(f"{_ms(block.get(s)):>10}" for s in ("mean", "p50", "p90", "p99"))
        lines.append(f"{label:<22}{cells}")
    batch = report["batch_size"]
    lines += [
        "",
        f"p99/p50 e2e   {_num(report['p99_p50_ratio'], '{:.2f}')}   within a group (worst) "
        f"{_num(report.get('p99_p50_ratio_within_group'), '{:.2f}')}",
        f"KV hit rate   {_num(report['kv_cache_hit_rate'])}   "
        f"prefix reuse {_num(report['prefix_reuse_rate'])}",
        f"batch size    running mean {_num(batch['running_mean'], '{:.1f}')}  "
        f"max {_num(batch['running_max'], '{:.0f}')}  "
        f"per step {_num(batch['step_mean'], '{:.1f}')}",
        f"GPU           utilisation {_num(report['gpu_utilization'])}  "
        f"memory max {_num(report['gpu_memory_bytes_max'], '{:.0f}')} B",
    ]
    spec = report.get("speculation")
    if spec:
        lines.append(
            f"speculation   {spec['num_drafts']:.0f} drafts  acceptance "
            f"{_num(spec['acceptance_rate'])}  mean acceptance length "
            f"{_num(spec['mean_acceptance_length'], '{:.2f}')}"
        )
    js = report.get("json")
    if js:
        e2e = js["latency"]["e2e_s"]
        lines.append(
            f"JSON          {js['num_requests']} requests  schema pass "
            f"{_num(js['schema_pass_rate'])} of {js['num_finished']} finished  truncated "
            f"{_num(js['truncation_rate'])}  decode latency {_ms(js['json_decode_latency_s'])} ms  "
            f"e2e p50 {_ms(e2e['p50'])} ms  "
            f"p99 {_ms(e2e['p99'])} ms  TPOT vs plain {_num(js['tpot_vs_unconstrained'], '{:.2f}')}"
        )
    return "\n".join(lines)
