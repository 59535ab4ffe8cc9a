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
import errno
import ipaddress
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from radixmesh.errors import InvalidArgument, RadixmeshError

LOOPBACK = "127.0.0.1"
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


FLAGS: dict[str, str] = {
    "model": "--model",
    "model_dir": "--model",
    "log_dir": "--log-dir",
    "public_host": "--host",
    "host": "--host",
    "public_port": "--port",
    "port": "--port",
    "admin_port": "--admin-port",
    "device": "--device",
    "num_executors": "--executors",
    "executors": "--executors",
    "num_gateways": "--gateways",
    "gateways": "--gateways",
    "redis_url": "--redis-url",
    "api_keys": "--api-key",
    "rate_limit_per_s": "--rate-limit-per-s",
    "rate_limit_burst": "--rate-limit-burst",
    "rate_limit": "--rate-limit",
    "rate_limit_share": "--rate-limit-share",
    "result_cache": "--result-cache",
    "tools_config": "--tools-config",
    "program_branch_prediction": "--program-branch-prediction",
    "num_pages": "--num-pages",
    "speculative": "--speculative",
    "num_speculative_tokens": "--num-speculative-tokens",
    "jump_forward": "--jump-forward",
    "batch_invariant": "--batch-invariant",
    "extend_graph_tokens": "--extend-graph-tokens",
    "kv_memory_fraction": "--kv-memory-fraction",
    "quantization": "--quantization",
    "tensor_parallel_size": "--tensor-parallel-size",
    "start_timeout_s": "--start-timeout-s",
    "grace_s": "--grace",
    "grace": "--grace",
    "restart_policy.window_s": "--restart-window-s",
    "window_s": "--restart-window-s",
    "restart_policy.max_restarts": "--max-restarts",
    "max_restarts": "--max-restarts",
    "max_queue_wait_s": "--max-queue-wait-s",
    "decode_steps_per_plan": "--decode-steps-per-plan",
    "max_steps_in_flight": "--max-steps-in-flight",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "status_port": "--status-port",
    "endpoints_json": "--endpoints-json",
    "otlp_sample_rate": "--otlp-sample-rate",
}
"""The names MeshConfig's (and RestartPolicy's) messages use -> the serve flag that sets it."""

_NAMES = re.compile(
    r"(?<![\w./-])("
    + "|".join(re.escape(name) for name in sorted(FLAGS, key=len, reverse=True))
    + r")(?![\w-])"
)


def flag_message(message: str) -> str:
    """A MeshConfig message in the words of serve's command line: its leading field name
    (`num_pages: must be >= 1`) and any other field named in it (those with an underscore,
    so that words such as "port" in a sentence stay) become the flags (`--num-pages: ...`)."""
    head, sep, body = message.partition(": ")
    if not sep:
        head, body = "", message
    else:
        head = " and ".join(FLAGS.get(name, name) for name in head.split(" and ")) + sep
    body = _NAMES.sub(lambda m: FLAGS[m[1]] if "_" in m[1] else m[1], body)
    return head + body


class BadFlag(InvalidArgument):
    """A flag value serve refuses before any service starts (exit 2)."""


def resolve_host(host: str) -> str:
    """--host as the IP address Envoy's listener binds: an address as given, a name (such
    as `localhost`) resolved, IPv4 first. Raises BadFlag."""
    if not host:
        raise BadFlag("--host: must not be empty")
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise BadFlag(f"--host: cannot resolve {host!r}: {reason}") from None
    addresses = sorted(infos, key=lambda info: info[0] != socket.AF_INET)
    if not addresses:
        raise BadFlag(f"--host: {host!r} has no address")
    return str(addresses[0][4][0])


def _config(args: argparse.Namespace, log_dir: Path | None = None):
    """The MeshConfig of the flags (checked; raises InvalidArgument naming the field). Without
    log_dir it names the temp folder, a stand-in that serve replaces once every check passed."""
    from mesh.mesh_config import MeshConfig
    from mesh.restarts import RestartPolicy

    if args.model:
        model_dir = Path(args.model)
    else:
        from mesh.tiny_model import ensure_default_model

        model_dir = ensure_default_model()
    return MeshConfig(
        model_dir=model_dir,
        log_dir=log_dir if log_dir is not None else Path(tempfile.gettempdir()),
        public_host=resolve_host(args.host),
        public_port=args.port,
        admin_port=args.admin_port,
        device=args.device,
        num_executors=args.executors,
        num_gateways=args.gateways,
        redis_url=args.redis_url,
        api_keys=tuple(args.api_key),
        rate_limit_per_s=args.rate_limit_per_s,
        rate_limit_burst=args.rate_limit_burst,
        rate_limit=args.rate_limit,
        rate_limit_share=args.rate_limit_share,
        result_cache=args.result_cache,
        tools_config=Path(args.tools_config) if args.tools_config else None,
        program_branch_prediction=args.program_branch_prediction == "on",
        num_pages=args.num_pages,
        speculative=args.speculative,
        num_speculative_tokens=args.num_speculative_tokens,
        jump_forward=args.jump_forward,
        batch_invariant=args.batch_invariant,
        extend_graph_tokens=args.extend_graph_tokens,
        kv_memory_fraction=args.kv_memory_fraction,
        quantization=args.quantization,
        tensor_parallel_size=args.tensor_parallel_size,
        start_timeout_s=args.start_timeout_s,
        grace_s=args.grace,
        restart_policy=RestartPolicy(
            max_restarts=args.max_restarts, window_s=args.restart_window_s
        ),
        max_queue_wait_s=args.max_queue_wait_s,
        decode_steps_per_plan=args.decode_steps_per_plan,
        max_steps_in_flight=args.max_steps_in_flight,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        status_port=args.status_port,
    )


def check_bindable(host: str, port: int, flag: str) -> None:
    """Binds a TCP socket to host:port and closes it: raises BadFlag naming `flag` when
    something listens there already (or the address is not this machine's)."""
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Envoy and aiohttp do
        try:
            sock.bind((host, port))
        except OSError as exc:
            where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
            if exc.errno == errno.EADDRINUSE:
                raise BadFlag(f"{flag}: {where} is already in use") from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise BadFlag(f"--host: {host} is not an address of this machine") from None
            raise BadFlag(f"{flag}: cannot bind {where}: {exc.strerror or exc}") from None


def preflight(config, endpoints_json: str | None) -> None:
    """What serve checks of its environment before it starts anything (raises BadFlag naming
    the flag): the tools config loads, the public, admin and status ports are free, the
    --endpoints-json folder exists, and the --log-dir folder can be created and written."""
    if config.tools_config is not None:
        from gateway.programs.registry import check_config

        check_config(config.tools_config)  # InvalidArgument("--tools-config: FILE: ...")
    check_bindable(config.public_host, config.public_port, "--port")
    if config.admin_port:
        check_bindable(LOOPBACK, config.admin_port, "--admin-port")
    if config.status_port > 0:
        check_bindable(LOOPBACK, config.status_port, "--status-port")
    if endpoints_json:
        path = Path(endpoints_json)
        if path.is_dir():
            raise BadFlag(f"--endpoints-json: {path} is a folder, not a file")
        folder = path.parent
        if not folder.is_dir():
            raise BadFlag(f"--endpoints-json: folder {folder} does not exist")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise BadFlag(f"--endpoints-json: cannot write in folder {folder}")
    if config.log_dir is not None:
        _check_log_dir(Path(config.log_dir))


def _check_log_dir(log_dir: Path) -> None:
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadFlag(f"--log-dir: cannot create {log_dir}: {exc.strerror or exc}") from None
    if not os.access(log_dir, os.W_OK | os.X_OK):
        raise BadFlag(f"--log-dir: cannot write in {log_dir}")


def checked_config(args: argparse.Namespace):
    """The checked MeshConfig of the flags, its log folder made (a new temp folder unless
    --log-dir names one); raises InvalidArgument with a message naming the flag (exit 2).
    Nothing is started and no temp folder is left when it raises."""
    import dataclasses

    if args.otlp_sample_rate is not None and not 0.0 <= args.otlp_sample_rate <= 1.0:
        raise BadFlag(f"--otlp-sample-rate: must be in [0, 1], got {args.otlp_sample_rate}")
    log_dir = Path(args.log_dir) if args.log_dir else None
    try:
        config = _config(args, log_dir)
        preflight(dataclasses.replace(config, log_dir=log_dir), args.endpoints_json)
    except BadFlag:
        raise
    except InvalidArgument as exc:
        raise BadFlag(flag_message(str(exc))) from None
    if log_dir is None:
        config = dataclasses.replace(config, log_dir=Path(tempfile.mkdtemp(prefix="radixmesh-")))
    return config


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
