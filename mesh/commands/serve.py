"""Start the whole mesh on this machine (cache, executors, scheduler, gateway, Envoy) until Ctrl-C.

Services start in order on free loopback ports, each SERVING before the next;
the endpoints are printed once all are up. Ctrl-C or SIGTERM stops them in
reverse order (SIGTERM, a grace period, then SIGKILL). A service that fails
to start stops the rest, and the message names it with the tail of its log.
Exit codes: 0 after a clean stop, 1 when a service failed, 2 for bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from pathlib import Path

from radixmesh.errors import InvalidArgument

READY_LINE = "radixmesh: ready"
"""Printed (as the start of one line) once every service is up."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model folder (default: the tiny model)")
    parser.add_argument("--host", default="127.0.0.1", help="public listener interface")
    parser.add_argument("--port", type=int, default=8080, help="public HTTP/gRPC port")
    parser.add_argument("--admin-port", type=int, default=0, help="Envoy admin port (0: free)")
    parser.add_argument(
        "--device",
        default="auto",
        help="auto, cpu, cuda (executor i on cuda:i) or cuda:N (all on one GPU)",
    )
    parser.add_argument("--executors", type=int, default=1, help="number of executors")
    parser.add_argument("--redis-url", default="", help="share caches, sessions and limits")
    parser.add_argument(
        "--api-key", action="append", default=[], help="accepted API key (repeat; default: open)"
    )
    parser.add_argument(
        "--rate-limit-per-s", type=float, default=0.0, help="requests/s per API key (0: off)"
    )
    parser.add_argument("--rate-limit-burst", type=float, default=0.0, help="bucket size")
    parser.add_argument(
        "--result-cache", action="store_true", help="cache results of deterministic requests"
    )
    parser.add_argument("--num-pages", type=int, default=None, help="KV pages per executor")
    parser.add_argument(
        "--kv-memory-fraction",
        type=float,
        default=None,
        help="on CUDA without --num-pages: share of free GPU memory for each executor's KV pool",
    )
    parser.add_argument("--log-dir", default=None, help="service logs (default: a temp folder)")
    parser.add_argument(
        "--start-timeout-s", type=float, default=600.0, help="per service start limit"
    )
    parser.add_argument(
        "--endpoints-json", default=None, help="also write the endpoints as JSON to this file"
    )


def _config(args: argparse.Namespace):
    from mesh.launcher import MeshConfig

    if args.model:
        model_dir = Path(args.model)
    else:
        from mesh.tiny_model import ensure_default_model

        model_dir = ensure_default_model()
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="radixmesh-"))
    return MeshConfig(
        model_dir=model_dir,
        log_dir=log_dir,
        public_host=args.host,
        public_port=args.port,
        admin_port=args.admin_port,
        device=args.device,
        num_executors=args.executors,
        redis_url=args.redis_url,
        api_keys=tuple(args.api_key),
        rate_limit_per_s=args.rate_limit_per_s,
        rate_limit_burst=args.rate_limit_burst,
        result_cache=args.result_cache,
        num_pages=args.num_pages,
        kv_memory_fraction=args.kv_memory_fraction,
        start_timeout_s=args.start_timeout_s,
    )


def format_endpoints(endpoints: dict) -> str:
    lines = [
        f"model        {endpoints['model']}",
        f"public       {endpoints['http']}  (HTTP/1.1, HTTP/2, gRPC radixmesh.v1.Inference)",
        f"  OpenAI     {endpoints['http']}/v1/chat/completions  /v1/completions  /v1/models",
        f"  JSON       {endpoints['http']}/v1/generate  (newline-delimited JSON stream)",
        f"admin        {endpoints['admin']}  (/ready, /stats/prometheus)",
    ]
    for s in endpoints["services"]:
        if s["name"] == "envoy":
            continue
        metrics = f"  metrics :{s['metrics_port']}" if s.get("metrics_port") else ""
        http = f"  http {s['http']}" if s.get("http") else ""
        lines.append(f"{s['name']:<12} {s['address']}{http}{metrics}  pid {s['pid']}")
    lines.append(f"logs         {endpoints['log_dir']}")
    return "\n".join(lines)


async def serve(args: argparse.Namespace) -> int:
    from mesh.launcher import Mesh

    def report(name: str, pid: int) -> None:
        print(f"radixmesh: started {name} (pid {pid})", flush=True)

    try:
        mesh = Mesh(_config(args), on_spawn=report)
    except InvalidArgument as exc:
        print(f"radixmesh serve: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    print(
        f"radixmesh: starting model {mesh.model_name!r}, logs in {mesh.config.log_dir}", flush=True
    )
    code = 0
    try:
        code = await _run(mesh, stop, args.endpoints_json)
    finally:
        print("radixmesh: stopping", flush=True)
        codes = await mesh.stop()
        print("radixmesh: stopped " + ", ".join(f"{k}={v}" for k, v in codes.items()), flush=True)
    return code


async def _run(mesh, stop: asyncio.Event, endpoints_json: str | None) -> int:
    from mesh.supervisor import ServiceFailed

    starting = asyncio.create_task(mesh.start())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait([starting, stopped], return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, ServiceFailed):
            await starting
        print("radixmesh: interrupted while starting", file=sys.stderr, flush=True)
        return 0
    try:
        starting.result()
    except ServiceFailed as exc:
        stopped.cancel()
        print(f"radixmesh: {exc}", file=sys.stderr, flush=True)
        return 1
    if endpoints_json:
        tmp = f"{endpoints_json}.tmp"
        Path(tmp).write_text(mesh.endpoints_json())
        os.replace(tmp, endpoints_json)
    print(format_endpoints(mesh.endpoints()), flush=True)
    print(f"{READY_LINE}: serving {mesh.model_name!r} at {mesh.endpoints()['http']}"
          " (Ctrl-C stops)", flush=True)  # fmt: skip
    exited = asyncio.create_task(mesh.wait_exit())
    await asyncio.wait([exited, stopped], return_when=asyncio.FIRST_COMPLETED)
    if exited.done():
        stopped.cancel()
        print(f"radixmesh: {exited.result()}", file=sys.stderr, flush=True)
        return 1
    exited.cancel()
    return 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(serve(args))
