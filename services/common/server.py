"""`ServiceRuntime`: the lifecycle every radixmesh gRPC service shares.

A service's main.py reads its flags, builds its core, then:

    runtime = ServiceRuntime(ServerConfig(name="cache", port=args.port))
    await runtime.start(lambda server: add_CacheServicer_to_server(servicer, server),
                        ["radixmesh.v1.Cache"])
    ...                                   # load, allocate, connect
    runtime.set_serving()                 # health: SERVING
    await runtime.serve_until_signal(on_shutdown=core.close)

Health says NOT_SERVING until `set_serving()`. On SIGTERM/SIGINT (or
`request_shutdown()`) health turns NOT_SERVING for good, the server stops
taking calls and gives in-flight ones `grace_seconds` to finish, then
`on_shutdown` runs, then the metrics endpoint closes.
"""

from __future__ import annotations

import asyncio
import signal
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common.config import ServerConfig, add_server_arguments
from services.common.health import HEALTH_SERVICE_NAME, NOT_SERVING, SERVING, HealthServicer
from services.common.interceptor import ErrorInterceptor
from services.common.logging import get_logger
from services.common.metrics import MetricsServer
from services.common.process_exit import EXIT_SECONDS, end_process, exit_after
from services.common.trace_interceptor import TraceInterceptor
from services.common.tracing import configure_tracing, shutdown_tracing

__all__ = ["ServerConfig", "ServiceRuntime", "add_server_arguments", "run_service"]

log = get_logger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# How long shutdown waits for cancelled handlers to unwind after the grace period, and at
# the end of the grace for open health Watch streams to send their NOT_SERVING.
_UNWIND_SECONDS = 2.0
# grpc's own grace for `server.stop`: never reached, since the runtime ends the grace
# itself (`_cancel_calls_after`); finite, as an event loop's timer must be.
_STOP_WITHOUT_DEADLINE_S = 10 * 365 * 24 * 3600.0


class ServiceRuntime:
    """One grpc.aio server with health, reflection, error mapping, metrics and shutdown."""

    def __init__(self, config: ServerConfig, interceptors: Sequence[Any] = ()) -> None:
        self.config = config
        self._errors = ErrorInterceptor(config.name)
        self._interceptors = (self._errors, TraceInterceptor(), *interceptors)
        self._server: grpc.aio.Server | None = None
        self._health = HealthServicer()
        self._service_names: tuple[str, ...] = ()
        self._metrics: MetricsServer | None = None
        self._port: int | None = None
        self._stop_requested = asyncio.Event()
        self._shutdown_task: asyncio.Task | None = None

    @property
    def port(self) -> int:
        """The bound gRPC port (after `start`)."""
        if self._port is None:
            raise RuntimeError(f"{self.config.name}: port is known after start()")
        return self._port

    @property
    def metrics_port(self) -> int | None:
        """The bound /metrics port, None when metrics are off or not started."""
        return None if self._metrics is None else self._metrics.port

    @property
    def address(self) -> str:
        """ "host:port" to dial (IPv6 hosts in brackets)."""
        host = self.config.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    @property
    def server(self) -> grpc.aio.Server:
        if self._server is None:
            raise RuntimeError(f"{self.config.name}: server exists after start()")
        return self._server

    @property
    def health(self) -> HealthServicer:
        """The health servicer (status per service name; `set_serving` drives it)."""
        return self._health

    @property
    def stopping(self) -> bool:
        """True once shutdown was requested (by signal or `request_shutdown`)."""
        return self._stop_requested.is_set()

    async def start(
        self, register: Callable[[grpc.aio.Server], None], service_names: Sequence[str]
    ) -> None:
        """Create, register servicers, add health + reflection, bind, start, serve metrics."""
        if self._server is not None:
            raise RuntimeError(f"{self.config.name}: start() called twice")
        cfg = self.config
        server = grpc.aio.server(
            interceptors=self._interceptors,
            options=[
                ("grpc.max_send_message_length", cfg.max_message_bytes),
                ("grpc.max_receive_message_length", cfg.max_message_bytes),
                ("grpc.so_reuseport", 0),  # a taken port fails instead of being shared
            ],
        )
        register(server)
        self._service_names = tuple(service_names)
        for name in ("", *self._service_names):
            self._health.set(name, NOT_SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (*self._service_names, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        target = f"[{cfg.host}]:{cfg.port}" if ":" in cfg.host else f"{cfg.host}:{cfg.port}"
        try:
            port = server.add_insecure_port(target)
        except RuntimeError as exc:
            raise OSError(f"port: {cfg.name} cannot bind {target}: {exc}") from exc
        if port == 0:
            raise OSError(f"port: {cfg.name} cannot bind {target}")
        await server.start()
        self._server, self._port = server, port
        configure_tracing(cfg.name, cfg.otlp_endpoint, cfg.otlp_sample_rate)
        if cfg.metrics_port is not None:
            metrics = MetricsServer(cfg.host, cfg.metrics_port)
            try:
                await metrics.start()
            except OSError:
                await server.stop(None)
                raise
            self._metrics = metrics
        log.info(
            "server_started",
            address=self.address,
            metrics_port=self.metrics_port,
            services=list(self._service_names),
        )

    def set_serving(self, serving: bool = True) -> None:
        """Health for "" and every service: SERVING or NOT_SERVING (call on the loop thread)."""
        status = SERVING if serving else NOT_SERVING
        for name in ("", *self._service_names):
            self._health.set(name, status)
        log.info("health_changed", serving=serving)

    def request_shutdown(self) -> None:
        """Ask `serve_until_signal` to shut down (what SIGTERM does)."""
        self._stop_requested.set()

    async def wait_shutdown_requested(self) -> None:
        """Return once shutdown was requested; servicers use it to wind down streams."""
        await self._stop_requested.wait()

    @property
    def num_active_calls(self) -> int:
        """RPC handlers running now (health checks included)."""
        return self._errors.num_active

    async def wait_calls_done(self) -> None:
        """Return once no RPC handler is running (a drain waits for this)."""
        await self._errors.wait_idle()

    async def serve_until_signal(
        self, on_shutdown: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Serve until SIGTERM/SIGINT or `request_shutdown()`, then shut down gracefully."""
        loop = asyncio.get_running_loop()
        for sig in _SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            await self._stop_requested.wait()
        finally:
            for sig in _SIGNALS:
                loop.remove_signal_handler(sig)
        await self.shutdown(on_shutdown)

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("signal_received", signal=sig.name)
        self.request_shutdown()

    async def shutdown(self, on_shutdown: Callable[[], Awaitable[None]] | None = None) -> None:
        """Health NOT_SERVING, stop with grace, `on_shutdown`, close metrics. Idempotent."""
        self._stop_requested.set()
        if self._shutdown_task is None:
            self._shutdown_task = asyncio.ensure_future(self._shutdown(on_shutdown))
        await asyncio.shield(self._shutdown_task)

    async def _shutdown(self, on_shutdown: Callable[[], Awaitable[None]] | None) -> None:
        grace = self.config.grace_seconds
        log.info("shutdown_started", grace_seconds=grace)
        self._health.enter_graceful_shutdown()
        try:
            if self._server is not None:
                await self._stop_server(self._server, grace)
                await self._wait_handlers_unwound()
            if on_shutdown is not None:
                await on_shutdown()
        finally:
            if self._metrics is not None:
                await self._metrics.stop()
            await asyncio.to_thread(shutdown_tracing)
            log.info("shutdown_finished")

    async def _stop_server(self, server: grpc.aio.Server, grace: float) -> None:
        """Refuse new calls now, in the loop step that turned health NOT_SERVING; give
        in-flight calls `grace` seconds, then cancel what still runs, but only once every
        open Watch stream has sent its NOT_SERVING (even with a grace of 0)."""
        cancel = asyncio.ensure_future(self._cancel_calls_after(server, grace))
        try:
            # Its first step, before any await, shuts the grpc core's door on new calls.
            await server.stop(_STOP_WITHOUT_DEADLINE_S)
        finally:
            cancel.cancel()

    async def _cancel_calls_after(self, server: grpc.aio.Server, grace: float) -> None:
        await asyncio.sleep(grace)
        try:
            await asyncio.wait_for(self._health.wait_watchers_ended(), timeout=_UNWIND_SECONDS)
        except TimeoutError:
            log.warning("health_watchers_still_open")
        log.info("grace_ended", num_active=self._errors.num_active)
        await server.stop(None)  # a later stop with less grace wins: cancels every call

    async def _wait_handlers_unwound(self) -> None:
        """Calls cancelled at the end of grace unwind before `on_shutdown` closes the core."""
        try:
            await asyncio.wait_for(self._errors.wait_idle(), timeout=_UNWIND_SECONDS)
        except TimeoutError:
            log.warning("handlers_still_running", num_active=self._errors.num_active)


def run_service(
    main: Coroutine[Any, Any, int | None], exit_seconds: float = EXIT_SECONDS
) -> NoReturn:
    """Run a service's async main to completion (uvloop when installed), then end the
    process with its exit code.

    For a process's entry point only. The graceful stop has closed everything by the time
    `main` returns, so the interpreter's own teardown is skipped: it joins every non-daemon
    thread without a bound and, with torch imported, took 2 to 7 s of an idle CPU
    executor's stop. The runner's close (it joins the default executor's threads) gets
    `exit_seconds` (see `services.common.process_exit`)."""
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    runner = asyncio.Runner(loop_factory=loop_factory)
    try:
        result = runner.run(main)
        code = 0 if result is None else int(result)
    except KeyboardInterrupt:
        code = 130
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except Exception:
        traceback.print_exc()
        code = 1
    exit_after(code, exit_seconds)
    runner.close()
    end_process(code)
