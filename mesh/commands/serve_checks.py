"""What `radixmesh serve` checks before it starts a service: the flags' values (MeshConfig's
messages in the command line's words), --host as an address, the ports free, the tools
config, the log and endpoints folders. A bad one raises BadFlag naming the flag (exit 2)."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import ipaddress
import os
import re
import socket
import tempfile
from pathlib import Path

from radixmesh.errors import InvalidArgument

LOOPBACK = "127.0.0.1"


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
