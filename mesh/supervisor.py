"""Start service processes in stages, wait for their health, stop them all in reverse order.

    supervisor = Supervisor(log_dir)
    await supervisor.start_stage([ServiceSpec("cache", argv, "127.0.0.1:50053", "radixmesh.v1.Cache")])
    ...
    await supervisor.stop_all()

Each child runs in its own process group (a Ctrl-C at the terminal reaches the
supervisor only, which then stops the children in reverse start order) and,
through the `mesh.die_with_parent` launcher, gets SIGTERM should the
supervisor die without stopping it (Linux parent-death signal). A child's
stdout and stderr go to `<log_dir>/<name>.log`; when a child exits before it
is SERVING, or is not SERVING within its timeout, the stage raises
`ServiceFailed` naming the service, the reason and the tail of its log.
Stopping is SIGTERM, a wait of `stop_timeout_s`, then SIGKILL. `restart(name)` starts
an exited child again from its spec, on the same ports, appending to its log; when to
restart is the caller's choice (see `mesh.restarts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from radixmesh.errors import InvalidArgument
from services.common.health import wait_for_serving

TAIL_LINES = 20
EXIT_WAIT_S = 10.0
"""How long a service whose health check failed gets to exit (its code and log are the story)."""


def launcher() -> tuple[str, ...]:
    """The prefix that ties a child to the supervisor's life (see mesh.die_with_parent).

    Run as a script by path, so it works whatever the child's sys.path."""
    return (sys.executable, str(Path(__file__).with_name("die_with_parent.py")), str(os.getpid()))


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """One service process to start and the health check that says it is up."""

    name: str
    """Unique name in logs and messages ("cache", "executor-0", ...)."""
    argv: tuple[str, ...]
    """The command line; argv[0] is the program."""
    address: str
    """HOST:PORT of its gRPC server."""
    health_service: str
    """Service name its gRPC health check must report SERVING."""
    metrics_port: int | None = None
    """Its Prometheus /metrics port, for the endpoint listing."""
    start_timeout_s: float = 120.0
    """Seconds it may take to be SERVING after it is spawned."""
    extra: dict[str, str] = field(default_factory=dict)
    """More endpoints to print (e.g. the gateway's HTTP port)."""

    def __post_init__(self) -> None:
        if not self.name or not self.argv:
            raise InvalidArgument("name and argv: must not be empty")
        if not (math.isfinite(self.start_timeout_s) and self.start_timeout_s > 0):
            raise InvalidArgument(
                f"start_timeout_s: must be a finite number > 0, got {self.start_timeout_s}"
            )


class ServiceFailed(Exception):
    """A service did not start; the message names it and carries its log tail."""

    def __init__(self, name: str, reason: str, log_tail: str = "") -> None:
        self.name = name
        self.reason = reason
        self.log_tail = log_tail
        tail = f"\n--- last lines of its log ---\n{log_tail.rstrip()}" if log_tail.strip() else ""
        super().__init__(f"service {name!r} failed to start: {reason}{tail}")


@dataclass(slots=True)
class RunningService:
    spec: ServiceSpec
    process: asyncio.subprocess.Process
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid


def log_tail(path: Path, num_lines: int = TAIL_LINES) -> str:
    """The last lines of a log file ("" when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-num_lines:])


class Supervisor:
    """The running children, in start order; see the module docstring."""

    def __init__(
        self,
        log_dir: str | Path,
        env: dict[str, str] | None = None,
        stop_timeout_s: float = 15.0,
        on_spawn: Callable[[RunningService], None] | None = None,
    ) -> None:
        self.log_dir = Path(log_dir)
        self._on_spawn = on_spawn
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidArgument(
                f"log_dir: cannot create {self.log_dir}: {exc.strerror or exc}"
            ) from None
        self._env = env
        self.stop_timeout_s = stop_timeout_s
        self.services: list[RunningService] = []

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.services]

    async def spawn(self, spec: ServiceSpec) -> RunningService:
        """Start one child (not waiting for its health)."""
        if any(s.spec.name == spec.name for s in self.services):
            raise InvalidArgument(f"name: service {spec.name!r} is already running")
        running = await self._exec(spec, self.log_dir / f"{spec.name}.log", "wb")
        self.services.append(running)
        if self._on_spawn is not None:
            self._on_spawn(running)
        return running

    async def _exec(self, spec: ServiceSpec, log_path: Path, mode: str) -> RunningService:
        with open(log_path, mode) as log_file:
            process = await asyncio.create_subprocess_exec(
                *launcher(),
                *spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                env=self._env,
                process_group=0,
            )
        return RunningService(spec, process, log_path)

    async def restart(self, name: str) -> RunningService:
        """Start the exited child `name` again from its spec (same ports, log appended to)
        and wait until it is SERVING. Raises ServiceFailed; it keeps its place in start order."""
        index = next((i for i, s in enumerate(self.services) if s.spec.name == name), None)
        if index is None:
            raise InvalidArgument(f"name: no service {name!r}")
        old = self.services[index]
        if old.process.returncode is None:
            raise InvalidArgument(f"name: service {name!r} is still running")
        with open(old.log_path, "ab") as log_file:
            log_file.write(f"--- restarted by the supervisor (pid {old.pid} exited with "
                           f"code {old.process.returncode}) ---\n".encode())  # fmt: skip
        running = await self._exec(old.spec, old.log_path, "ab")
        self.services[index] = running
        if self._on_spawn is not None:
            self._on_spawn(running)
        try:
            await self._wait_ready(running)
        except ServiceFailed:
            await stop_process(running.process, self.stop_timeout_s)  # not SERVING: not kept
            raise
        return running

    async def start_stage(self, specs: Sequence[ServiceSpec]) -> list[RunningService]:
        """Spawn the specs together and wait until every one is SERVING.

        Raises ServiceFailed for the first one that exits or times out; the caller
        stops everything (`stop_all`).
        """
        started = [await self.spawn(spec) for spec in specs]
        waits = [asyncio.create_task(self._wait_ready(s), name=s.spec.name) for s in started]
        try:
            for task in asyncio.as_completed(waits):
                await task
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        return started

    async def _wait_ready(self, service: RunningService) -> None:
        """SERVING, or ServiceFailed when the process exits first or the timeout passes."""
        spec = service.spec
        health = asyncio.create_task(
            wait_for_serving(spec.address, spec.health_service, spec.start_timeout_s)
        )
        exited = asyncio.create_task(service.process.wait())
        try:
            await asyncio.wait([health, exited], return_when=asyncio.FIRST_COMPLETED)
            failed = health.done() and not health.cancelled() and health.exception()
            if isinstance(failed, ConnectionError):
                # The server ended the health watch: it is on its way out; report its exit.
                await asyncio.wait([exited], timeout=EXIT_WAIT_S)
        finally:
            for task in (health, exited):
                task.cancel()
            await asyncio.gather(health, exited, return_exceptions=True)
        if exited.done() and not exited.cancelled():
            raise ServiceFailed(
                spec.name,
                f"exited with code {service.process.returncode} before it was SERVING",
                log_tail(service.log_path),
            )
        exc = health.exception() if not health.cancelled() else None
        if exc is not None:
            reason = str(exc) if isinstance(exc, TimeoutError | ConnectionError) else repr(exc)
            raise ServiceFailed(spec.name, reason, log_tail(service.log_path))

    def exited(self) -> list[RunningService]:
        """Children that are no longer running."""
        return [s for s in self.services if s.process.returncode is not None]

    async def wait_any_exit(self) -> RunningService:
        """Return the first child that exits (it should not while the mesh runs)."""
        tasks = {asyncio.create_task(s.process.wait()): s for s in self.services}
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return tasks[next(iter(done))]

    async def stop_all(self) -> dict[str, int | None]:
        """Stop every child, last started first: SIGTERM, wait, SIGKILL. Name -> exit code."""
        return await self.stop(reversed([s.spec.name for s in self.services]))

    async def stop(
        self, names: Iterable[str], timeout_s: float | None = None
    ) -> dict[str, int | None]:
        """Stop the named children one after the other (SIGTERM, up to timeout_s, default
        `stop_timeout_s`, then SIGKILL). Name -> exit code."""
        by_name = {s.spec.name: s for s in self.services}
        timeout = self.stop_timeout_s if timeout_s is None else timeout_s
        codes: dict[str, int | None] = {}
        for name in names:
            codes[name] = await stop_process(by_name[name].process, timeout)
        return codes

    async def kill_all(self) -> dict[str, int | None]:
        """SIGKILL every child at once (a second Ctrl-C). Name -> exit code."""
        for service in self.services:
            if service.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    service.process.kill()
        return {s.spec.name: await s.process.wait() for s in reversed(self.services)}


async def stop_process(process: asyncio.subprocess.Process, timeout_s: float) -> int | None:
    """SIGTERM, wait up to timeout_s, then SIGKILL; the exit code."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    return process.returncode
