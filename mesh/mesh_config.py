"""What `radixmesh serve` runs: the mesh's settings, checked before any service starts
(each bad one names its field), handed to mesh.launcher."""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from mesh.restarts import RestartPolicy
from radixmesh.errors import InvalidArgument
from radixmesh.step import MAX_STEPS_PER_PLAN

DEVICES = ("auto", "cpu", "cuda")
_CUDA_INDEX = re.compile(r"cuda:[0-9]+")
MAX_NUM_SEQS = 4096
MAX_NUM_BATCHED_TOKENS = 1 << 20
"""The largest running batch serve accepts (decode graphs are captured up to it)."""
MAX_DRAFT_TOKENS = 64
"""The most draft tokens an executor verifies per sequence and step (its SpeculativeConfig's
bound), checked here so that serve refuses the flag before any service starts."""


@dataclass(frozen=True, slots=True)
class MeshConfig:
    model_dir: Path
    """Hugging Face model folder served by every executor and the gateway."""
    log_dir: Path
    """Where each service's log, Envoy's config and its access log are written."""
    public_host: str = "127.0.0.1"
    """Interface of Envoy's public listener: an IP address (Envoy resolves no names;
    `radixmesh serve --host` resolves one such as `localhost` before it gets here)."""
    public_port: int = 8080
    """Envoy's public port: HTTP/1.1, HTTP/2 and gRPC."""
    admin_port: int = 0
    """Envoy's admin port on loopback; 0 picks a free one."""
    device: str = "auto"
    """Executor device: auto (CUDA when present), cpu, cuda or cuda:N. With "cuda" and
    several executors, executor i runs on cuda:i (one GPU each)."""
    num_executors: int = 1
    num_gateways: int = 1
    """Gateway replicas behind Envoy, each its own process and ports ("gateway" when one,
    "gateway-0" ... otherwise); Envoy balances them and health-checks each."""
    redis_url: str = ""
    """Shared result cache, sessions and rate-limit buckets; empty keeps them in-process."""
    api_keys: tuple[str, ...] = ()
    """Accepted API keys; empty turns authentication off."""
    rate_limit_per_s: float = 0.0
    """Requests per second per API key at the gateway; 0 turns the limit off."""
    rate_limit_burst: float = 0.0
    """Bucket size of that limit; 0 means two seconds' worth."""
    rate_limit: str = "fixed"
    """The gateway's --rate-limit: "fixed" (rate_limit_per_s per key) or "adaptive" (each
    key a share of the scheduler's measured requests/s, at least rate_limit_per_s)."""
    rate_limit_share: float = 0.25
    """Adaptive: each key's share of the measured capacity, in (0, 1]."""
    result_cache: bool = False
    """Serve repeated deterministic requests from the cache service's result cache."""
    tools_config: Path | None = None
    """JSON file of the program tools and plugins the gateway loads (docs/programs.md)."""
    program_branch_prediction: bool = True
    """Every gateway's --program-branch-prediction: prefill an If's likely branch while its
    condition is computed (from the If's history in the result store)."""
    num_pages: int | None = None
    """KV pages per executor; None lets the executor size its pool."""
    speculative: str = "off"
    """Every executor's --speculative: "off", "ngram", "suffix" or "radix"."""
    num_speculative_tokens: int | None = None
    """Every executor's --num-speculative-tokens (most draft tokens verified per sequence
    and step); None keeps the executor's default."""
    jump_forward: str = "auto"
    """Every executor's --jump-forward: on, off or auto (on the CPU, not on CUDA)."""
    batch_invariant: bool = False
    """Every executor's --batch-invariant: a sequence's logits independent of its batch
    (greedy outputs equal with speculation on and off at any batch size)."""
    extend_graph_tokens: int = 0
    """Every executor's --extend-graph-tokens (0: extends run eagerly)."""
    kv_memory_fraction: float | None = None
    """On CUDA without num_pages: share of the free memory each executor gives its KV pool;
    None keeps the executor's default."""
    quantization: str = "auto"
    """Executors' projection weights: auto (the checkpoint's format), fp8 or none."""
    tensor_parallel_size: int = 1
    """Devices (ranks) per executor; with device "cuda" executor i takes GPUs i*N..i*N+N-1."""
    start_timeout_s: float = 600.0
    """Longest wait for one service to report SERVING (an executor loads its model); > 0."""
    stop_timeout_s: float = 15.0
    """Grace per inner service (scheduler, executors, cache) on stop before SIGKILL."""
    grace_s: float = 30.0
    """Drain: how long in-flight requests may finish after a stop signal (the gateway's
    --grace-seconds); those still running then end with an UNAVAILABLE error event."""
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    """When a service that died is started again, and when serve gives up."""
    max_queue_wait_s: float | None = None
    """The scheduler's wait-based admission bound (0 turns it off); None keeps its default."""
    decode_steps_per_plan: int | None = None
    """The scheduler's multi-step decode plans (1: a plan per step); None keeps its default."""
    max_steps_in_flight: int | None = None
    """The most steps the scheduler keeps in flight to an executor (above 2 it deepens
    only while its plans arrive late: pipeline_depth.py); None keeps its default (4)."""
    max_num_seqs: int | None = None
    """Most sequences in a step, every executor's and the scheduler's (decode graphs are
    captured up to it); None keeps their default (256)."""
    max_num_batched_tokens: int | None = None
    """Most tokens in one step, every executor's (the scheduler fits its step budget to the
    executors'); None keeps their default (8,192). At most `extend_graph_tokens`, every step
    that is not a plain decode replays an extend graph instead of running eagerly."""
    status_port: int = 0
    """serve's status page port on loopback: 0 picks a free one, -1 turns the page off;
    otherwise in [1, 65535]."""

    def __post_init__(self) -> None:
        if not (Path(self.model_dir) / "config.json").is_file():
            raise InvalidArgument(f"model: {self.model_dir} has no config.json")
        if self.device not in DEVICES and not _CUDA_INDEX.fullmatch(self.device):
            raise InvalidArgument(
                "device: must be auto, cpu, cuda or cuda:N (N a GPU index >= 0), "
                f"got {self.device!r}"
            )
        if not 1 <= self.num_executors <= 64:
            raise InvalidArgument(f"executors: must be in [1, 64], got {self.num_executors}")
        if not 1 <= self.num_gateways <= 64:
            raise InvalidArgument(f"gateways: must be in [1, 64], got {self.num_gateways}")
        if not 1 <= self.tensor_parallel_size <= 64:
            raise InvalidArgument(
                f"tensor_parallel_size: must be in [1, 64], got {self.tensor_parallel_size}"
            )
        if self.batch_invariant and (self.quantization == "fp8" or self.tensor_parallel_size > 1):
            raise InvalidArgument(
                "batch_invariant: cannot be combined with quantization fp8 or "
                f"tensor_parallel_size > 1 (got {self.quantization}, {self.tensor_parallel_size})"
            )
        if not 0 < self.public_port < 65536:
            raise InvalidArgument(f"port: must be in [1, 65535], got {self.public_port}")
        if not 0 <= self.admin_port < 65536:
            raise InvalidArgument(f"admin_port: must be in [0, 65535], got {self.admin_port}")
        try:
            ipaddress.ip_address(self.public_host)
        except ValueError:
            raise InvalidArgument(
                f"public_host: must be an IP address, got {self.public_host!r}"
            ) from None
        if not -1 <= self.status_port < 65536:
            raise InvalidArgument(
                "status_port: must be -1 (off), 0 (a free port) or in [1, 65535], "
                f"got {self.status_port}"
            )
        ports = {"public_port": self.public_port}
        for name in ("admin_port", "status_port"):  # 0 and -1: picked free, or off
            port = getattr(self, name)
            taken = [other for other, value in ports.items() if value == port]
            if port > 0 and taken:
                raise InvalidArgument(f"{name}: must differ from {taken[0]} (both {port})")
            ports[name] = port
        for name in ("rate_limit_per_s", "rate_limit_burst"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise InvalidArgument(f"{name}: must be a finite number >= 0, got {value}")
        if 0 < self.rate_limit_burst < 1:
            raise InvalidArgument(
                "rate_limit_burst: must be 0 (two seconds' worth) or >= 1 (a bucket holds "
                f"whole requests), got {self.rate_limit_burst}"
            )
        if self.rate_limit not in ("fixed", "adaptive"):
            raise InvalidArgument(
                f"rate_limit: must be 'fixed' or 'adaptive', got {self.rate_limit!r}"
            )
        if not 0 < self.rate_limit_share <= 1:
            raise InvalidArgument(
                f"rate_limit_share: must be in (0, 1], got {self.rate_limit_share}"
            )
        if self.redis_url and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise InvalidArgument(f"redis_url: must start with redis://, got {self.redis_url!r}")
        k = self.decode_steps_per_plan
        if k is not None and not 1 <= k <= MAX_STEPS_PER_PLAN:
            raise InvalidArgument(
                f"decode_steps_per_plan: must be in [1, {MAX_STEPS_PER_PLAN}], got {k}"
            )
        depth = self.max_steps_in_flight
        if depth is not None and not 1 <= depth <= MAX_STEPS_PER_PLAN + 1:
            raise InvalidArgument(
                f"max_steps_in_flight: must be in [1, {MAX_STEPS_PER_PLAN + 1}], got {depth}"
            )
        if self.max_num_seqs is not None and not 1 <= self.max_num_seqs <= MAX_NUM_SEQS:
            raise InvalidArgument(
                f"max_num_seqs: must be in [1, {MAX_NUM_SEQS}], got {self.max_num_seqs}"
            )
        if self.max_num_batched_tokens is not None and not (
            1 <= self.max_num_batched_tokens <= MAX_NUM_BATCHED_TOKENS
        ):
            raise InvalidArgument(
                f"max_num_batched_tokens: must be in [1, {MAX_NUM_BATCHED_TOKENS}], "
                f"got {self.max_num_batched_tokens}"
            )
        if (
            self.max_num_batched_tokens is not None
            and self.extend_graph_tokens > self.max_num_batched_tokens
        ):
            raise InvalidArgument(
                f"extend_graph_tokens: must be at most max_num_batched_tokens "
                f"({self.max_num_batched_tokens}), got {self.extend_graph_tokens}"
            )
        tokens = self.num_speculative_tokens
        if tokens is not None and not 1 <= tokens <= MAX_DRAFT_TOKENS:
            raise InvalidArgument(
                f"num_speculative_tokens: must be in [1, {MAX_DRAFT_TOKENS}], got {tokens}"
            )
        if self.num_pages is not None and self.num_pages < 1:
            raise InvalidArgument(f"num_pages: must be >= 1, got {self.num_pages}")
        if not (math.isfinite(self.start_timeout_s) and self.start_timeout_s > 0):
            raise InvalidArgument(
                f"start_timeout_s: must be a finite number of seconds > 0, "
                f"got {self.start_timeout_s}"
            )
        if not (math.isfinite(self.stop_timeout_s) and self.stop_timeout_s >= 0):
            raise InvalidArgument(
                f"stop_timeout_s: must be a finite number of seconds >= 0, "
                f"got {self.stop_timeout_s}"
            )
        wait = self.max_queue_wait_s
        if wait is not None and not (math.isfinite(wait) and wait >= 0):
            raise InvalidArgument(
                f"max_queue_wait_s: must be 0 (off) or a finite number of seconds > 0, got {wait}"
            )
        policy = self.restart_policy
        if policy.max_restarts > 0 and not policy.window_s > 0:
            raise InvalidArgument(
                "restart_policy.window_s: must be > 0 seconds while restarts are on "
                f"(max_restarts {policy.max_restarts}), got {policy.window_s}"
            )
        if not (math.isfinite(self.grace_s) and 0 <= self.grace_s <= 3600):
            raise InvalidArgument(f"grace: must be in [0, 3600] seconds, got {self.grace_s}")
        fraction = self.kv_memory_fraction
        if fraction is not None and not 0.0 < fraction <= 1.0:
            raise InvalidArgument(f"kv_memory_fraction: must be in (0, 1], got {fraction}")
        if self.extend_graph_tokens and not 32 <= self.extend_graph_tokens <= 8192:
            raise InvalidArgument(
                "extend_graph_tokens: must be 0 (off) or in [32, 8192], "
                f"got {self.extend_graph_tokens}"
            )
        if self.extend_graph_tokens and self.batch_invariant:
            raise InvalidArgument(
                "extend_graph_tokens: cannot be combined with batch_invariant (that mode runs "
                "an extend's attention as decode rows)"
            )
