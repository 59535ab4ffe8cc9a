"""bench/engine.py's services mode: a cache, one executor and a scheduler as processes,
driven through the scheduler's Stream with the workload the in-process run gets."""

from __future__ import annotations

import argparse
import sys
import tempfile

from bench.engine import REPO, Report, model_dir, model_vocab_size, summarize, timed
from mesh.launcher import child_env
from mesh.loadgen.scrape import parse_text, total


def services_env(args: argparse.Namespace) -> dict[str, str]:
    """The services' environment: as `radixmesh serve` gives its children (this project
    importable first, the caller's PYTHONPATH kept after it), with --num-threads."""
    env = child_env()
    if args.num_threads:  # the executor's torch reads these at import
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.num_threads)
    return env


def free_ports(n: int) -> list[int]:
    from services.common.config import free_port

    ports: list[int] = []
    while len(ports) < n:
        if (port := free_port()) not in ports:
            ports.append(port)
    return ports


def service_specs(args: argparse.Namespace, model: str) -> list:
    """ServiceSpecs in start order: cache, one executor, the scheduler (loopback ports)."""
    from mesh.supervisor import ServiceSpec

    cache, executor, scheduler, metrics, executor_metrics = free_ports(5)
    cache_address = f"127.0.0.1:{cache}"
    sizes = ["--max-num-seqs", str(args.max_num_seqs)]
    sizes += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    executor_args = ["--model", model, "--executor-id", "executor-0", "--device", args.device]
    executor_args += ["--cache-address", cache_address, "--page-size", str(args.page_size)]
    executor_args += [*sizes, "--log-level", "warning", "--quantization", args.quantization]
    executor_args += ["--metrics-port", str(executor_metrics)]
    if args.num_pages:
        executor_args += ["--num-pages", str(args.num_pages)]
    executor_args += ["--tensor-parallel-size", str(args.tensor_parallel_size)]
    if args.speculative != "off":
        executor_args += ["--speculative", args.speculative]
        executor_args += ["--speculative-max-batch-size", str(args.max_num_seqs)]
    scheduler_args = ["--cache-address", cache_address, "--executor", f"127.0.0.1:{executor}"]
    scheduler_args += [*sizes, "--max-queue-len", str(max(1024, args.num_requests))]
    scheduler_args += ["--metrics-port", str(metrics), "--log-level", "warning"]
    scheduler_args += ["--decode-steps-per-plan", str(args.decode_steps_per_plan)]
    scheduler_args += ["--max-steps-in-flight", str(args.max_steps_in_flight)]

    def spec(name: str, port: int, extra: list[str], service: str, **kw) -> ServiceSpec:
        argv = (sys.executable, "-m", f"services.{name}.main", "--port", str(port), *extra)
        if name == "executor" and args.stand_in_device_ms is not None:
            stand_in = ("--device-ms", str(args.stand_in_device_ms))
            if args.stand_in_logits == "hashed":
                stand_in += ("--hashed",)
            if args.stand_in_spec_ratio is not None:
                stand_in += ("--spec-ratio", str(args.stand_in_spec_ratio))
            argv = (
                sys.executable,
                str(REPO / "bench" / "device_stand_in.py"),
                *stand_in,
                *argv[3:],
            )
        return ServiceSpec(name, argv, f"127.0.0.1:{port}", f"radixmesh.v1.{service}", **kw)

    return [
        spec("cache", cache, [], "Cache"),
        spec(
            "executor",
            executor,
            executor_args,
            "Executor",
            start_timeout_s=600,
            metrics_port=executor_metrics,
        ),
        spec("scheduler", scheduler, scheduler_args, "Scheduler", metrics_port=metrics),
    ]


async def scrape(port: int, *names: str) -> list[float]:
    """The sum of each of these series over its labels on a service's /metrics (0 where
    absent)."""
    import aiohttp

    url = f"http://127.0.0.1:{port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        samples = {"service": parse_text(await response.text(), url)}
    return [total(samples, "service", name) or 0.0 for name in names]


async def bench_services(args: argparse.Namespace) -> Report:
    from mesh.supervisor import Supervisor
    from services.scheduler.client import SchedulerClient

    model = model_dir(args)
    vocab = model_vocab_size(model)
    env = services_env(args)
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as log_dir:
        supervisor = Supervisor(log_dir, env=env)
        try:
            specs = service_specs(args, model)
            for spec in specs:  # each SERVING before the next starts
                await supervisor.start_stage([spec])
            scheduler = specs[-1]
            async with SchedulerClient(scheduler.address) as client:
                prompts, timings, seconds = await timed(args, client.generate, vocab)
            num_preemptions, target = await scrape(
                scheduler.metrics_port,
                "radixmesh_scheduler_preemptions_total",
                "radixmesh_scheduler_steps_in_flight_target",
            )
            gaps, gap_s = await scrape(
                specs[1].metrics_port,
                "radixmesh_executor_idle_gap_seconds_count",
                "radixmesh_executor_idle_gap_seconds_sum",
            )
        finally:
            await supervisor.stop_all()
    report = summarize(args, "services", prompts, timings, seconds, int(num_preemptions))
    report.idle_gaps, report.idle_gap_s = int(gaps), round(gap_s, 4)
    report.steps_in_flight_target = int(target)
    return report
