"""`ServerConfig`: where and how a service listens (no gRPC import: cores may read it)."""

from __future__ import annotations

import argparse
import math
import os
import re
import socket
from dataclasses import dataclass

from radixmesh.errors import InvalidArgument

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _check_port(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise InvalidArgument(
            f"{field}: must be an int in [0, 65535] (0 picks a free port), got {value!r}"
        )


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One service's listening setup, validated on construction."""

    # Service name for logs and metrics ("cache", "scheduler"): a snake_case word.
    name: str
    # Interface to bind; "127.0.0.1" (loopback) by default, "0.0.0.0" in containers.
    host: str = "127.0.0.1"
    # gRPC port; 0 picks a free one (read it back from `ServiceRuntime.port`).
    port: int = 0
    # Prometheus `/metrics` HTTP port on `host`; None turns it off, 0 picks a free one.
    metrics_port: int | None = None
    # Seconds in-flight calls get to finish after a shutdown request.
    grace_seconds: float = 5.0
    # Largest gRPC message accepted or sent, in MiB.
    max_message_mb: int = 64
    # OTLP/gRPC collector for this service's trace spans; empty turns tracing off.
    otlp_endpoint: str = ""
    # Share of traces this service starts that are recorded, in [0, 1] (head sampling by
    # trace id); a trace continued from a traceparent follows its sampled flag.
    otlp_sample_rate: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise InvalidArgument(f"name: must be a snake_case word, got {self.name!r}")
        if not isinstance(self.host, str) or not self.host:
            raise InvalidArgument(f"host: must be a non-empty string, got {self.host!r}")
        _check_port("port", self.port)
        if self.metrics_port is not None:
            _check_port("metrics_port", self.metrics_port)
        grace = self.grace_seconds
        if (
            isinstance(grace, bool)
            or not isinstance(grace, int | float)
            or not math.isfinite(grace)
            or grace < 0
        ):
            raise InvalidArgument(f"grace_seconds: must be a finite number >= 0, got {grace!r}")
        mb = self.max_message_mb
        if isinstance(mb, bool) or not isinstance(mb, int) or not 1 <= mb <= 2047:
            raise InvalidArgument(f"max_message_mb: must be an int in [1, 2047], got {mb!r}")
        rate = self.otlp_sample_rate
        if (
            isinstance(rate, bool)
            or not isinstance(rate, int | float)
            or not 0.0 <= rate <= 1.0  # NaN fails too
        ):
            raise InvalidArgument(f"otlp_sample_rate: must be a number in [0, 1], got {rate!r}")

    @property
    def max_message_bytes(self) -> int:
        return self.max_message_mb * 1024 * 1024

    @classmethod
    def from_args(cls, name: str, args: argparse.Namespace) -> ServerConfig:
        """Build from the flags `add_server_arguments` added."""
        return cls(
            name=name,
            host=args.host,
            port=args.port,
            metrics_port=args.metrics_port,
            grace_seconds=args.grace_seconds,
            max_message_mb=args.max_message_mb,
            otlp_endpoint=getattr(args, "otlp_endpoint", "") or "",
            otlp_sample_rate=getattr(args, "otlp_sample_rate", 1.0),
        )


def add_server_arguments(parser: argparse.ArgumentParser, *, default_port: int = 0) -> None:
    """--host, --port, --metrics-port, --grace-seconds, --max-message-mb, --otlp-endpoint,
    --otlp-sample-rate."""
    group = parser.add_argument_group("server")
    group.add_argument(
        "--host", default="127.0.0.1", help="interface to bind (default %(default)s)"
    )
    group.add_argument(
        "--port",
        type=int,
        default=default_port,
        help="gRPC port, 0 = any free one (default %(default)s)",
    )
    group.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="Prometheus /metrics port, 0 = any free one (default off)",
    )
    group.add_argument(
        "--grace-seconds",
        type=float,
        default=5.0,
        help="shutdown grace for in-flight calls (default %(default)s)",
    )
    group.add_argument(
        "--max-message-mb",
        type=int,
        default=64,
        help="largest gRPC message in MiB (default %(default)s)",
    )
    group.add_argument(
        "--otlp-endpoint",
        default=os.environ.get("RADIXMESH_OTLP_ENDPOINT", ""),
        help="OTLP/gRPC collector for trace spans (default $RADIXMESH_OTLP_ENDPOINT, else off)",
    )
    group.add_argument(
        "--otlp-sample-rate",
        type=float,
        default=_env_float("RADIXMESH_OTLP_SAMPLE_RATE", 1.0),
        help="share of the traces this service starts that are recorded, in [0, 1]; a "
        "trace continued from a caller's traceparent follows its sampled flag (default "
        "$RADIXMESH_OTLP_SAMPLE_RATE, else 1)",
    )


def _env_float(name: str, default: float) -> float:
    """A float environment variable; InvalidArgument naming it when it is not a number."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return float(value)
    except ValueError:
        raise InvalidArgument(f"${name} must be a number, got {value!r}") from None


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks; another process may take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
