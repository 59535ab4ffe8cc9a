"""Start the whole mesh on this machine (cache, executors, scheduler, gateways, Envoy) until Ctrl-C.

Services start in order on free loopback ports, each SERVING before the next;
the endpoints are printed once all are up. A service that dies later is started
again on its ports with backoff while the others keep serving; one that dies
more than --max-restarts times within --restart-window-s stops the mesh, and
the message names it with the tail of its log. Ctrl-C or SIGTERM drains: the
edge stops taking requests, those in flight get --grace seconds, then the
services stop from the edge inwards; a second signal stops everything at once.
A service that fails to start stops the rest.
Flags are checked before any service starts (values, the --tools-config file, that --port,
--admin-port and --status-port are free, the --log-dir and --endpoints-json folders): a
bad one ends serve with one line naming the flag.
Exit codes: 0 after a clean stop, 1 when a service failed, 2 for bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from mesh.commands.serve_checks import LOOPBACK, checked_config, flag_message
from radixmesh.errors import InvalidArgument, RadixmeshError

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
    parser.add_argument(
        "--gateways",
        type=int,
        default=1,
        help="gateway replicas behind Envoy, each its own process (balanced, health-checked)",
    )
    parser.add_argument("--redis-url", default="", help="share caches, sessions and limits")
    parser.add_argument(
        "--api-key", action="append", default=[], help="accepted API key (repeat; default: open)"
    )
    parser.add_argument(
        "--rate-limit-per-s", type=float, default=0.0, help="requests/s per API key (0: off)"
    )
    parser.add_argument("--rate-limit-burst", type=float, default=0.0, help="bucket size")
    parser.add_argument(
        "--rate-limit",
        choices=("fixed", "adaptive"),
        default="fixed",
        help="fixed: --rate-limit-per-s per key; adaptive: each key may sustain "
        "--rate-limit-share of the scheduler's measured requests/s, at least "
        "--rate-limit-per-s (1 when 0)",
    )
    parser.add_argument(
        "--rate-limit-share", type=float, default=0.25, help="adaptive: each key's share"
    )
    parser.add_argument(
        "--result-cache", action="store_true", help="cache results of deterministic requests"
    )
    parser.add_argument(
        "--tools-config", default=None, help="JSON file of program tools and plugins"
    )
    parser.add_argument(
        "--program-branch-prediction",
        default="on",
        choices=("on", "off"),
        help="every gateway prefills an If's likely branch (from its history in the result "
        "store) while its condition is computed (default on)",
    )
    parser.add_argument("--num-pages", type=int, default=None, help="KV pages per executor")
    parser.add_argument(
        "--speculative",
        default="off",
        choices=("off", "ngram", "suffix", "radix"),
        help="speculative decoding in every executor: ngram (prompt lookup), suffix (prompt "
        "lookup, else recent outputs of other requests), radix (suffix, and what followed "
        "the prompt in the cache's radix tree, from every executor), off (default, until "
        "measured)",
    )
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="with --speculative: most draft tokens verified per request and step; each "
        "request's draft length adapts below it (default: the executors', 8)",
    )
    parser.add_argument(
        "--batch-invariant",
        action="store_true",
        help="every executor computes a sequence's logits independently of its batch: greedy "
        "outputs equal with --speculative on and off at any batch size (slower; plain "
        "weights, not with --quantization fp8 or --tensor-parallel-size > 1)",
    )
    parser.add_argument(
        "--jump-forward",
        default="auto",
        choices=("on", "off", "auto"),
        help="every executor verifies the tokens a constraint forces as a draft; auto "
        "(default): on the CPU, not on CUDA",
    )
    parser.add_argument(
        "--extend-graph-tokens",
        type=int,
        default=0,
        help="on CUDA: every executor replays steps that are not plain decodes (extends, "
        "short prefills, decodes mixed with them) of at most this many tokens as captured "
        "graphs, bucketed by tokens and sequences; 0 (default): they run eagerly",
    )
    parser.add_argument(
        "--kv-memory-fraction",
        type=float,
        default=None,
        help="on CUDA without --num-pages: share of free GPU memory for each executor's KV pool",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="GPUs (CPU processes) per executor, one rank each; the group is one executor",
    )
    parser.add_argument(
        "--quantization",
        default="auto",
        choices=("auto", "none", "fp8"),
        help="projection weights: auto (the checkpoint's format: FP8 checkpoints stay FP8), "
        "fp8 (quantize at load), none",
    )
    parser.add_argument("--log-dir", default=None, help="service logs (default: a temp folder)")
    parser.add_argument(
        "--start-timeout-s", type=float, default=600.0, help="per service start limit"
    )
    parser.add_argument(
        "--endpoints-json", default=None, help="also write the endpoints as JSON to this file"
    )
    parser.add_argument(
        "--otlp-endpoint",
        default="",
        help="OTLP/gRPC collector for every service's trace spans (default off)",
    )
    parser.add_argument(
        "--otlp-sample-rate",
        type=float,
        default=None,
        help="share of requests traced, in [0, 1], decided once per trace where it starts "
        "(a caller's traceparent keeps its own sampled flag; default 1: every request)",
    )
    parser.add_argument(
        "--status-port",
        type=int,
        default=0,
        help="status page port on loopback (0: a free one, -1: off; other negatives are refused)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=30.0,
        help="seconds in-flight requests may finish after Ctrl-C/SIGTERM (default %(default)s)",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=5,
        help="restarts of one service within --restart-window-s before serve stops; "
        "0: never restart (default %(default)s)",
    )
    parser.add_argument(
        "--restart-window-s", type=float, default=60.0, help="(default %(default)s)"
    )
    parser.add_argument(
        "--max-queue-wait-s",
        type=float,
        default=None,
        help="refuse (429) interactive requests whose estimated queue wait is longer, batch "
        "at half, sheddable at a quarter; 0: off (default: the scheduler's, 30)",
    )
    parser.add_argument(
        "--decode-steps-per-plan",
        type=int,
        default=None,
        help="most decode steps the scheduler asks of an executor in one plan while its "
        "batch only decodes; 1: a plan per step (default: the scheduler's)",
    )
    parser.add_argument(
        "--max-steps-in-flight",
        type=int,
        default=None,
        help="the most steps the scheduler keeps in flight to an executor: above 2 it keeps "
        "more only while its plans arrive after the executor ran out of steps (a small "
        "model at a large batch); 2: never more; 1: one step at a time (default: the "
        "scheduler's, 4)",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="most sequences in one step, the running batch's bound (each executor's and the "
        "scheduler's); decode graphs are captured up to it (default: theirs, 256)",
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="most tokens in one step (each executor's; the scheduler fits its step budget to "
        "them); with --extend-graph-tokens as large, every step that is not a plain decode "
        "replays a graph (default: theirs, 8192)",
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


def _say(message: str) -> None:
    print(f"radixmesh: {message}", flush=True)


async def serve(args: argparse.Namespace) -> int:
    from mesh.launcher import Mesh

    try:
        config = checked_config(args)
    except InvalidArgument as exc:
        print(f"radixmesh serve: {exc}", file=sys.stderr)
        return 2
    # before the Mesh: its services' environment is taken from this one as it is built
    if args.otlp_endpoint:  # every service's --otlp-endpoint defaults to this variable
        os.environ["RADIXMESH_OTLP_ENDPOINT"] = args.otlp_endpoint
    if args.otlp_sample_rate is not None:
        os.environ["RADIXMESH_OTLP_SAMPLE_RATE"] = repr(args.otlp_sample_rate)
    try:
        mesh = Mesh(config, on_spawn=lambda name, pid: _say(f"started {name} (pid {pid})"))
    except InvalidArgument as exc:
        if not args.log_dir:
            shutil.rmtree(config.log_dir, ignore_errors=True)
        print(f"radixmesh serve: {flag_message(str(exc))}", file=sys.stderr)
        return 2
    signals = _Signals()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, signals.received)
    _say(f"starting model {mesh.model_name!r}, logs in {mesh.config.log_dir}")
    code = 0
    drain = False
    try:
        code, drain = await _run(mesh, signals.first, args.endpoints_json, config.status_port)
    finally:
        codes = await _stop(mesh, signals, drain)
        _say("stopped " + ", ".join(f"{k}={v}" for k, v in codes.items()))
    return code


class _Signals:
    """The first stop signal drains, the second stops at once."""

    def __init__(self) -> None:
        self.first = asyncio.Event()
        self.second = asyncio.Event()

    def received(self) -> None:
        if self.first.is_set():
            self.second.set()
        self.first.set()


async def _stop(mesh, signals: _Signals, drain: bool) -> dict[str, int | None]:
    grace = mesh.config.grace_s
    if drain:
        _say(f"draining: in-flight requests get {grace:g}s (a second Ctrl-C stops at once)")
        stopping = asyncio.create_task(mesh.drain(grace))
    else:
        _say("stopping")
        stopping = asyncio.create_task(mesh.stop())
    hurry = asyncio.create_task(signals.second.wait())
    await asyncio.wait([stopping, hurry], return_when=asyncio.FIRST_COMPLETED)
    hurry.cancel()
    if stopping.done():
        return stopping.result()
    _say("second signal: stopping at once")
    stopping.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await stopping
    return await mesh.kill()


async def _run(
    mesh, stop: asyncio.Event, endpoints_json: str | None, status_port: int = 0
) -> tuple[int, bool]:
    """(exit code, whether to drain): runs until a stop signal or until serve gives up."""
    from mesh.supervisor import ServiceFailed

    starting = asyncio.create_task(mesh.start())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait([starting, stopped], return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, ServiceFailed):
            await starting
        print("radixmesh: interrupted while starting", file=sys.stderr, flush=True)
        return 0, False
    try:
        starting.result()
    except (ServiceFailed, RadixmeshError, OSError) as exc:
        stopped.cancel()
        print(f"radixmesh: {exc}", file=sys.stderr, flush=True)
        return 1, False
    from mesh.observe.meshinfo import unregister
    from mesh.observe.status import StatusServer

    status = None if status_port < 0 else StatusServer(mesh.endpoints(), LOOPBACK, status_port)
    if status is not None:
        try:
            _say(f"status page {await status.start()}")
        except OSError as exc:  # taken since the check before the start
            stopped.cancel()
            reason = flag_message(exc.strerror or str(exc))  # "status_port: cannot bind ..."
            print(f"radixmesh: {reason}", file=sys.stderr, flush=True)
            return 1, False
    publish = publisher(mesh, status.url if status else None, endpoints_json)
    try:
        registered = publish()
    except OSError as exc:  # the --endpoints-json folder went away since the check
        stopped.cancel()
        if status is not None:
            await status.stop()
        print(f"radixmesh: --endpoints-json: cannot write {endpoints_json}: "
              f"{exc.strerror or exc}", file=sys.stderr, flush=True)  # fmt: skip
        return 1, False

    def republish(name: str) -> None:
        try:
            publish()
        except OSError as exc:
            _say(f"after restarting {name}: cannot write --endpoints-json: {exc}")

    try:
        return await _serve_ready(mesh, stopped, republish)
    finally:
        unregister(registered)
        if status is not None:
            await status.stop()


def publisher(mesh, status_url: str | None, endpoints_json: str | None) -> Callable[[], Path]:
    """Writes the running mesh's endpoints (PIDs included) to --endpoints-json and to the
    registry of running meshes; serve calls it once ready and again after every restart."""
    from mesh.observe.meshinfo import register

    def publish() -> Path:
        if endpoints_json:
            tmp = f"{endpoints_json}.tmp"
            Path(tmp).write_text(mesh.endpoints_json())
            os.replace(tmp, endpoints_json)
        return register({**mesh.endpoints(), "status": status_url}, mesh.config.public_port)

    return publish


async def _serve_ready(
    mesh, stopped: asyncio.Task, on_restarted: Callable[[str], object]
) -> tuple[int, bool]:
    from mesh.watch import keep_serving

    print(format_endpoints(mesh.endpoints()), flush=True)
    print(f"{READY_LINE}: serving {mesh.model_name!r} at {mesh.endpoints()['http']}"
          " (Ctrl-C stops)", flush=True)  # fmt: skip
    gave_up = asyncio.create_task(keep_serving(mesh, _say, on_restarted))
    await asyncio.wait([gave_up, stopped], return_when=asyncio.FIRST_COMPLETED)
    if gave_up.done():
        stopped.cancel()
        print(f"radixmesh: {gave_up.result()}", file=sys.stderr, flush=True)
        return 1, False
    gave_up.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await gave_up
    return 0, True


def run(args: argparse.Namespace) -> int:
    return asyncio.run(serve(args))
