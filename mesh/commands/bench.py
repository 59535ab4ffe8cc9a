"""Load-test a mesh or any OpenAI-compatible server; report latency, throughput and cache use.

    radixmesh bench --target http://127.0.0.1:8080 --workload shared-prefix \\
        --num-requests 200 --concurrency 16 --mesh-info endpoints.json \\
        --slo ttft_p99=500ms,error_rate=0.001 --output report.json --plot charts/
    radixmesh bench --concurrency 1000 --duration 3600 --mix 70%short,30%long \
        --metrics ttft,rps,gpu_util
    radixmesh bench --repeat 3 --output new.json --baseline previous.json

--metrics selects what the terminal shows, live and at the end (the JSON
report always holds everything; mesh/loadgen/twelve.py names the metrics).
--repeat N runs the same load N times; the report keeps each run's twelve
metrics, and --baseline judges them against a saved report's repeats
(mesh/loadgen/baseline.py: a Welch t-test over the run-to-run noise).

Exit codes: 0 when the run finished and every --slo target held, 1 when a
target was missed, 2 for bad flags, 3 when no request succeeded, 4 when a
metric regressed against --baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from mesh.commands.bench_target import (
    FLAG_OF_FIELD,
    TargetError,
    check_target,
    describe_error,
    grpc_address,
    name_the_flag,
    probe_grpc,
)
from radixmesh.errors import InvalidArgument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mesh.loadgen.workloads import WORKLOADS

    t = parser.add_argument_group("target")
    t.add_argument("--target", default="http://127.0.0.1:8080", help="server base URL")
    t.add_argument("--api", choices=("openai", "grpc"), default="openai")
    t.add_argument("--model", default="", help="model name (default: the server's first)")
    t.add_argument("--api-key", default="", help="sent as Authorization: Bearer KEY")
    load = parser.add_argument_group("load shape")
    load.add_argument("--concurrency", type=int, default=8, help="conversations in flight")
    load.add_argument(
        "--request-rate",
        default="inf",
        help="Poisson arrivals/s (inf: no wait); a rising list (10,20,40) sweeps the rates, "
        "one run each, and reports goodput per rate",
    )
    load.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="spread the load over this many client processes (their reports merged)",
    )
    load.add_argument("--duration", type=float, default=None, help="seconds to send for")
    load.add_argument("--num-requests", type=int, default=None, help="requests to send (64)")
    load.add_argument("--warmup", type=int, default=0, help="requests sent first, not counted")
    load.add_argument("--seed", type=int, default=0)
    w = parser.add_argument_group("workload")
    w.add_argument(
        "--workload",
        choices=sorted([*WORKLOADS, "program"]),
        default=None,
        help="random (mix with --mix); program: mesh/loadgen/program_bench.py",
    )
    w.add_argument(
        "--mix", default=None, help="profile weights (default 70%%short,30%%long); implies mix"
    )
    w.add_argument(
        "--profile", action="append", default=[], help="length profile name=in:out (repeat)"
    )
    w.add_argument("--input-len", type=int, default=128, help="random: prompt words")
    w.add_argument("--output-len", type=int, default=64, help="max_tokens per request")
    w.add_argument("--range-ratio", type=float, default=1.0, help="random: lengths in [r*len, len]")
    w.add_argument("--groups", type=int, default=4, help="shared-prefix: system prompts")
    w.add_argument("--prompts-per-group", type=int, default=8)
    w.add_argument("--system-prompt-len", type=int, default=256, help="words")
    w.add_argument("--question-len", type=int, default=32, help="words")
    w.add_argument("--turns", type=int, default=3, help="multi-turn: turns per conversation")
    w.add_argument(
        "--use-sessions", action="store_true", help="multi-turn: send session_id, not history"
    )
    w.add_argument("--json-fraction", type=float, default=None, help="JSON-Schema requests")
    w.add_argument("--json-max-tokens", type=int, default=96)
    w.add_argument("--batch-fraction", type=float, default=0.0, help='priority "batch" share')
    w.add_argument("--ignore-eos", action="store_true", help="generate max_tokens (extension)")
    w.add_argument("--temperature", type=float, default=None)
    p = parser.add_argument_group("workload program (gRPC to --target's host:port)")
    p.add_argument("--programs", default="", help="comma-separated (default: all five)")
    p.add_argument(
        "--program-modes", default="server,client", help="server (Programs.Run), client (plain)"
    )
    p.add_argument("--rtt-ms", type=float, default=0.0, help="injected round trip per call")
    p.add_argument(
        "--program-repeats", type=int, default=1, help="runs per point, the modes' order alternating"
    )
    out = parser.add_argument_group("metrics and output")
    out.add_argument(
        "--metrics-url", action="append", default=[], help="name=URL of a /metrics (repeat)"
    )
    out.add_argument("--mesh-info", default=None, help="endpoints JSON of radixmesh serve")
    out.add_argument("--sample-interval", type=float, default=0.5, help="gauge sampling, s")
    out.add_argument("--slo", default=None, help="targets, e.g. ttft_p99=500ms,error_rate=0.01")
    out.add_argument("--output", default=None, help="write the report as JSON here")
    out.add_argument("--plot", default=None, help="write PNG charts to this folder")
    out.add_argument("--quiet", action="store_true", help="no progress line")
    out.add_argument(
        "--metrics", default=None, help="metrics to show, e.g. ttft,rps,gpu_util (default: all)"
    )
    out.add_argument("--repeat", type=int, default=1, help="runs of the same load (noise)")
    out.add_argument("--baseline", default=None, help="saved report to compare against")
    out.add_argument(
        "--baseline-alpha", type=float, default=0.05, help="false-alarm rate of the comparison"
    )
    out.add_argument(
        "--baseline-min-change",
        type=float,
        default=0.1,
        help="smallest change called a regression, as a fraction (0.1: 10%%, a factor of 1.1)",
    )


def parse_mix(spec: str) -> tuple[tuple[str, float], ...]:
    """`70%short,30%long` -> (("short", 0.7), ("long", 0.3)); a bare name weighs 1."""
    out = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        weight, sep, name = part.partition("%")
        if not sep:
            out.append((part, 1.0))
            continue
        try:
            out.append((name.strip(), float(weight) / 100))
        except ValueError:
            raise InvalidArgument(f"mix: expected <percent>%<profile>, got {part!r}") from None
    return tuple(out)


def parse_profiles(specs: list[str]) -> tuple[tuple[str, int, int], ...]:
    """`name=in:out` items over the defaults."""
    from mesh.loadgen.workloads import DEFAULT_PROFILES

    profiles = dict(DEFAULT_PROFILES)
    for spec in specs:
        name, _, lengths = spec.partition("=")
        num_in, _, num_out = lengths.partition(":")
        try:
            profiles[name.strip()] = (int(num_in), int(num_out))
        except ValueError:
            raise InvalidArgument(f"profile: expected name=in:out, got {spec!r}") from None
    return tuple((k, i, o) for k, (i, o) in profiles.items())


def build_configs(args: argparse.Namespace):
    from mesh.loadgen.runner import LoadConfig
    from mesh.loadgen.workloads import WorkloadConfig

    name = args.workload or ("mix" if args.mix else "random")
    json_fraction = args.json_fraction
    if json_fraction is None:
        json_fraction = 1.0 if name == "json" else 0.0
    workload = WorkloadConfig(
        name=name,
        seed=args.seed,
        input_len=args.input_len,
        output_len=args.output_len,
        range_ratio=args.range_ratio,
        mix=parse_mix(args.mix or "70%short,30%long"),
        profiles=parse_profiles(args.profile),
        groups=args.groups,
        prompts_per_group=args.prompts_per_group,
        system_prompt_len=args.system_prompt_len,
        question_len=args.question_len,
        num_turns=args.turns,
        use_sessions=args.use_sessions,
        json_fraction=json_fraction,
        batch_fraction=args.batch_fraction,
        json_max_tokens=args.json_max_tokens,
        session_prefix=f"bench-{int(time.time() * 1000) % 10**9}",
    )
    from mesh.loadgen.goodput import parse_rates

    num_requests = args.num_requests
    if num_requests is None and args.duration is None:
        num_requests = 64
    load = LoadConfig(
        concurrency=args.concurrency,
        request_rate=parse_rates(args.request_rate)[0],
        num_requests=num_requests,
        duration_s=args.duration,
        warmup=args.warmup,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
        temperature=args.temperature,
    )
    if args.client_processes != 1:
        from mesh.loadgen.processes import shard_load

        shard_load(load, 0, args.client_processes)  # a load too small to split is refused
    return workload, load


def _endpoints(args: argparse.Namespace):
    """--mesh-info's and --metrics-url's endpoints; with neither, those of the running
    `radixmesh serve` on this machine that --target names (its registration), if any."""
    from mesh.loadgen.scrape import endpoints_from_info, endpoints_from_mesh_info, parse_endpoints
    from mesh.observe.meshinfo import mesh_serving

    if not args.mesh_info and not args.metrics_url:
        info = mesh_serving(args.target)
        if info is not None:
            endpoints = endpoints_from_info(info)
            if not args.quiet:
                names = ", ".join(e.name for e in endpoints)
                print(f"metrics from the mesh serving {args.target}: {names}", file=sys.stderr)
            return endpoints
    endpoints = endpoints_from_mesh_info(args.mesh_info) if args.mesh_info else []
    return endpoints + parse_endpoints(args.metrics_url)


async def _resolve_model(args: argparse.Namespace) -> str:
    """--model, or the first model the OpenAI server lists (gRPC: empty selects the default;
    the target must answer ListModels). TargetError says why the target did not answer."""
    if args.api == "grpc":
        await probe_grpc(grpc_address(args.target), args.api_key)
        return args.model
    if args.model:
        return args.model
    import aiohttp

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    url = args.target.rstrip("/") + "/v1/models"
    try:
        async with (
            aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as s,
            s.get(url) as response,
        ):
            response.raise_for_status()
            return (await response.json())["data"][0]["id"]
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError) as exc:
        raise TargetError(f"cannot list the models at {url}: {describe_error(exc, url)}") from None


async def bench(
    args: argparse.Namespace, workload, load, endpoints, selection=(), bounds=None
) -> dict[str, Any]:
    """One measured run. bounds: per-request latency bounds of the goodput (goodput.py)."""
    from mesh.loadgen.goodput import goodput
    from mesh.loadgen.progress import Progress
    from mesh.loadgen.report import build_report
    from mesh.loadgen.scrape import MetricsScraper

    model = await _resolve_model(args)
    scraper = MetricsScraper(endpoints)
    samples: list = []
    processes = args.client_processes
    progress = Progress(
        load.num_requests,
        load.duration_s,
        enabled=False if args.quiet or processes > 1 else None,  # results come at the end
        selection=selection,
        samples=samples,
    )
    marks: dict[str, Any] = {}

    async def measure_start() -> None:
        marks["before"] = await scraper.snapshot()
        marks["t0"] = time.perf_counter()
        progress.start()
        if endpoints:
            marks["sampler"] = asyncio.create_task(
                scraper.sample(args.sample_interval, marks["t0"], samples)
            )

    try:
        run = await _run(args, model, workload, load, progress.update, measure_start)
    finally:
        sampler = marks.get("sampler")
        if sampler is not None:
            sampler.cancel()
    progress.finish()
    after = await scraper.snapshot()
    config = {
        "target": args.target,
        "api": args.api,
        "model": model,
        "workload": _plain(workload),
        "load": _plain(load),
        "client_processes": processes,
        "metrics_endpoints": {e.name: e.url for e in endpoints},
        "metrics_errors": dict(scraper.errors),
    }
    report = build_report(run, marks.get("before", {}), after, samples, config)
    report["goodput"] = goodput(run.results, run.duration_s, bounds or {})
    if args.plot:
        from mesh.loadgen.plot import write_plots

        report["plots"] = [
            str(p) for p in write_plots(args.plot, run.results, samples, run.started_s)
        ]
    return report


async def _run(args: argparse.Namespace, model: str, workload, load, on_result, measure_start):
    """The load from this process, or spread over --client-processes (merged)."""
    from mesh.loadgen.workloads import iter_scripts

    if args.client_processes > 1:
        from mesh.loadgen.processes import ClientProcessFailed, ClientSpec, run_load_processes

        spec = ClientSpec(args.api, args.target, model, args.api_key)
        try:
            return await run_load_processes(
                spec, workload, load, args.client_processes, measure_start
            )
        except ClientProcessFailed as exc:
            raise TargetError(str(exc)) from None
    from mesh.loadgen.client import make_client
    from mesh.loadgen.runner import run_load

    client = make_client(args.api, args.target, model, args.api_key)
    try:
        return await run_load(iter_scripts(workload), client, load, on_result, measure_start)
    finally:
        await client.close()


def _plain(config) -> dict[str, Any]:
    from dataclasses import asdict

    out = asdict(config)
    return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in out.items()}


async def bench_repeated(
    args: argparse.Namespace, workload, load, endpoints, selection, bounds=None
):
    """`--repeat` runs of the load; the last run's report, with every run's metrics."""
    from mesh.loadgen.baseline import summarize
    from mesh.loadgen.twelve import values

    reports = []
    for i in range(args.repeat):
        if args.repeat > 1 and not args.quiet:
            print(f"radixmesh bench: run {i + 1} of {args.repeat}", file=sys.stderr, flush=True)
        reports.append(await bench(args, workload, load, endpoints, selection, bounds))
    report = reports[-1]
    if args.repeat > 1:
        report["repeats"] = [values(r) for r in reports]
        report["repeats_summary"] = summarize(report["repeats"])
    return report


async def bench_rates(args: argparse.Namespace, workload, load, endpoints, selection, targets):
    """One rate: `bench_repeated`. A rising list of rates: one run per rate, the last run's
    report with `sweep` (mesh/loadgen/goodput.py: goodput and the SLO per offered rate)."""
    from dataclasses import replace

    from mesh.loadgen.goodput import parse_rates, request_bounds, summarize_sweep, sweep_point
    from mesh.loadgen.report import flat_metrics
    from mesh.loadgen.slo import evaluate

    rates = parse_rates(args.request_rate)
    bounds = request_bounds(targets)
    if len(rates) == 1:
        return await bench_repeated(args, workload, load, endpoints, selection, bounds)
    points, report = [], {}
    for rate in rates:
        if not args.quiet:
            print(f"radixmesh bench: offering {rate:g} requests/s", file=sys.stderr, flush=True)
        report = await bench_repeated(
            args, workload, replace(load, request_rate=rate), endpoints, selection, bounds
        )
        passed = all(r.passed for r in evaluate(targets, flat_metrics(report))) if targets else None
        points.append(sweep_point(rate, report, report["goodput"], passed))
    report["sweep"] = summarize_sweep(points, bounds)
    return report


def _load_baseline(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"baseline: cannot read {path}: {exc}") from None


def run_programs(args: argparse.Namespace) -> int:
    """--workload program: the program suite, server-side against client-driven."""
    from mesh.loadgen.program_bench import ProgramBenchConfig, format_rows, run_suite
    from mesh.loadgen.program_suite import PROGRAMS, Shape
    from mesh.loadgen.scrape import MetricsScraper

    try:
        config = ProgramBenchConfig(
            programs=tuple(p for p in args.programs.split(",") if p) or tuple(PROGRAMS),
            modes=tuple(m for m in args.program_modes.split(",") if m),
            concurrencies=(args.concurrency,),
            num_programs=args.num_requests or 32,
            warmup=args.warmup,
            rtt_ms=args.rtt_ms,
            shape=Shape(max_tokens=args.output_len),
            repeats=args.program_repeats,
        )
        check_target(args.target, "grpc")
        endpoints = _endpoints(args)
    except InvalidArgument as exc:
        print(f"radixmesh bench: {name_the_flag(str(exc), args, FLAG_OF_FIELD)}", file=sys.stderr)
        return 2
    target = grpc_address(args.target)
    scraper = MetricsScraper(endpoints) if endpoints else None

    async def suite() -> dict[str, Any]:
        await probe_grpc(target, args.api_key)  # fail fast, saying why, when nothing answers
        return await run_suite(target, args.api_key, config, scraper)

    try:
        report = asyncio.run(suite())
    except TargetError as exc:
        print(f"radixmesh bench: {exc}", file=sys.stderr)
        return 3
    print(format_rows(report))
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2))
    if all(r["num_errors"] == r["num_programs"] for r in report["rows"]):
        print(f"radixmesh bench: no program succeeded at {target}{_first_error(report)}", file=sys.stderr)
        return 3
    return 0


def _first_error(report: dict[str, Any]) -> str:
    """`: CODE: message` of the most frequent error in the program report's rows, or ""."""
    counts: dict[str, int] = {}
    messages: dict[str, str] = {}
    for row in report["rows"]:
        for code, n in row.get("errors", {}).items():
            counts[code] = counts.get(code, 0) + n
            messages.setdefault(code, row.get("error_messages", {}).get(code, ""))
    if not counts:
        return ""
    code = max(counts, key=lambda c: counts[c])
    message = " ".join(messages[code].split())[:200]
    return f": {code}: {message}" if message else f": {code}"


def run(args: argparse.Namespace) -> int:
    if args.workload == "program":
        return run_programs(args)
    from mesh.loadgen.baseline import compare, format_comparison, repeat_values
    from mesh.loadgen.report import flat_metrics, format_table
    from mesh.loadgen.slo import evaluate, format_results, parse_slo
    from mesh.loadgen.twelve import format_selection, parse_selection

    try:
        check_target(args.target, args.api)
        workload, load = build_configs(args)
        endpoints = _endpoints(args)
        known = frozenset(flat_metrics({}))
        targets = parse_slo(args.slo, known) if args.slo else []
        selection = parse_selection(args.metrics)
        if args.repeat < 1:
            raise InvalidArgument(f"repeat: must be >= 1, got {args.repeat}")
        baseline = _load_baseline(args.baseline)
        if baseline is not None and (args.repeat < 2 or len(repeat_values(baseline)) < 2):
            raise InvalidArgument(
                "baseline: needs --repeat >= 2 here and a baseline saved with --repeat >= 2 "
                "(one run cannot measure its own noise)"
            )
        if not 0 < args.baseline_alpha < 1:
            raise InvalidArgument(f"baseline_alpha: must be in (0, 1), got {args.baseline_alpha}")
        if not (args.baseline_min_change >= 0 and math.isfinite(args.baseline_min_change)):
            raise InvalidArgument(
                f"baseline_min_change: must be >= 0, got {args.baseline_min_change}"
            )
    except InvalidArgument as exc:
        print(f"radixmesh bench: {name_the_flag(str(exc), args, FLAG_OF_FIELD)}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(
            bench_rates(args, workload, load, endpoints, selection if args.metrics else (), targets)
        )
    except TargetError as exc:
        print(f"radixmesh bench: {exc}", file=sys.stderr)
        return 3
    code = 0
    if targets:
        results = evaluate(targets, flat_metrics(report))
        report["slo"] = [
            {
                "metric": r.target.metric,
                "target": r.target.text,
                "value": r.value,
                "passed": r.passed,
            }
            for r in results
        ]
        code = 0 if all(r.passed for r in results) else 1
        if "sweep" in report:  # a sweep passes when some rate met every target
            code = 0 if any(p["slo_met"] for p in report["sweep"]["points"]) else 1
    print(format_selection(report, selection) if args.metrics else format_table(report))
    if targets:
        print(format_results(results))
    if "sweep" in report:
        from mesh.loadgen.goodput import format_sweep

        print(format_sweep(report["sweep"]))
    if baseline is not None:
        rows = compare(baseline, report, args.baseline_alpha, args.baseline_min_change)
        report["baseline"] = {
            "path": args.baseline,
            "alpha": args.baseline_alpha,
            "min_change": args.baseline_min_change,
            "metrics": {
                r.metric.name: {
                    "baseline_mean": r.baseline_mean,
                    "current_mean": r.current_mean,
                    "p_value": r.p_value,
                    "verdict": r.verdict,
                }
                for r in rows
            },
        }
        print(format_comparison(rows, args.baseline_alpha, args.baseline_min_change))
        if any(r.verdict == "regression" for r in rows) and code == 0:
            code = 4
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    if report["num_ok"] == 0:
        print("radixmesh bench: no request succeeded", file=sys.stderr)
        return 3
    return code
