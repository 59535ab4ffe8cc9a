"""Envoy configuration for the edge: `render_envoy_config(...)` -> YAML for `envoy -c`.

The template (`envoy.yaml.j2`, beside this file) documents the routes. JSON
transcoding of `/v1/generate` streams newline-delimited JSON: one
`GenerateResponse` object (proto field names) per line, so a client can
parse each line as it arrives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2

from radixmesh.errors import InvalidArgument
from radixmesh.retry_after import with_retry_after
from radixmesh.status import status_of

TEMPLATE = Path(__file__).with_name("envoy.yaml.j2")
OPENAI_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/")
HTTP_HEALTH_PATH = "/health"
"""The path the gateway's HTTP server answers 200 on while it serves."""
CLUSTERS = ("gateway_grpc", "gateway_http")
"""Envoy's upstream clusters: the gateways' gRPC ports and their HTTP ports."""
UNLIMITED = 100_000
"""Circuit-breaker thresholds while no admission limit is set (far above Envoy's 1,024)."""


@dataclass(frozen=True, slots=True)
class EdgeRoute:
    """One route to the gateways. A generation route has Envoy's DEFAULT routing priority,
    whose circuit breaker carries the edge admission limit (gateway/envoy/admission.py);
    the rest (listing, tokenizing, programs) have HIGH, which is never limited."""

    kind: str
    """"path" (exact) or "prefix"."""
    path: str
    cluster: str
    grpc: bool
    generation: bool

    @property
    def priority(self) -> str:
        return "DEFAULT" if self.generation else "HIGH"


ROUTES = (
    EdgeRoute("path", "/radixmesh.v1.Inference/Generate", "gateway_grpc", True, True),
    EdgeRoute("prefix", "/radixmesh.v1.Inference/", "gateway_grpc", True, False),
    EdgeRoute("prefix", "/radixmesh.v1.Programs/", "gateway_grpc", True, False),
    EdgeRoute("path", "/v1/chat/completions", "gateway_http", False, True),
    EdgeRoute("path", "/v1/completions", "gateway_http", False, True),
    EdgeRoute("path", "/v1/models", "gateway_http", False, False),
    EdgeRoute("prefix", "/v1/models/", "gateway_http", False, False),
)  # fmt: skip
"""In match order; a transcoded call (/v1/generate, ...) is routed by its gRPC path."""
assert {r.path for r in ROUTES if r.cluster == "gateway_http"} == set(OPENAI_PATHS)


TRANSCODE_ERROR_PREFIX = "invalid request body: "
"""Starts the message of the transcoder's 400; its own reason follows."""


@dataclass(frozen=True, slots=True)
class OverloadReply:
    """Envoy's refusal over the edge admission limit, in the gateway's own overload shape:
    HTTP 429 with Retry-After and the JSON error body, gRPC RESOURCE_EXHAUSTED with the
    retry hint ending the message (radixmesh/retry_after.py)."""

    retry_after_s: int = 1
    """The limit is set again a few times a second, so a client may retry soon."""

    @property
    def message(self) -> str:
        return with_retry_after(
            "overloaded: the scheduler admits no more requests now (their estimated queue "
            "wait would pass the bound)",
            self.retry_after_s,
        )

    @property
    def grpc_status(self) -> int:
        return status_of("RESOURCE_EXHAUSTED").number

    @property
    def error_type(self) -> str:
        return status_of("RESOURCE_EXHAUSTED").error_type

    @property
    def code(self) -> str:
        return "resource_exhausted"


@dataclass(frozen=True, slots=True)
class LocalReply:
    """A reply Envoy makes itself, rewritten to the gateway's JSON error body (HTTP only;
    gRPC clients get the status in the trailers). Its error type and code come from the
    contract's status table (`radixmesh.status`), as the gateway's own errors do."""

    status: int
    """Envoy's HTTP status (413 and 431 are Envoy's own, not a gRPC code's)."""
    cause: str
    message: str
    grpc_code: str
    """The gRPC code name the reply stands for, e.g. "UNAVAILABLE"."""

    @property
    def error_type(self) -> str:
        return status_of(self.grpc_code).error_type

    @property
    def code(self) -> str:
        return self.grpc_code.lower()

    @property
    def grpc_number(self) -> int:
        """The code's number, as a transcoded route's google.rpc.Status body carries it."""
        return status_of(self.grpc_code).number


LOCAL_REPLIES = (
    LocalReply(503, "no healthy gateway, or it refused the connection",
               "no gateway is serving right now; retry later", "UNAVAILABLE"),
    LocalReply(504, "the gateway did not answer in time",
               "the gateway did not answer in time; retry later", "DEADLINE_EXCEEDED"),
    LocalReply(413, "a body over Envoy's buffer limit",
               "request body too large", "INVALID_ARGUMENT"),
    LocalReply(400, "a request Envoy could not parse",
               "malformed HTTP request", "INVALID_ARGUMENT"),
    LocalReply(431, "request headers too large",
               "request headers too large", "INVALID_ARGUMENT"),
)  # fmt: skip
"""Every status Envoy answers by itself, besides the rate limit's 429 and the 404 route."""


def default_descriptor_path() -> Path:
    """The descriptor set generated beside the stubs (radixmesh/v1/radixmesh.binpb)."""
    import radixmesh

    return Path(radixmesh.__file__).parent / "v1" / "radixmesh.binpb"


@dataclass(frozen=True, slots=True)
class GatewayAddress:
    """One gateway replica: its gRPC port and its OpenAI-compatible HTTP port."""

    host: str
    grpc_port: int
    http_port: int

    def __post_init__(self) -> None:
        if not self.host:
            raise InvalidArgument("gateway_addresses: host must not be empty")
        for name in ("grpc_port", "http_port"):
            _check_port(f"gateway_addresses.{name}", getattr(self, name))

    @classmethod
    def parse(cls, text: str) -> GatewayAddress:
        """ "host:grpc_port:http_port", e.g. "gateway:50051:8000"."""
        parts = text.rsplit(":", 2)
        if len(parts) != 3 or not all(p.isdigit() for p in parts[1:]):
            raise InvalidArgument(
                f"gateway_addresses: expected host:grpc_port:http_port, got {text!r}"
            )
        return cls(parts[0], int(parts[1]), int(parts[2]))


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Envoy's local token bucket over the whole listener."""

    max_tokens: int
    """Bucket size: the burst of requests let through at once."""
    fill_interval_s: float
    """Every this many seconds, tokens_per_fill tokens are added."""
    tokens_per_fill: int | None = None
    """Default: max_tokens (the bucket refills completely each interval)."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise InvalidArgument(f"rate_limit.max_tokens must be >= 1, got {self.max_tokens}")
        if not (math.isfinite(self.fill_interval_s) and self.fill_interval_s >= 0.001):
            raise InvalidArgument(
                f"rate_limit.fill_interval_s must be >= 0.001, got {self.fill_interval_s}"
            )
        if self.tokens_per_fill is not None and self.tokens_per_fill < 1:
            raise InvalidArgument(
                f"rate_limit.tokens_per_fill must be >= 1, got {self.tokens_per_fill}"
            )

    @property
    def fill_interval(self) -> str:
        return duration(self.fill_interval_s)


def duration(seconds: float) -> str:
    """A protobuf Duration in Envoy's YAML: seconds with a single trailing s, millisecond steps."""
    return f"{round(seconds * 1000) / 1000:.3f}s"


def _check_port(name: str, port: int) -> None:
    if not (isinstance(port, int) and 0 < port < 65536):
        raise InvalidArgument(f"{name} must be a port in [1, 65535], got {port!r}")


def render_envoy_config(
    public_port: int,
    admin_port: int,
    gateway_addresses: Sequence[GatewayAddress | str],
    descriptor_path: str | Path | None = None,
    rate_limit: RateLimit | tuple[int, float] | None = None,
    access_log: bool = True,
    *,
    public_address: str = "0.0.0.0",
    admin_address: str = "127.0.0.1",
    stream_idle_timeout_s: int = 600,
    health_check_interval_s: float = 2.0,
    num_retries: int = 2,
    compress_min_bytes: int = 256,
) -> str:
    """The Envoy YAML for the public listener in front of the given gateway replicas.

    rate_limit: a RateLimit or (max_tokens, fill_interval_s); None turns the local limit off.
    descriptor_path: the proto descriptor set for JSON transcoding; default the packaged one.
    compress_min_bytes: JSON bodies shorter than this (by Content-Length) are sent as they are
    to a client asking for gzip.
    """
    _check_port("public_port", public_port)
    _check_port("admin_port", admin_port)
    gateways = [GatewayAddress.parse(g) if isinstance(g, str) else g for g in gateway_addresses]
    if not gateways:
        raise InvalidArgument("gateway_addresses: at least one gateway is needed")
    if isinstance(rate_limit, tuple):
        rate_limit = RateLimit(*rate_limit)
    if rate_limit is not None and rate_limit.tokens_per_fill is None:
        rate_limit = RateLimit(
            rate_limit.max_tokens, rate_limit.fill_interval_s, rate_limit.max_tokens
        )
    descriptor = Path(descriptor_path) if descriptor_path else default_descriptor_path()
    if not descriptor.is_file():
        raise InvalidArgument(f"descriptor_path: {descriptor} is not a file")
    if stream_idle_timeout_s < 1:
        raise InvalidArgument(f"stream_idle_timeout_s must be >= 1, got {stream_idle_timeout_s}")
    if compress_min_bytes < 0:
        raise InvalidArgument(f"compress_min_bytes must be >= 0, got {compress_min_bytes}")
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    template = environment.from_string(TEMPLATE.read_text())
    return template.render(
        public_port=public_port,
        admin_port=admin_port,
        public_address=public_address,
        admin_address=admin_address,
        gateways=gateways,
        descriptor_path=str(descriptor.resolve()),
        rate_limit=rate_limit,
        access_log=access_log,
        routes=ROUTES,
        unlimited=UNLIMITED,
        overload=OverloadReply(),
        transcode_error_prefix=TRANSCODE_ERROR_PREFIX,
        http_health_path=HTTP_HEALTH_PATH,
        local_replies=LOCAL_REPLIES,
        stream_idle_timeout_s=int(stream_idle_timeout_s),
        health_check_interval=duration(health_check_interval_s),
        num_retries=num_retries,
        compress_min_bytes=int(compress_min_bytes),
    )
