"""The program benchmark: every program of `program_suite`, server-side and client-driven,
at each concurrency, against one running mesh (`radixmesh bench --workload program`,
`bench/programs.py`).

Per (program, concurrency, mode) point: programs/s, latency p50/p99, prompt tokens the
server computed per program (prompt - cached) against the program's unique tokens,
requests per program, errors; the select program at concurrency 1 also counts the
executors' forward passes per select (their `steps_total`, with the mesh's metrics
endpoints); the triage program reports branch prediction (made, accuracy) and the time
from the If to its branch's first text with and without a kept prediction.

Unique tokens of a program: the distinct token positions of every prompt its
client-driven run sent (a trie over their token ids, tokenized by the server), less the
tokens of the generated text that a later prompt carries again (decoded, not prefilled). Every
point runs its own instances (no two points share an instance's text); what instances
share by design (a few-shot prefix, instructions) is cached after each point's warm-up.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from mesh.loadgen.program_client import ClientDriven, Outcome, ServerSide
from mesh.loadgen.program_suite import PROGRAMS, Shape, instance
from mesh.loadgen.scrape import MetricsScraper, Snapshot, delta, histogram_delta, total
from radixmesh.errors import InvalidArgument
from radixmesh.v1 import inference_pb2 as ipb
from radixmesh.v1 import inference_pb2_grpc

MODES = ("server", "client")
STEPS = "radixmesh_executor_steps_total"
STEP_SECONDS = "radixmesh_executor_step_seconds"
BATCH_SEQS = "radixmesh_executor_batch_sequences"
TOKENS = "radixmesh_executor_tokens_total"
CPU = "process_cpu_seconds_total"
MESSAGES = "radixmesh_scheduler_stream_messages_total"
GRAPH_STEPS = "radixmesh_executor_graph_steps_total"
ROLES = ("gateway", "scheduler", "cache", "executor")


@dataclass(frozen=True, slots=True)
class ProgramBenchConfig:
    programs: tuple[str, ...] = tuple(PROGRAMS)
    modes: tuple[str, ...] = MODES
    concurrencies: tuple[int, ...] = (1, 16, 64)
    num_programs: int = 32
    """Programs run (and timed) per point; at least the point's concurrency."""
    warmup: int = 2
    """Programs run first at each point, not counted."""
    rtt_ms: float = 0.0
    """Injected client-server round trip, before every call the client sends."""
    shape: Shape = field(default_factory=Shape)
    seed: int = 0
    repeats: int = 1
    """Runs of every point; the modes' order alternates between runs (what runs first on
    a fresh shape pays for it), and a row reports the median run with the spread."""

    def __post_init__(self) -> None:
        for name in self.programs:
            if name not in PROGRAMS:
                raise InvalidArgument(f"programs: unknown program {name!r} (known: {', '.join(PROGRAMS)})")
        for mode in self.modes:
            if mode not in MODES:
                raise InvalidArgument(f"modes: {mode!r} is not one of {', '.join(MODES)}")
        if not self.concurrencies or min(self.concurrencies) < 1:
            raise InvalidArgument(f"concurrencies: each must be >= 1, got {self.concurrencies}")
        if self.num_programs < 1:
            raise InvalidArgument(f"num_programs: must be >= 1, got {self.num_programs}")
        if self.warmup < 0:
            raise InvalidArgument(f"warmup: must be >= 0, got {self.warmup}")
        if self.rtt_ms < 0:
            raise InvalidArgument(f"rtt_ms: must be >= 0, got {self.rtt_ms}")
        if self.repeats < 1:
            raise InvalidArgument(f"repeats: must be >= 1, got {self.repeats}")


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _warm(runner: Any, name: str, first: int, config: ProgramBenchConfig) -> None:
    for i in range(config.warmup):
        await runner.run(*instance(name, first + i, config.shape, config.seed))


async def _run_point(runner: Any, name: str, first: int, config: ProgramBenchConfig, concurrency: int) -> tuple[list[Outcome], float]:
    """The point's timed programs (after its warm-up ones), at most `concurrency` at once."""
    slots = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Outcome:
        async with slots:
            return await runner.run(*instance(name, first + config.warmup + i, config.shape, config.seed))

    started = time.perf_counter()
    outcomes = await asyncio.gather(*(one(i) for i in range(max(config.num_programs, concurrency))))
    return list(outcomes), time.perf_counter() - started


async def unique_tokens(stub: inference_pb2_grpc.InferenceStub, metadata: tuple, outcome: Outcome) -> int:
    """The distinct token positions of a client-driven run's prompts, less the generated
    text those prompts carry again (decoded, not prefilled)."""

    async def tokenize(text: str) -> list[int]:
        response = await stub.Tokenize(ipb.TokenizeRequest(prompt=text), metadata=metadata)
        return list(response.token_ids)

    trie: dict = {}
    size = 0
    for prompt in outcome.prompts:
        node = trie
        for token in await tokenize(prompt):
            if token not in node:
                node[token] = {}
                size += 1
            node = node[token]
    a, b = await tokenize("a"), await tokenize("b")
    start = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), 0)  # BOS
    generated = [len(await tokenize(t)) - start for t in outcome.consumed_texts if t]
    return size - sum(generated)


def summarize(outcomes: list[Outcome], wall_s: float) -> dict[str, Any]:
    ok = [o for o in outcomes if not o.error]
    latencies = [o.latency_s for o in ok]
    errors: dict[str, int] = {}
    messages: dict[str, str] = {}
    for o in outcomes:
        if o.error:
            errors[o.error] = errors.get(o.error, 0) + 1
            messages.setdefault(o.error, o.error_message)
    n = max(1, len(ok))
    return {
        "num_programs": len(outcomes),
        "num_errors": len(outcomes) - len(ok),
        "errors": errors,
        "error_messages": messages,
        "programs_per_s": len(ok) / wall_s if wall_s > 0 else None,
        "latency_p50_s": _quantile(latencies, 0.5),
        "latency_p99_s": _quantile(latencies, 0.99),
        "computed_prompt_tokens_per_program": sum(o.computed_tokens for o in ok) / n,
        "prompt_tokens_per_program": sum(o.prompt_tokens for o in ok) / n,
        "completion_tokens_per_program": sum(o.completion_tokens for o in ok) / n,
        "requests_per_program": sum(o.num_requests for o in ok) / n,
        "selects_per_program": sum(o.num_selects for o in ok) / n,
        "statement_done_s": _timeline(ok),
    }


def _timeline(outcomes: list[Outcome]) -> dict[str, float]:
    """Per statement of the program's body: the mean seconds from the start to its end."""
    ends: dict[str, list[float]] = {}
    for o in outcomes:
        for path, seconds in o.done_at_s.items():
            ends.setdefault(path, []).append(seconds)
    ordered = sorted(ends, key=lambda p: int(p.split("[", 1)[1].split("]", 1)[0]))
    return {path: statistics.fmean(ends[path]) for path in ordered}


def where_time_goes(before: Snapshot, after: Snapshot, wall_s: float, num_programs: int) -> dict[str, Any]:
    """Where a point's wall time went, from the mesh's metrics: the executors' steps (how
    many, how long, how full, the share of the wall time they ran) and every service's
    CPU seconds, per program."""
    n = max(1, num_programs)
    out: dict[str, Any] = {}
    steps = delta(before, after, "executor", STEPS)
    step_s = histogram_delta(before, after, "executor", STEP_SECONDS)
    seqs = histogram_delta(before, after, "executor", BATCH_SEQS)
    out["steps_per_program"] = steps / n if steps is not None else None
    out["step_s_mean"] = step_s.mean if step_s is not None else None
    out["executor_busy"] = step_s.sum / wall_s if step_s is not None and wall_s > 0 else None
    out["seqs_per_step"] = seqs.mean if seqs is not None else None
    for graphs in ("decode", "extend"):  # steps replayed as CUDA graphs (none on a CPU)
        end = total(after, "executor", GRAPH_STEPS, graphs=graphs)
        start = total(before, "executor", GRAPH_STEPS, graphs=graphs)
        out[f"{graphs}_graph_steps_per_program"] = (
            (end - (start or 0.0)) / n if end is not None else None
        )
    for kind in ("prefill", "extend", "decode"):
        start = total_of(before, TOKENS, kind=kind)
        end = total_of(after, TOKENS, kind=kind)
        out[f"{kind}_tokens_per_program"] = (end - start) / n if end is not None and start is not None else None
    for role in ROLES:
        used = delta(before, after, role, CPU)
        out[f"{role}_cpu_s_per_program"] = used / n if used is not None else None
    for peer in ("gateway", "executor", "cache"):  # what the scheduler sent and read
        for direction in ("sent", "received"):
            end = total(after, "scheduler", MESSAGES, peer=peer, direction=direction)
            start = total(before, "scheduler", MESSAGES, peer=peer, direction=direction)
            count = end - (start or 0.0) if end is not None else None
            out[f"scheduler_{peer}_messages_{direction}_per_program"] = (
                count / n if count is not None else None
            )
    return out


def total_of(snapshot: Snapshot, name: str, **match: str) -> float | None:
    """An executor counter's total; 0 when the executors answered without it (no such
    tokens yet)."""
    value = total(snapshot, "executor", name, **match)
    return 0.0 if value is None and snapshot.get("executor") else value


def _predictions(outcomes: list[Outcome]) -> dict[str, Any]:
    counts = {k: sum(o.predictions.get(k, 0) for o in outcomes) for k in ("NONE", "HIT", "MISS")}
    made = counts["HIT"] + counts["MISS"]
    ttft: dict[str, list[float]] = {"kept": [], "not_kept": []}
    for o in outcomes:
        for prediction, seconds in o.branch_ttft_s:
            ttft["kept" if prediction == "HIT" else "not_kept"].append(seconds)
    return {
        **{k.lower(): v for k, v in counts.items()},
        "accuracy": counts["HIT"] / made if made else None,
        "branch_ttft_s": {k: statistics.fmean(v) if v else None for k, v in ttft.items()},
    }


async def run_suite(
    target: str,
    api_key: str,
    config: ProgramBenchConfig,
    scraper: MetricsScraper | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every point of config against the mesh at target; on_row sees each row as it is done
    (before the unique-token columns, which need every client-driven point)."""
    metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
    rows: list[dict[str, Any]] = []
    unique: dict[str, float] = {}
    options = [("grpc.max_concurrent_streams", 1024)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        runners = {
            "server": ServerSide(channel, metadata, config.rtt_ms / 1000),
            "client": ClientDriven(channel, metadata, config.rtt_ms / 1000),
        }
        stub = inference_pb2_grpc.InferenceStub(channel)
        for point, (name, concurrency, mode) in enumerate(_points(config)):
            first = point * (config.num_programs + max(config.concurrencies) + config.warmup)
            await _warm(runners[mode], name, first, config)
            before = await scraper.snapshot() if scraper is not None else None
            cpu_before = time.process_time()
            outcomes, wall_s = await _run_point(runners[mode], name, first, config, concurrency)
            row = {"program": name, "mode": mode, "concurrency": concurrency, **summarize(outcomes, wall_s)}
            if before is not None and scraper is not None:
                after = await scraper.snapshot()
                row["where"] = where_time_goes(before, after, wall_s, len(outcomes))
                row["where"]["client_cpu_s_per_program"] = (time.process_time() - cpu_before) / len(outcomes)
                steps = delta(before, after, "executor", STEPS)
                selects = sum(o.num_selects for o in outcomes)
                if concurrency == 1:
                    row["forwards_per_select"] = steps / selects if steps is not None and selects and name == "select" else None
            if mode == "server" and name.startswith("triage"):
                row["branch_prediction"] = _predictions(outcomes)
            if mode == "client" and name not in unique:
                ok = [o for o in outcomes if not o.error]
                counts = [await unique_tokens(stub, metadata, o) for o in ok[:8]]
                unique[name] = statistics.fmean(counts) if counts else 0.0
            rows.append(row)
            if on_row is not None:
                on_row(row)
    rows = merge_repeats(rows)
    for row in rows:
        u = unique.get(row["program"])
        row["unique_tokens_per_program"] = u
        row["computed_over_unique"] = row["computed_prompt_tokens_per_program"] / u if u else None
    return {"config": _config(config), "rows": rows, "targets": targets(rows)}


def _points(config: ProgramBenchConfig) -> list[tuple[str, int, str]]:
    """(program, concurrency, mode) in run order: every repeat of a (program, concurrency)
    together, the modes' order reversed in every other repeat."""
    out = []
    for name in config.programs:
        for concurrency in config.concurrencies:
            for r in range(config.repeats):
                modes = config.modes if r % 2 == 0 else tuple(reversed(config.modes))
                out += [(name, concurrency, mode) for mode in modes]
    return out


SPREAD = ("programs_per_s", "latency_p50_s", "latency_p99_s", "computed_prompt_tokens_per_program", "forwards_per_select")


def merge_repeats(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (program, mode, concurrency): the run of median programs/s (the lower
    middle of an even count), with `repeats` (how many runs), `spread` (each of SPREAD's
    values over the runs, in run order) and the errors of every run added up."""
    by_point: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        by_point.setdefault((row["program"], row["mode"], row["concurrency"]), []).append(row)
    out = []
    for runs in by_point.values():
        ranked = sorted(runs, key=lambda r: r["programs_per_s"] or 0.0)
        row = dict(ranked[(len(ranked) - 1) // 2])
        row["repeats"] = len(runs)
        row["spread"] = {k: [r.get(k) for r in runs] for k in SPREAD}
        row["num_errors_all_runs"] = sum(r["num_errors"] for r in runs)
        out.append(row)
    return out


def _config(config: ProgramBenchConfig) -> dict[str, Any]:
    return {
        "programs": list(config.programs),
        "modes": list(config.modes),
        "concurrencies": list(config.concurrencies),
        "num_programs": config.num_programs,
        "warmup": config.warmup,
        "rtt_ms": config.rtt_ms,
        "repeats": config.repeats,
        "shape": {k: getattr(config.shape, k) for k in Shape.__slots__},  # type: ignore[attr-defined]
    }


def _row(rows: list[dict], program: str, mode: str, concurrency: int) -> dict | None:
    return next((r for r in rows if (r["program"], r["mode"], r["concurrency"]) == (program, mode, concurrency)), None)


def targets(rows: list[dict]) -> dict[str, Any]:
    """The issue's targets, read off the rows (None where a row is missing)."""
    out: dict[str, Any] = {}
    for program in ("fork", "select"):
        server, client = _row(rows, program, "server", 16), _row(rows, program, "client", 16)
        ratio = None
        if server and client and server["programs_per_s"] and client["programs_per_s"]:
            ratio = server["programs_per_s"] / client["programs_per_s"]
        out[f"{program}_speedup_c16"] = ratio
        if server and client and "spread" in server and "spread" in client:
            pairs = zip(server["spread"]["programs_per_s"], client["spread"]["programs_per_s"], strict=False)
            out[f"{program}_speedup_c16_runs"] = [a / b if a and b else None for a, b in pairs]
    server_rows = [r for r in rows if r["mode"] == "server" and r.get("computed_over_unique") is not None]
    out["max_server_computed_over_unique"] = max((r["computed_over_unique"] for r in server_rows), default=None)
    select = _row(rows, "select", "server", 1)
    out["server_forwards_per_select"] = select.get("forwards_per_select") if select else None
    return out


def format_rows(report: dict[str, Any]) -> str:
    head = "program  mode    conc  prog/s  (min-max of runs)   p50 s   p99 s  computed  unique  req/prog  fwd/select  errors"
    lines = [head]
    for r in report["rows"]:
        def f(v: Any, spec: str) -> str:
            return format(v, spec) if isinstance(v, (int, float)) else "-"

        rates = [v for v in r.get("spread", {}).get("programs_per_s", []) if v is not None]
        spread = f"({min(rates):.2f}-{max(rates):.2f} of {len(rates)})" if rates else ""
        lines.append(
            f"{r['program']:<8} {r['mode']:<7} {r['concurrency']:>4} {f(r['programs_per_s'], '7.2f')} {spread:<18} "
            f"{f(r['latency_p50_s'], '7.3f')} {f(r['latency_p99_s'], '7.3f')} "
            f"{f(r['computed_prompt_tokens_per_program'], '9.1f')} {f(r['unique_tokens_per_program'], '7.1f')} "
            f"{f(r['requests_per_program'], '9.1f')} {f(r.get('forwards_per_select'), '11.2f')} {r['num_errors']:>7}"
        )
    for r in report["rows"]:
        if "branch_prediction" in r:
            lines.append(f"triage c={r['concurrency']} branch prediction: {r['branch_prediction']}")
    lines.append(f"targets: {report['targets']}")
    return "\n".join(lines)
