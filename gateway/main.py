"""The gateway service: `python -m gateway.main --model DIR --scheduler-address HOST:PORT`.

Serves the public gRPC API (radixmesh.v1.Inference) on --port and the
OpenAI-compatible HTTP API on --http-port, both behind Envoy. Health says
SERVING once the tokenizer is loaded and the scheduler answers its health
check, and follows it (NOT_SERVING while the scheduler is not). SIGTERM drains:
no new requests, those in flight get --grace-seconds, the rest end with UNAVAILABLE
(gateway/drain.py), then the scheduler stream closes.
Environment: RADIXMESH_API_KEYS (comma-separated) adds to --api-key.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

import grpc

from gateway.capacity_watch import watch_capacity
from gateway.compression import ResponseCompressionInterceptor
from gateway.core.auth import Admission
from gateway.core.capacity import CapacityGate
from gateway.core.memory import GatewayMemory
from gateway.core.models import ExecutorCounts, ModelRegistry
from gateway.core.prepare import PreparedRequest
from gateway.core.ratelimit import (
    AdaptiveRate,
    AdaptiveRateConfig,
    LocalRateLimiter,
    RateLimitConfig,
    RedisRateLimiter,
)
from gateway.core.tokenizer import Tokenizer
from gateway.drain import edge_tasks, finish
from gateway.envoy.admission import EdgeAdmission, EdgeAdmissionConfig
from gateway.openai_http import OpenAIHttpServer, start_http_server
from gateway.programs.backend import SchedulerBackend
from gateway.programs.core.model import Limits
from gateway.programs.core.plugins import PluginChain
from gateway.programs.core.predict import BranchPredictor, PredictionConfig
from gateway.programs.core.runtime import RuntimeDeps
from gateway.programs.registry import load_registry
from gateway.programs.server import ProgramsServicer
from gateway.server import InferenceServicer
from radixmesh.errors import InvalidArgument
from radixmesh.v1 import inference_pb2_grpc, program_pb2_grpc
from services.common.config import ServerConfig, add_server_arguments
from services.common.gc_policy import tune_gc
from services.common.health import RECONNECT_OPTIONS, wait_for_serving
from services.common.logging import configure_logging, get_logger
from services.common.server import ServiceRuntime, run_service
from services.scheduler.client import SchedulerClient

log = get_logger(__name__)

EXECUTOR_COUNTS_TTL_S = 1.0
"""ListModels asks the scheduler for its executors at most this often."""
REDIS_TIMEOUT_S = 1.0
"""Longest wait for one rate-limit call to Redis."""


def _envoy_admin_url(text: str) -> str:
    """--envoy-admin-url: empty (off) or http(s)://HOST:PORT."""
    if text:
        try:
            EdgeAdmissionConfig(text)
        except InvalidArgument as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gateway.main", description=__doc__)
    add_server_arguments(parser, default_port=50051)
    parser.add_argument("--http-port", type=int, default=8000, help="OpenAI-compatible HTTP port")
    parser.add_argument("--model", required=True, help="model folder (tokenizer, config.json)")
    parser.add_argument(
        "--model-name", default="", help="model id clients use (default: folder name)"
    )
    parser.add_argument("--scheduler-address", required=True, help="HOST:PORT of the scheduler")
    parser.add_argument(
        "--scheduler-wait-s", type=float, default=600.0, help="wait for the scheduler"
    )
    parser.add_argument(
        "--envoy-admin-url",
        type=_envoy_admin_url,
        default=os.environ.get("RADIXMESH_ENVOY_ADMIN_URL", ""),
        help="Envoy's admin interface (http://HOST:PORT): set the edge admission limit there "
        "from the scheduler's headroom (gateway/envoy/admission.py; default off)",
    )
    parser.add_argument(
        "--cache-address",
        default=os.environ.get("RADIXMESH_CACHE_ADDRESS", ""),
        help="HOST:PORT of the cache service: sessions and the result cache (default off)",
    )
    parser.add_argument(
        "--result-cache",
        action="store_true",
        help="answer repeated deterministic requests from the cache service's result cache",
    )
    parser.add_argument("--redis-url", default="", help="share rate-limit buckets across replicas")
    parser.add_argument("--api-key", action="append", default=[], help="accepted API key (repeat)")
    parser.add_argument(
        "--rate-limit-per-s", type=float, default=0.0, help="requests/s per key; 0: off"
    )
    parser.add_argument(
        "--rate-limit-burst", type=float, default=0.0, help="bucket size (default: 2 s of rate)"
    )
    parser.add_argument(
        "--rate-limit",
        choices=("fixed", "adaptive"),
        default="fixed",
        help="fixed: --rate-limit-per-s per key; adaptive: each key's rate is "
        "--rate-limit-share of the scheduler's measured requests/s, at least "
        "--rate-limit-per-s (1 when 0), recomputed every second",
    )
    parser.add_argument(
        "--rate-limit-share",
        type=float,
        default=AdaptiveRateConfig().share,
        help="adaptive: each key's share of the measured capacity, in (0, 1]",
    )
    parser.add_argument(
        "--tools-config",
        default=os.environ.get("RADIXMESH_TOOLS_CONFIG", ""),
        help="JSON file of program tools and plugins (docs/programs.md); built-ins always load",
    )
    parser.add_argument(
        "--program-max-statements",
        type=int,
        default=Limits().max_statements,
        help="most statements in one program, nested ones and each fork branch counted",
    )
    parser.add_argument(
        "--program-max-fork-width",
        type=int,
        default=Limits().max_fork_width,
        help="most branches of one Fork",
    )
    parser.add_argument(
        "--program-max-depth",
        type=int,
        default=Limits().max_depth,
        help="deepest nesting of If and Fork bodies",
    )
    parser.add_argument(
        "--program-max-total-tokens",
        type=int,
        default=Limits().max_total_tokens,
        help="most tokens one program may process: prompt tokens prefilled plus generated",
    )
    parser.add_argument(
        "--program-max-wall-time-s",
        type=float,
        default=Limits().max_wall_time_s,
        help="longest a program may run",
    )
    parser.add_argument(
        "--program-branch-prediction",
        choices=("on", "off"),
        default="on",
        help="prefill an If's likely branch (from its history in the result store) while its"
        " condition is computed",
    )
    parser.add_argument("--log-level", default="info")
    return parser


def _admission(
    args: argparse.Namespace, capacity: CapacityGate | None = None
) -> tuple[Admission, Any]:
    """The API keys and rate limiter, and the Redis client to close (None without Redis).
    capacity: where an adaptive limit reads the measured requests/s."""
    env_keys = [k.strip() for k in os.environ.get("RADIXMESH_API_KEYS", "").split(",") if k.strip()]
    api_keys = frozenset([*args.api_key, *env_keys])
    config: RateLimitConfig | AdaptiveRate
    if args.rate_limit == "adaptive":
        adaptive = AdaptiveRateConfig(
            share=args.rate_limit_share,
            floor_per_s=args.rate_limit_per_s or 1.0,
            burst=args.rate_limit_burst or None,
        )
        gate = capacity or CapacityGate()
        config = AdaptiveRate(adaptive, gate.requests_per_s)
    elif args.rate_limit_per_s <= 0:
        return Admission(api_keys), None
    else:
        config = RateLimitConfig(
            capacity=args.rate_limit_burst or max(1.0, 2 * args.rate_limit_per_s),
            refill_per_s=args.rate_limit_per_s,
        )
    if not args.redis_url:
        return Admission(api_keys, LocalRateLimiter(config)), None
    client = rate_limit_redis(args.redis_url)
    return Admission(api_keys, RedisRateLimiter(client, config)), client


def rate_limit_redis(url: str, timeout_s: float = REDIS_TIMEOUT_S) -> Any:
    """A `redis.asyncio.Redis` for the rate-limit buckets: each call waits at most timeout_s
    and is retried once, at once (a connection Redis dropped is reopened), so a Redis that
    is down answers UNAVAILABLE within about two timeouts instead of hanging requests."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return aioredis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 1),
        retry_on_timeout=False,
    )


def _memory(args: argparse.Namespace, models: ModelRegistry) -> tuple[GatewayMemory, Any]:
    """Sessions and the result cache in the cache service, and its client to close (or None)."""
    if not args.cache_address:
        if args.result_cache:
            raise InvalidArgument("--result-cache needs --cache-address")
        return GatewayMemory(), None
    from radixmesh.result_key import result_key
    from services.cache.client import CacheClient

    client = CacheClient(args.cache_address)

    def key(prepared: PreparedRequest) -> str:
        model = prepared.model or models.default_model
        return result_key(model, prepared.prompt_token_ids, prepared.sampling, prepared.constraint)

    return GatewayMemory(client, key, cache_results=args.result_cache), client


def programs_servicer(
    args: argparse.Namespace,
    models: ModelRegistry,
    upstream: SchedulerClient,
    admission: Admission,
    cache_client: Any,
) -> tuple[ProgramsServicer, PluginChain]:
    """The program runtime beside Inference (tools' results cached in the cache service's
    result store when there is one, else in this process), and the plugins, which plain
    requests get too."""
    try:
        tools, plugins = load_registry(args.tools_config or None, store=cache_client)
    except InvalidArgument as exc:  # a bad --tools-config: one line, no traceback
        print(f"gateway: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    limits = Limits(
        max_statements=args.program_max_statements,
        max_fork_width=args.program_max_fork_width,
        max_depth=args.program_max_depth,
        max_total_tokens=args.program_max_total_tokens,
        max_wall_time_s=args.program_max_wall_time_s,
    )
    predictor = BranchPredictor(
        tools.store, PredictionConfig(enabled=args.program_branch_prediction == "on")
    )
    deps = RuntimeDeps(SchedulerBackend(upstream), models, tools, plugins, limits, predictor)
    return ProgramsServicer(deps, admission), plugins


async def serve(args: argparse.Namespace) -> int:
    configure_logging("gateway", args.log_level)
    runtime = ServiceRuntime(
        ServerConfig.from_args("gateway", args), (ResponseCompressionInterceptor(),)
    )
    tokenizer = await asyncio.to_thread(Tokenizer.from_folder, args.model, None, args.model_name)
    models = ModelRegistry({tokenizer.name: tokenizer})
    channel = grpc.aio.insecure_channel(args.scheduler_address, options=RECONNECT_OPTIONS)
    upstream = SchedulerClient(channel)
    capacity = CapacityGate()  # the scheduler's published headroom (capacity_watch.py)
    edge_admission = (  # and Envoy's limit from it, the first line
        EdgeAdmission(EdgeAdmissionConfig(args.envoy_admin_url)) if args.envoy_admin_url else None
    )
    admission, redis_client = _admission(args, capacity)
    memory, cache_client = _memory(args, models)
    counts = ExecutorCounts(upstream.executors_per_model, ttl_s=EXECUTOR_COUNTS_TTL_S)
    programs, plugins = programs_servicer(args, models, upstream, admission, cache_client)
    servicer = InferenceServicer(models, upstream, admission, memory, counts, plugins, capacity)

    def add_servicers(server: grpc.aio.Server) -> None:
        inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
        program_pb2_grpc.add_ProgramsServicer_to_server(programs, server)

    await runtime.start(add_servicers, ["radixmesh.v1.Inference", "radixmesh.v1.Programs"])
    tune_gc()
    serving = False
    edge: list[asyncio.Task[None]] = []
    http = OpenAIHttpServer(
        models,
        upstream,
        admission,
        ready=lambda: serving and not runtime.stopping,
        memory=memory,
        plugins=plugins,
        capacity=capacity,
    )
    runner = await start_http_server(http.build_app(), args.host, args.http_port)

    async def on_shutdown() -> None:
        await finish(edge)  # in-flight requests end within the grace period
        await upstream.close()  # what still runs ends with UNAVAILABLE, then the server stops
        await runner.cleanup()
        await channel.close()
        if edge_admission is not None:
            await edge_admission.close()
        if redis_client is not None:
            await redis_client.aclose()
        if cache_client is not None:
            await cache_client.close()

    try:
        await wait_for_serving(
            args.scheduler_address, "radixmesh.v1.Scheduler", args.scheduler_wait_s
        )
    except (TimeoutError, ConnectionError) as exc:
        log.error("scheduler_unreachable", error=str(exc))
        await runtime.shutdown(on_shutdown)
        return 1
    serving = True
    runtime.set_serving()

    def set_ready(ready: bool) -> None:
        nonlocal serving
        serving = ready
        runtime.set_serving(ready)

    grace = runtime.config.grace_seconds
    edge = edge_tasks(runtime, http, args.scheduler_address, grace, upstream.close, set_ready)
    watch = asyncio.create_task(
        watch_capacity(upstream, capacity, edge=edge_admission, models=models),
        name="capacity-watch",
    )
    edge.append(watch)
    log.info("gateway_ready", model=tokenizer.name, http_port=args.http_port, grpc=runtime.address)
    await runtime.serve_until_signal(on_shutdown)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_service(serve(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
