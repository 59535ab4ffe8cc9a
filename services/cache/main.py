"""The cache service process: flags and environment, lifecycle.

    python -m services.cache.main --port 50052 --metrics-port 9102 \
        [--redis-url redis://127.0.0.1:6379/0] [--lease-ttl 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from dataclasses import dataclass

from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.v1 import cache_pb2_grpc
from services.cache.core import CacheConfig, CacheCore
from services.cache.server import (
    SERVICE_NAME,
    CacheMetricsCollector,
    CacheServicer,
    run_lease_expiry,
)
from services.cache.store import StoreConfig, make_store
from services.cache.store.redis_store import RedisStore
from services.common.config import ServerConfig, add_server_arguments
from services.common.logging import configure_logging, get_logger
from services.common.metrics import REGISTRY
from services.common.server import ServiceRuntime, run_service

log = get_logger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The process's flags; abbreviations off, so a flag is spelled as defined here."""
    parser = argparse.ArgumentParser(
        prog="python -m services.cache.main", description=__doc__, allow_abbrev=False
    )
    add_server_arguments(parser)
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("RADIXMESH_REDIS_URL") or None,
        help="Redis for results and sessions (env RADIXMESH_REDIS_URL; default in-process)",
    )
    parser.add_argument(
        "--lease-ttl", type=float, default=30.0, help="lease TTL seconds without heartbeat"
    )
    parser.add_argument("--result-ttl", type=float, default=600.0, help="result cache TTL seconds")
    parser.add_argument("--session-ttl", type=float, default=3600.0, help="session TTL seconds")
    parser.add_argument("--log-level", default=os.environ.get("RADIXMESH_LOG_LEVEL", "info"))
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parses `argv` (default: sys.argv[1:]) with `build_parser()`."""
    return build_parser().parse_args(argv)


@dataclass(frozen=True, slots=True)
class CacheServiceConfig:
    """Everything the process builds from its flags (each part validates itself)."""

    server: ServerConfig
    core: CacheConfig
    store: StoreConfig
    log_level: str


def build_config(args: argparse.Namespace) -> CacheServiceConfig:
    """Raises InvalidArgument naming the bad flag's field."""
    return CacheServiceConfig(
        server=ServerConfig.from_args("cache", args),
        core=CacheConfig(lease_ttl_s=args.lease_ttl),
        store=StoreConfig(
            redis_url=args.redis_url, result_ttl_s=args.result_ttl, session_ttl_s=args.session_ttl
        ),
        log_level=args.log_level,
    )


async def serve(config: CacheServiceConfig) -> int:
    configure_logging("cache", config.log_level)
    core = CacheCore(config.core)
    store = make_store(config.store)
    servicer = CacheServicer(core, store)
    collector = CacheMetricsCollector(core)
    REGISTRY.register(collector)
    runtime = ServiceRuntime(config.server)
    await runtime.start(
        lambda server: cache_pb2_grpc.add_CacheServicer_to_server(servicer, server), [SERVICE_NAME]
    )
    if isinstance(store, RedisStore):
        try:
            await store.ping()  # fail at start, not at the first request, on a wrong URL
        except Unavailable as exc:
            log.error("redis_unavailable", error=str(exc))
            await runtime.shutdown(store.close)
            REGISTRY.unregister(collector)
            return 1
    expiry_interval_s = min(1.0, config.core.lease_ttl_s / 4)
    expiry = asyncio.create_task(run_lease_expiry(core, expiry_interval_s))
    runtime.set_serving()
    log.info("cache_ready", address=runtime.address, redis=config.store.redis_url is not None)

    async def on_shutdown() -> None:
        expiry.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await expiry
        await store.close()
        REGISTRY.unregister(collector)

    await runtime.serve_until_signal(on_shutdown)
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        config = build_config(parse_args(argv))
    except InvalidArgument as exc:
        print(f"python -m services.cache.main: error: {exc}", file=sys.stderr)
        return 2
    return run_service(serve(config))


if __name__ == "__main__":
    raise SystemExit(main())
