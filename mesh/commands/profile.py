"""Profile one service of a running mesh: SVG flame graph, speedscope JSON (and torch ops for executors).

    radixmesh profile --service executor-0 --seconds 10 --out profiles/

The service's PID and metrics port come from the running `radixmesh serve`
(found by itself; --port picks one of several, --mesh-info FILE reads an
endpoints JSON instead), or --pid / --metrics-url name a process directly.
py-spy samples the process from outside; where it cannot attach, the
service's own sampler answers on its metrics port (`--method python` asks for
it directly). For an executor, `--torch-steps N` (20 by default) also runs
torch.profiler over its next N steps (CUDA kernels by group on a GPU).
Exit codes: 0 when the files were written, 1 when no profile could be taken,
2 for bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from urllib.parse import urlsplit

from mesh.commands.bench_target import name_the_flag
from radixmesh.errors import InvalidArgument, RadixmeshError

FLAG_OF_FIELD = {"rate_hz": "--rate", "torch_steps": "--torch-steps"}
"""ProfileRequest fields whose flag is not `--` and the field's name dashed."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mesh.observe.profile import METHODS

    parser.add_argument("--service", required=True, help="service name, e.g. executor-0")
    parser.add_argument("--seconds", type=float, default=10.0, help="sampling window")
    parser.add_argument("--out", required=True, help="folder for the profile files")
    parser.add_argument("--rate", type=int, default=100, help="samples per second")
    parser.add_argument("--method", choices=METHODS, default="auto")
    parser.add_argument(
        "--torch-steps", type=int, default=None, help="executor steps under torch.profiler"
    )
    parser.add_argument("--port", type=int, default=None, help="public port of the mesh")
    parser.add_argument("--mesh-info", default=None, help="endpoints JSON of radixmesh serve")
    parser.add_argument("--pid", type=int, default=None, help="profile this process instead")
    parser.add_argument("--metrics-url", default=None, help="with --pid: its metrics server")


def check_flags(args: argparse.Namespace) -> None:
    """--pid and --metrics-url, before anything runs; InvalidArgument naming the flag."""
    if args.pid is not None and args.pid <= 0:
        raise InvalidArgument(f"pid: must be a process id > 0, got {args.pid}")
    if args.metrics_url is not None:
        parts = urlsplit(args.metrics_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidArgument(
                f"metrics_url: expected a URL such as http://127.0.0.1:9100, got {args.metrics_url!r}"
            )


def build_request(args: argparse.Namespace):
    from mesh.observe.meshinfo import find_service, load_mesh_info
    from mesh.observe.profile import ProfileRequest

    check_flags(args)
    pid, metrics_url = args.pid, args.metrics_url
    if pid is None and metrics_url is None:
        service = find_service(load_mesh_info(args.mesh_info, args.port), args.service)
        pid = service.get("pid")
        if service.get("metrics_port"):
            host = service.get("address", "127.0.0.1:0").rpartition(":")[0] or "127.0.0.1"
            metrics_url = f"http://{host}:{service['metrics_port']}"
    torch_steps = args.torch_steps
    if torch_steps is None:
        torch_steps = 20 if args.service.startswith("executor") else 0
    return ProfileRequest(
        service=args.service,
        pid=pid,
        metrics_url=metrics_url.rstrip("/") if metrics_url else None,
        seconds=args.seconds,
        rate_hz=args.rate,
        method=args.method,
        torch_steps=torch_steps if metrics_url else 0,
    )


def run(args: argparse.Namespace) -> int:
    from mesh.observe.meshinfo import process_alive
    from mesh.observe.profile import take_profile

    try:
        request = build_request(args)
    except RadixmeshError as exc:
        print(f"radixmesh profile: {name_the_flag(str(exc), args, FLAG_OF_FIELD)}", file=sys.stderr)
        return 2
    # py-spy on a process that is not there answers with fragments of its backtrace: say
    # so first, where there is no metrics port to fall back on (with one, the service's own
    # sampler takes over from a py-spy that cannot attach, whatever the reason)
    if request.pid is not None and request.metrics_url is None and not process_alive(request.pid):
        print(f"radixmesh profile: no such process {request.pid}", file=sys.stderr)
        return 1
    print(
        f"radixmesh profile: sampling {request.service} (pid {request.pid}) for "
        f"{request.seconds:g} s",
        file=sys.stderr,
        flush=True,
    )
    try:
        result = asyncio.run(take_profile(request, Path(args.out)))
    except RadixmeshError as exc:
        print(f"radixmesh profile: {exc}", file=sys.stderr)
        return 1
    if result.fallback_reason:
        print(f"radixmesh profile: {result.fallback_reason}; used the Python sampler instead")
    print(f"{result.num_samples} samples by {result.method}")
    for kind, path in result.files.items():
        print(f"{kind:<12} {path}")
    if result.torch_error:
        print(f"torch        not traced: {result.torch_error}")
    print("hottest frames (self samples):")
    for frame, count in result.hottest:
        print(f"  {count:>6}  {frame}")
    return 0
