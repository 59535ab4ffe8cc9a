"""The whole mesh on one machine: cache, executors, scheduler, gateway and Envoy as processes.

    mesh = Mesh(MeshConfig(model_dir=path, public_port=8080))
    await mesh.start()          # in order, each stage SERVING before the next starts
    print(mesh.endpoints())
    await mesh.wait_exit()      # returns if a service dies
    await mesh.stop()           # reverse order: Envoy, gateway, scheduler, executors, cache

Services listen on loopback ports picked free at start; only Envoy's public
listener binds `public_host`. Logs go to `<log_dir>/<service>.log`.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import radixmesh
from gateway.envoy import GatewayAddress, render_envoy_config
from gateway.envoy.process import EnvoyProcess
from mesh.restarts import RestartPolicy
from mesh.supervisor import (
    ServiceFailed,
    ServiceSpec,
    Supervisor,
    launcher,
    log_tail,
)
from radixmesh.errors import InvalidArgument, RadixmeshError
from services.common.config import free_port

LOOPBACK = "127.0.0.1"
DEVICES = ("auto", "cpu", "cuda")
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
    """Interface of Envoy's public listener."""
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
    """Longest wait for one service to report SERVING (an executor loads its model)."""
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
    max_num_seqs: int | None = None
    """Most sequences in a step, every executor's and the scheduler's (decode graphs are
    captured up to it); None keeps their default (256)."""
    max_num_batched_tokens: int | None = None
    """Most tokens in one step, every executor's (the scheduler fits its step budget to the
    executors'); None keeps their default (8,192). At most `extend_graph_tokens`, every step
    that is not a plain decode replays an extend graph instead of running eagerly."""

    def __post_init__(self) -> None:
        if not (Path(self.model_dir) / "config.json").is_file():
            raise InvalidArgument(f"model: {self.model_dir} has no config.json")
        if self.device not in DEVICES and not self.device.startswith("cuda:"):
            raise InvalidArgument(
                f"device: must be one of {DEVICES} or cuda:N, got {self.device!r}"
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
        if self.rate_limit_per_s < 0 or self.rate_limit_burst < 0:
            raise InvalidArgument("rate_limit_per_s and rate_limit_burst: must be >= 0")
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


@dataclass(frozen=True, slots=True)
class MeshPorts:
    """Every loopback port of one mesh, picked free when it starts."""

    cache: int
    cache_metrics: int
    executors: tuple[tuple[int, int], ...]
    """(gRPC port, metrics port) per executor."""
    scheduler: int
    scheduler_metrics: int
    gateways: tuple[tuple[int, int, int], ...]
    """(gRPC port, HTTP port, metrics port) per gateway replica."""
    admin: int

    @property
    def gateway(self) -> int:
        """The first gateway's gRPC port."""
        return self.gateways[0][0]

    @property
    def gateway_http(self) -> int:
        return self.gateways[0][1]

    @property
    def gateway_metrics(self) -> int:
        return self.gateways[0][2]

    @classmethod
    def pick(cls, num_executors: int, admin_port: int = 0, num_gateways: int = 1) -> MeshPorts:
        taken: set[int] = set()

        def port() -> int:
            while (p := free_port()) in taken:
                pass
            taken.add(p)
            return p

        return cls(
            cache=port(),
            cache_metrics=port(),
            executors=tuple((port(), port()) for _ in range(num_executors)),
            scheduler=port(),
            scheduler_metrics=port(),
            gateways=tuple((port(), port(), port()) for _ in range(num_gateways)),
            admin=admin_port or port(),
        )


def _python(module: str, *args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", module, *args)


def _address(port: int) -> str:
    return f"{LOOPBACK}:{port}"


def executor_device(device: str, index: int) -> str:
    """The device of executor `index`: "cuda" spreads executors over GPUs, others are as given."""
    return f"cuda:{index}" if device == "cuda" else device


def plan_stages(config: MeshConfig, ports: MeshPorts) -> list[list[ServiceSpec]]:
    """The services in start order: cache; the executors together; scheduler; gateway."""
    timeout = config.start_timeout_s
    common = ("--host", LOOPBACK)
    cache = ServiceSpec(
        "cache",
        _python(
            "services.cache.main",
            *common,
            *("--port", str(ports.cache), "--metrics-port", str(ports.cache_metrics)),
            *(("--redis-url", config.redis_url) if config.redis_url else ()),
        ),
        _address(ports.cache),
        "radixmesh.v1.Cache",
        ports.cache_metrics,
        timeout,
    )
    executors = []
    for i, (port, metrics) in enumerate(ports.executors):
        argv = _python(
            "services.executor.main",
            *common,
            *("--port", str(port), "--metrics-port", str(metrics)),
            *("--model", str(config.model_dir)),
            *("--device", executor_device(config.device, i * config.tensor_parallel_size)),
            *("--tensor-parallel-size", str(config.tensor_parallel_size)),
            *("--cache-address", _address(ports.cache), "--executor-id", f"exec-{i}"),
            *(("--num-pages", str(config.num_pages)) if config.num_pages else ()),
            *_kv_fraction_args(config.kv_memory_fraction),
            *("--quantization", config.quantization),
            *("--speculative", config.speculative),
            *(
                ("--num-speculative-tokens", str(config.num_speculative_tokens))
                if config.num_speculative_tokens is not None
                else ()
            ),
            *("--jump-forward", config.jump_forward),
            *(("--batch-invariant",) if config.batch_invariant else ()),
            *(
                ("--extend-graph-tokens", str(config.extend_graph_tokens))
                if config.extend_graph_tokens
                else ()
            ),
            *_max_seqs_args(config.max_num_seqs),
            *(
                ("--max-num-batched-tokens", str(config.max_num_batched_tokens))
                if config.max_num_batched_tokens is not None
                else ()
            ),
        )
        executors.append(
            ServiceSpec(
                f"executor-{i}", argv, _address(port), "radixmesh.v1.Executor", metrics, timeout
            )
        )
    scheduler = ServiceSpec(
        "scheduler",
        _python(
            "services.scheduler.main",
            *common,
            *("--port", str(ports.scheduler), "--metrics-port", str(ports.scheduler_metrics)),
            *("--cache-address", _address(ports.cache)),
            *[arg for port, _ in ports.executors for arg in ("--executor", _address(port))],
            *_queue_wait_args(config.max_queue_wait_s),
            *_steps_per_plan_args(config.decode_steps_per_plan),
            *_max_seqs_args(config.max_num_seqs),
        ),
        _address(ports.scheduler),
        "radixmesh.v1.Scheduler",
        ports.scheduler_metrics,
        timeout,
    )
    return [[cache], executors, [scheduler], gateway_specs(config, ports)]


def gateway_name(index: int, num_gateways: int) -> str:
    """"gateway" for a single replica, "gateway-<index>" among several."""
    return "gateway" if num_gateways == 1 else f"gateway-{index}"


def gateway_specs(config: MeshConfig, ports: MeshPorts) -> list[ServiceSpec]:
    """One spec per gateway replica, all alike but for their ports."""
    shared = [
        *("--model", str(config.model_dir)),
        *("--scheduler-address", _address(ports.scheduler)),
        *("--cache-address", _address(ports.cache)),
        *("--grace-seconds", repr(float(config.grace_s))),
        *("--envoy-admin-url", f"http://{LOOPBACK}:{ports.admin}"),  # the edge admission limit
    ]
    if config.redis_url:
        shared += ["--redis-url", config.redis_url]
    for key in config.api_keys:
        shared += ["--api-key", key]
    if config.rate_limit_per_s:
        shared += ["--rate-limit-per-s", str(config.rate_limit_per_s)]
    if config.rate_limit_burst:
        shared += ["--rate-limit-burst", str(config.rate_limit_burst)]
    if config.rate_limit == "adaptive":
        shared += ["--rate-limit", "adaptive", "--rate-limit-share", repr(config.rate_limit_share)]
    if config.result_cache:
        shared.append("--result-cache")
    if config.tools_config is not None:
        shared += ["--tools-config", str(config.tools_config)]
    shared += ["--program-branch-prediction", "on" if config.program_branch_prediction else "off"]
    specs = []
    for i, (grpc_port, http_port, metrics_port) in enumerate(ports.gateways):
        argv = _python(
            "gateway.main",
            *("--host", LOOPBACK, "--port", str(grpc_port), "--http-port", str(http_port)),
            *("--metrics-port", str(metrics_port)),
            *shared,
        )
        specs.append(
            ServiceSpec(
                gateway_name(i, len(ports.gateways)),
                argv,
                _address(grpc_port),
                "radixmesh.v1.Inference",
                metrics_port,
                config.start_timeout_s,
                extra={"http": _address(http_port)},
            )
        )
    return specs


def _queue_wait_args(seconds: float | None) -> tuple[str, ...]:
    return () if seconds is None else ("--max-queue-wait-s", repr(float(seconds)))


def _steps_per_plan_args(num_steps: int | None) -> tuple[str, ...]:
    return () if num_steps is None else ("--decode-steps-per-plan", str(num_steps))


def _max_seqs_args(num_seqs: int | None) -> tuple[str, ...]:
    return () if num_seqs is None else ("--max-num-seqs", str(num_seqs))


def _is_gateway(name: str) -> bool:
    return name.split("-")[0] == "gateway"


def _kinds(names: list[str]) -> list[list[str]]:
    """Consecutive names of one kind ("executor-0", "executor-1") grouped, order kept."""
    groups: list[list[str]] = []
    for name in names:
        if groups and groups[-1][0].split("-")[0] == name.split("-")[0]:
            groups[-1].append(name)
        else:
            groups.append([name])
    return groups


def _kv_fraction_args(fraction: float | None) -> tuple[str, ...]:
    return () if fraction is None else ("--kv-memory-fraction", repr(fraction))


def child_env() -> dict[str, str]:
    """The environment of every child: this one, with the project root importable."""
    root = str(Path(radixmesh.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # OpenMP workers that spin between parallel regions starve the other services (and the
    # executor's own gRPC loop) on a small CPU machine; sleeping costs a CPU forward little.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


DRAIN_MARGIN_S = 5.0
"""Beyond the grace period, how long the gateway gets to end the last streams and exit."""


@dataclass(frozen=True, slots=True)
class ExitInfo:
    """A service that exited: its name, exit code and the last lines of its log."""

    name: str
    code: int | None
    log_tail: str


@dataclass(slots=True)
class Mesh:
    """One running mesh; see the module docstring."""

    config: MeshConfig
    ports: MeshPorts | None = None
    supervisor: Supervisor = field(init=False)
    envoy: EnvoyProcess | None = None

    on_spawn: Callable[[str, int], None] | None = None
    """Called with (service name, pid) as each process starts."""
    _envoy_exit: asyncio.Future[int | None] | None = field(default=None, init=False)
    """Resolves with the running Envoy's exit code."""

    def __post_init__(self) -> None:
        report = self.on_spawn
        self.supervisor = Supervisor(
            self.config.log_dir,
            child_env(),
            stop_timeout_s=self.config.stop_timeout_s,
            on_spawn=None if report is None else lambda s: report(s.spec.name, s.pid),
        )

    @property
    def model_name(self) -> str:
        return Path(self.config.model_dir).resolve().name

    async def start(self) -> None:
        """Start every stage, then Envoy. Raises ServiceFailed; the caller calls stop()."""
        self.ports = self.ports or MeshPorts.pick(
            self.config.num_executors, self.config.admin_port, self.config.num_gateways
        )
        for stage in plan_stages(self.config, self.ports):
            await self.supervisor.start_stage(stage)
        await self._start_envoy(self.ports)

    async def _start_envoy(self, ports: MeshPorts) -> None:
        log_dir = Path(self.config.log_dir)
        config_path = log_dir / "envoy.yaml"
        config_path.write_text(
            render_envoy_config(
                self.config.public_port,
                ports.admin,
                [GatewayAddress(LOOPBACK, grpc, http) for grpc, http, _ in ports.gateways],
                public_address=self.config.public_host,
            )
        )
        self.envoy = EnvoyProcess(
            config_path,
            ports.admin,
            access_log_path=log_dir / "envoy-access.log",
            process_group=0,
            command_prefix=launcher(),
            drain_time_s=self.config.grace_s,
        )
        try:
            await asyncio.to_thread(self.envoy.start, min(self.config.start_timeout_s, 60.0))
        except RadixmeshError as exc:
            raise ServiceFailed("envoy", str(exc), self.envoy.log_tail[-4000:]) from None
        if self.on_spawn is not None and self.envoy.pid is not None:
            self.on_spawn("envoy", self.envoy.pid)
        # one waiting thread per Envoy process, ending with it (not one per wait_exit_info)
        self._envoy_exit = asyncio.ensure_future(asyncio.to_thread(self.envoy.wait))

    async def wait_exit(self) -> str:
        """Wait until any service exits; returns a message naming it, its code and its log tail."""
        exited = await self.wait_exit_info()
        return f"service {exited.name!r} exited with code {exited.code}\n{exited.log_tail}"

    async def wait_exit_info(self) -> ExitInfo:
        """Wait until any service (Envoy included) exits; which one, its code and log tail."""
        service_exit = asyncio.create_task(self.supervisor.wait_any_exit())
        envoy, envoy_exit = self.envoy, self._envoy_exit
        waits: set[asyncio.Future] = {service_exit}
        if envoy_exit is not None:
            waits.add(envoy_exit)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            service_exit.cancel()
        if service_exit.done() and not service_exit.cancelled():
            service = service_exit.result()
            return ExitInfo(service.spec.name, service.process.returncode, log_tail(service.log_path))
        assert envoy is not None and envoy_exit is not None
        return ExitInfo("envoy", envoy_exit.result(), envoy.log_tail[-4000:])

    async def restart(self, name: str) -> None:
        """Start the exited service `name` (or "envoy") again on its ports; raises ServiceFailed."""
        if name != "envoy":
            await self.supervisor.restart(name)
            return
        assert self.ports is not None
        await self._start_envoy(self.ports)

    async def drain(self, grace_s: float) -> dict[str, int | None]:
        """Stop from the edge inwards, letting in-flight requests finish. Name -> exit code.

        Envoy drains its listeners (clients are told to close their connections); each
        gateway replica (all at once) turns NOT_SERVING, refuses new requests with UNAVAILABLE and gives those
        in flight `grace_s` (its --grace-seconds), then ends the rest with an UNAVAILABLE
        error event and exits; then Envoy stops, then the scheduler, the executors (all
        at once) and the cache.
        """
        codes: dict[str, int | None] = {}
        if self.envoy is not None:
            await asyncio.to_thread(self.envoy.drain_listeners)
        edge = [s.spec.name for s in self.supervisor.services if _is_gateway(s.spec.name)]
        for stopped in await asyncio.gather(  # the replicas drain together
            *(self.supervisor.stop([name], timeout_s=grace_s + DRAIN_MARGIN_S) for name in edge)
        ):
            codes.update(stopped)
        if self.envoy is not None:
            codes["envoy"] = await asyncio.to_thread(self.envoy.stop, self.config.stop_timeout_s)
        inner = [s.spec.name for s in reversed(self.supervisor.services) if s.spec.name not in codes]
        for group in _kinds(inner):  # the executors stop together
            for stopped in await asyncio.gather(*(self.supervisor.stop([n]) for n in group)):
                codes.update(stopped)
        return codes

    async def stop(self) -> dict[str, int | None]:
        """Stop Envoy, then every service in reverse start order. Name -> exit code."""
        codes: dict[str, int | None] = {}
        if self.envoy is not None:
            codes["envoy"] = await asyncio.to_thread(self.envoy.stop, self.config.stop_timeout_s)
        codes.update(await self.supervisor.stop_all())
        return codes

    async def kill(self) -> dict[str, int | None]:
        """SIGKILL everything at once (a second stop signal). Name -> exit code."""
        codes: dict[str, int | None] = {}
        if self.envoy is not None:
            codes["envoy"] = await asyncio.to_thread(self.envoy.stop, 0.0)
        codes.update(await self.supervisor.kill_all())
        return codes

    def pids(self) -> dict[str, int]:
        pids = {s.spec.name: s.pid for s in self.supervisor.services}
        if self.envoy is not None and self.envoy.pid is not None:
            pids["envoy"] = self.envoy.pid
        return pids

    def endpoints(self) -> dict:
        """Everything a client or an operator needs, as plain data (printed as JSON too)."""
        assert self.ports is not None
        public = f"{self.config.public_host}:{self.config.public_port}"
        return {
            "model": self.model_name,
            "public": public,
            "http": f"http://{public}",
            "admin": f"http://{LOOPBACK}:{self.ports.admin}",
            "log_dir": str(self.config.log_dir),
            "services": [
                {
                    "name": s.spec.name,
                    "address": s.spec.address,
                    "metrics_port": s.spec.metrics_port,
                    "pid": s.pid,
                    **s.spec.extra,
                }
                for s in self.supervisor.services
            ]
            + [{"name": "envoy", "admin_port": self.ports.admin, "pid": self.pids().get("envoy")}],
        }

    def endpoints_json(self) -> str:
        return json.dumps(self.endpoints())
