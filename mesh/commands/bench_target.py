"""`radixmesh bench`'s target and its errors: --target checked for the API, a gRPC target
probed once before any load, connection errors as one readable line, and config field
names in messages turned into the flags that set them."""

from __future__ import annotations

import argparse
import re
from typing import Any

from radixmesh.errors import InvalidArgument


class TargetError(Exception):
    """The target did not answer as an OpenAI-compatible server."""


FLAG_OF_FIELD = {
    "num_requests": "--num-requests",
    "num_programs": "--num-requests",
    "duration_s": "--duration",
    "num_turns": "--turns",
    "profiles": "--profile",
    "repeats": "--program-repeats",
    "modes": "--program-modes",
    "concurrencies": "--concurrency",
    "max_tokens": "--output-len",
}
"""Config fields (mesh/loadgen) whose flag is not `--` and the field's name dashed."""

_FIELD = re.compile(r"([a-z][a-z0-9_]*)((?:[.\[][^:\s]*)?): ")


def name_the_flag(
    message: str, args: argparse.Namespace, renames: dict[str, str] | None = None
) -> str:
    """A config error (`num_requests: must be >= 1, got 0`) as the user's flag
    (`--num-requests: must be >= 1, got 0`): the leading field is renamed by `renames`,
    else by its flag when `args` has one of that name; any other message is kept."""
    match = _FIELD.match(message)
    if match is None:
        return message
    field = match.group(1)
    flag = (renames or {}).get(field)
    if flag is None and field in vars(args):
        flag = "--" + field.replace("_", "-")
    if flag is None:
        return message
    return f"{flag}{match.group(2)}: {message[match.end():]}"


def check_target(target: str, api: str) -> None:
    """--target: an http(s) URL for the OpenAI API; for gRPC (--api grpc, --workload
    program) host:port, with or without a scheme. InvalidArgument naming --target."""
    from urllib.parse import urlsplit

    needs_http = api == "openai"
    example = "http://127.0.0.1:8080" if needs_http else "127.0.0.1:8080"
    wrong = InvalidArgument(f"target: expected a URL such as {example}, got {target!r}")
    parts = urlsplit(target if "://" in target or needs_http else f"grpc://{target}")
    schemes = ("http", "https") if needs_http else ("http", "https", "grpc")
    try:
        port = parts.port
    except ValueError:
        raise wrong from None
    if parts.scheme not in schemes or not parts.hostname or (port is None and not needs_http):
        raise wrong
    if not needs_http and parts.path not in ("", "/"):
        raise wrong


def describe_error(exc: BaseException, where: str) -> str:
    """One readable line for a failed HTTP call to `where` (a URL)."""
    import socket

    import aiohttp

    if isinstance(exc, aiohttp.ClientConnectorError):
        cause = exc.os_error
        if isinstance(cause, ConnectionRefusedError):
            reason = "connection refused"
        elif isinstance(cause, socket.gaierror):
            reason = "unknown host"
        else:
            reason = (getattr(cause, "strerror", None) or str(cause) or type(cause).__name__).lower()
        return f"cannot connect to {exc.host}:{exc.port}: {reason}"
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"{where} answered HTTP {exc.status} {exc.message}".rstrip()
    if isinstance(exc, TimeoutError):
        return f"{where} did not answer in time"
    if isinstance(exc, aiohttp.ClientError):
        return f"{where}: {str(exc) or type(exc).__name__}"
    return f"{where} did not answer with a model list ({type(exc).__name__}: {exc})"


def describe_rpc_error(exc: Any, target: str) -> str:
    """One readable line for a failed gRPC call to `target` (host:port)."""
    import grpc

    details = exc.details() or ""
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        lowered = details.lower()
        for cause in ("connection refused", "connection reset", "no route to host"):
            if cause in lowered:
                return f"cannot connect to {target}: {cause}"
        if "dns resolution failed" in lowered or "name or service not known" in lowered:
            return f"cannot connect to {target}: unknown host"
        return f"cannot connect to {target}: {details or 'unavailable'}"
    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{target} did not answer in time"
    return f"{target} answered {exc.code().name}: {details}"


PROBE_TIMEOUT_S = 10.0


async def probe_grpc(target: str, api_key: str) -> None:
    """Inference.ListModels at `target` (host:port); TargetError naming the target and
    the reason when it does not answer."""
    import grpc

    from radixmesh.v1 import inference_pb2, inference_pb2_grpc

    metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
    async with grpc.aio.insecure_channel(target) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        try:
            await stub.ListModels(
                inference_pb2.ListModelsRequest(), metadata=metadata, timeout=PROBE_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            raise TargetError(describe_rpc_error(exc, target)) from None


def grpc_address(target: str) -> str:
    """host:port of a --target checked by `check_target` for gRPC."""
    return target.split("://", 1)[-1].rstrip("/")
