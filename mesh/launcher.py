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
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import radixmesh
from gateway.envoy import GatewayAddress, render_envoy_config
from gateway.envoy.process import EnvoyProcess
from mesh.mesh_config import MeshConfig
from mesh.supervisor import (
    TAIL_LINES,
    ServiceFailed,
    ServiceSpec,
    Supervisor,
    launcher,
    log_tail,
)
from radixmesh.errors import RadixmeshError
from services.common.config import free_port

LOOPBACK = "127.0.0.1"
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
            *_in_flight_args(config.max_steps_in_flight),
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


def _in_flight_args(num_steps: int | None) -> tuple[str, ...]:
    return () if num_steps is None else ("--max-steps-in-flight", str(num_steps))


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
            tail = "\n".join(self.envoy.log_tail[-4000:].splitlines()[-TAIL_LINES:])
            raise ServiceFailed("envoy", str(exc), tail) from None
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
