"""The scheduler service process: flags and environment, lifecycle.

    python -m services.scheduler.main --port 50051 --cache-address 127.0.0.1:50052 \
        --executor 127.0.0.1:50053 [--executor 127.0.0.1:50054] [--metrics-port 9101]

It waits for the cache and every executor (health and GetInfo), opens one
Step stream per executor, then reports SERVING. An executor that fails is
unregistered from the cache and readmitted once it serves again on its
address; a cache that goes away ends the requests holding leases (rejoin.py).
On SIGTERM: NOT_SERVING, the
gateway streams get the grace period, then every request still queued or
running is aborted and its leases released.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from collections import Counter
from collections.abc import Sequence

from radixmesh.errors import InvalidArgument, RadixmeshError
from radixmesh.v1 import scheduler_pb2_grpc
from services.cache.client import CacheClient
from services.common.config import ServerConfig, add_server_arguments
from services.common.gc_policy import tune_gc
from services.common.health import wait_for_serving
from services.common.logging import configure_logging, get_logger
from services.common.metrics import REGISTRY
from services.common.server import ServiceRuntime, run_service
from services.scheduler import messages
from services.scheduler.core import SchedulerConfig, SchedulerCore, fit_to_executors
from services.scheduler.core.ports import CachePort
from services.scheduler.core.sharded_cache import ShardedCache
from services.scheduler.drift import DriftConfig, DriftWatcher
from services.scheduler.metrics import SchedulerMetricsCollector
from services.scheduler.rejoin import Rejoin
from services.scheduler.remote import RemoteCache, RemoteExecutor
from services.scheduler.server import SERVICE_NAME, SchedulerServicer

log = get_logger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.scheduler.main", description=__doc__)
    add_server_arguments(p)
    p.add_argument(
        "--cache-address",
        default=os.environ.get("RADIXMESH_CACHE_ADDRESS"),
        help="cache service HOST:PORT, or several comma-separated: shards, each holding the "
        "pools of the executors registered with it (default: $RADIXMESH_CACHE_ADDRESS)",
    )
    p.add_argument(
        "--executor",
        action="append",
        default=None,
        help="executor HOST:PORT, repeatable (default: comma-separated $RADIXMESH_EXECUTORS)",
    )
    p.add_argument("--connect-timeout-seconds", type=float, default=60.0)
    d = SchedulerConfig()
    p.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    p.add_argument("--max-queue-len", type=int, default=d.max_queue_len)
    p.add_argument(
        "--max-queue-wait-s",
        type=float,
        default=d.max_queue_wait_s,
        help="refuse (RESOURCE_EXHAUSTED) an interactive request whose estimated queue wait "
        "is longer, batch at half, sheddable at a quarter; 0 turns it off (default %(default)s)",
    )
    p.add_argument("--page-lookahead", type=int, default=d.page_lookahead)
    p.add_argument(
        "--decode-steps-per-plan",
        type=int,
        default=d.decode_steps_per_plan,
        help="most decode steps one plan asks an executor for while its batch only decodes "
        "(a new request waits at most this many steps); 1: a plan per step "
        "(default %(default)s)",
    )
    p.add_argument(
        "--max-steps-in-flight",
        type=int,
        default=d.max_steps_in_flight,
        help="the most steps sent to an executor and not yet answered when the next plan "
        "goes out; above 2 the scheduler keeps more only while plans reach the executor "
        "after its steps ran out; 1: one step at a time (default %(default)s)",
    )
    p.add_argument("--aging-rate", type=float, default=d.aging_rate)
    p.add_argument(
        "--priority-preemption-gap",
        type=int,
        default=d.priority_preemption_gap,
        help="classes between waiting and running work for preemption; 0 turns it off",
    )
    p.add_argument(
        "--lease-holder",
        default=os.environ.get("RADIXMESH_LEASE_HOLDER"),
        help="holder id of this scheduler's leases (default: scheduler-<host>-<pid>)",
    )
    p.add_argument(
        "--max-temperature-celsius",
        type=float,
        default=d.max_temperature_celsius,
        help="route around an executor whose GPU is hotter (default %(default)s)",
    )
    p.add_argument(
        "--saturation-queue-len",
        type=int,
        default=d.saturation_queue_len,
        help="waiting requests that make a fully busy GPU saturated (default %(default)s)",
    )
    drift = DriftConfig()
    p.add_argument(
        "--baseline-window-s",
        type=float,
        default=drift.window_s,
        help="window of the rolling TTFT/TPOT/error-rate baseline (default %(default)s)",
    )
    p.add_argument(
        "--baseline-tolerance",
        type=float,
        default=drift.tolerance,
        help="TTFT/TPOT deviation from the baseline that raises the gauge (default %(default)s)",
    )
    p.add_argument("--log-level", default=os.environ.get("RADIXMESH_LOG_LEVEL", "info"))
    return p


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    return SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_queue_len=args.max_queue_len,
        max_queue_wait_s=args.max_queue_wait_s or None,
        page_lookahead=args.page_lookahead,
        decode_steps_per_plan=args.decode_steps_per_plan,
        max_steps_in_flight=args.max_steps_in_flight,
        aging_rate=args.aging_rate,
        priority_preemption_gap=args.priority_preemption_gap or None,
        lease_holder=args.lease_holder or f"scheduler-{socket.gethostname()}-{os.getpid()}",
        max_temperature_celsius=args.max_temperature_celsius,
        saturation_queue_len=args.saturation_queue_len,
    )


def executor_addresses(args: argparse.Namespace) -> list[str]:
    addresses = args.executor or os.environ.get("RADIXMESH_EXECUTORS", "").split(",")
    addresses = [a.strip() for a in addresses if a.strip()]
    if not addresses:
        raise InvalidArgument("--executor (or $RADIXMESH_EXECUTORS) names no executor")
    return addresses


def cache_addresses(args: argparse.Namespace) -> list[str]:
    addresses = [a.strip() for a in (args.cache_address or "").split(",") if a.strip()]
    if not addresses:
        raise InvalidArgument("--cache-address (or $RADIXMESH_CACHE_ADDRESS) is required")
    return addresses


async def pool_shards(caches: list[CacheClient], executor_ids: list[str]) -> dict[str, int]:
    """Executor id -> the shard its pool is registered with (each executor registers
    before it serves, so every one is found)."""
    shards: dict[str, int] = {}
    for index, stats in enumerate(await asyncio.gather(*(c.stats() for c in caches))):
        for pool in stats:
            shards[pool.executor_id] = index
    missing = [e for e in executor_ids if e not in shards]
    if missing:
        raise InvalidArgument(
            f"executors {missing} have a pool in none of the cache shards "
            f"{[c.address for c in caches]}"
        )
    return shards


async def connect(
    args: argparse.Namespace, config: SchedulerConfig, servicer: SchedulerServicer
) -> tuple[SchedulerCore, list[CacheClient]]:
    """Wait for the cache (every shard) and the executors, then build and start the core."""
    timeout = args.connect_timeout_seconds
    addresses = cache_addresses(args)
    await asyncio.gather(*(wait_for_serving(a, timeout=timeout) for a in addresses))
    caches = [CacheClient(a) for a in addresses]
    executors = [RemoteExecutor(a, timeout) for a in executor_addresses(args)]
    await asyncio.gather(*(e.connect() for e in executors))
    config = fit_to_executors(config, (e.info for e in executors))
    port: CachePort = RemoteCache(caches[0])
    if len(caches) > 1:
        shards = await pool_shards(caches, [e.info.executor_id for e in executors])
        port = ShardedCache([RemoteCache(c) for c in caches], shards)
    core = SchedulerCore(config, port, executors, servicer.deliver)
    await core.start()
    return core, caches


def message_counts(caches: list[CacheClient]) -> Counter[tuple[str, str]]:
    """The scheduler's stream messages by (peer, direction), the cache clients' included."""
    counts = Counter(messages.COUNTS)
    for cache in caches:
        counts["cache", "sent"] += cache.num_messages
        counts["cache", "received"] += cache.num_received
    return counts


def rejoin_for(
    core: SchedulerCore, caches: list[CacheClient], args: argparse.Namespace
) -> Rejoin:
    """Failed executors and a restarted cache come back into `core` (see rejoin.py)."""
    addresses = {load.executor_id: address for load, address in zip(
        core.executor_loads(), executor_addresses(args), strict=True)}  # fmt: skip
    return Rejoin(core, caches, addresses, cache_addresses(args), args.connect_timeout_seconds)


async def serve(args: argparse.Namespace) -> int:
    try:
        configure_logging("scheduler", args.log_level)
        cache_addresses(args)
        executor_addresses(args)
        config = scheduler_config(args)
        drift = DriftConfig(window_s=args.baseline_window_s, tolerance=args.baseline_tolerance)
        server_config = ServerConfig.from_args("scheduler", args)
    except InvalidArgument as exc:
        print(f"scheduler: {exc}", file=sys.stderr)
        return 2
    servicer = SchedulerServicer()
    runtime = ServiceRuntime(server_config)
    await runtime.start(
        lambda server: scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, server),
        [SERVICE_NAME],
    )
    parts: list = []
    rejoin: list[Rejoin] = []
    background: list[asyncio.Task] = []
    collector = SchedulerMetricsCollector(
        lambda: parts[0] if parts else None, lambda: message_counts(parts[1] if parts else [])
    )
    REGISTRY.register(collector)

    async def start_up() -> int:
        try:
            core, cache = await connect(args, config, servicer)
        except (RadixmeshError, TimeoutError, ConnectionError) as exc:
            print(f"scheduler: {exc}", file=sys.stderr)
            runtime.request_shutdown()
            return 1
        parts.extend((core, cache))
        watcher = DriftWatcher(drift, lambda: core.stats)
        background.append(asyncio.create_task(watcher.run()))
        rejoin.append(rejoin_for(core, cache, args))
        rejoin[0].start()
        servicer.attach(core)
        tune_gc()
        runtime.set_serving()
        log.info("scheduler_ready", address=runtime.address, models=core.models)
        return 0

    async def on_shutdown() -> None:
        startup.cancel()
        for task in background:
            task.cancel()
        for part in rejoin:
            await part.close()
        if parts:
            core, caches = parts
            await core.stop()
            for cache in caches:
                await cache.close()
        REGISTRY.unregister(collector)

    startup = asyncio.create_task(start_up())
    await runtime.serve_until_signal(on_shutdown)
    if startup.cancelled():
        return 0
    return startup.result()


def main(argv: Sequence[str] | None = None) -> int:
    return run_service(serve(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
