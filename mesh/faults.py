"""Fault injection against a running `radixmesh serve`: streams under load, and what became of them.

    mesh = ServeProcess.start(tmp, "--executors", "2")
    load = asyncio.create_task(stream_load(mesh.http, num_streams=20))
    await mesh.wait_output("started executor-0")      # or: mesh.kill("executor-0")
    outcomes = await load
    print(Tally.of(outcomes))

A stream ends in exactly one way (`Outcome.kind`):

- completed: `data: [DONE]` after text, no error event;
- errored: an error event (`data: {"error": ...}`) then `[DONE]`, or an error status
  with the JSON error body, before any output (status and error code kept);
- cut: the body ended cleanly but without `[DONE]` (what the mesh must never do);
- reset: the connection broke mid-body (an incomplete chunked body or a reset stream,
  which every HTTP client reports as an error): only when the process serving the
  connection itself dies (the gateway or Envoy);
- hung: no end within the client's deadline.

Used by tests/chaos (bounded, in CI) and bench/chaos.py (the figures in RESULTS.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from mesh.commands.serve import READY_LINE
from mesh.launcher import child_env
from services.common.config import free_port

REPO = Path(__file__).resolve().parents[1]
KINDS = ("completed", "errored", "cut", "reset", "hung")


@dataclass(slots=True)
class Outcome:
    kind: str
    """completed, errored, cut, reset or hung."""
    status: int = 0
    """HTTP status of the response."""
    error_code: str = ""
    """The error body's `code` (e.g. unavailable, resource_exhausted)."""
    num_chunks: int = 0
    """Data events with output before the end."""
    seconds: float = 0.0
    """From sending to the end."""
    retry_after: str = ""
    """The Retry-After header of a refusal."""


@dataclass(frozen=True, slots=True)
class Tally:
    counts: dict[str, int]
    codes: dict[str, int]
    """Error codes of the errored streams."""
    max_seconds: float

    @classmethod
    def of(cls, outcomes: list[Outcome]) -> Tally:
        counts = {kind: sum(o.kind == kind for o in outcomes) for kind in KINDS}
        codes = dict(Counter(o.error_code or str(o.status) for o in outcomes if o.kind == "errored"))
        return cls(counts, codes, max((o.seconds for o in outcomes), default=0.0))

    def __str__(self) -> str:
        parts = [f"{k} {v}" for k, v in self.counts.items()]
        return ", ".join(parts) + f" (error codes {self.codes}, slowest {self.max_seconds:.1f}s)"


async def one_stream(
    session: aiohttp.ClientSession,
    base_url: str,
    max_tokens: int = 48,
    deadline_s: float = 60.0,
    prompt: str = "the mesh survives its parts",
    priority: str | None = None,
) -> Outcome:
    """One streamed completion, classified (see the module docstring)."""
    body: dict = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0,
    }
    if priority is not None:
        body["priority"] = priority
    start = time.monotonic()
    try:
        async with asyncio.timeout(deadline_s):
            return await _read_stream(session, base_url, body, start)
    except TimeoutError:
        return Outcome("hung", seconds=time.monotonic() - start)


async def _read_stream(
    session: aiohttp.ClientSession, base_url: str, body: dict, start: float
) -> Outcome:
    try:
        async with session.post(f"{base_url}/v1/completions", json=body) as response:
            if response.status != 200:
                code = _error_code(await response.read())
                return Outcome("errored", response.status, code, 0, time.monotonic() - start,
                               response.headers.get("Retry-After", ""))  # fmt: skip
            num_chunks, error_code, done = 0, "", False
            async for raw in response.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    error_code = str(event["error"].get("code") or "error")
                else:
                    num_chunks += 1
            seconds = time.monotonic() - start
            if not done:
                return Outcome("cut", 200, error_code, num_chunks, seconds)
            kind = "errored" if error_code else "completed"
            return Outcome(kind, 200, error_code, num_chunks, seconds)
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
        return Outcome("reset", 200, "", 0, time.monotonic() - start)
    except aiohttp.ClientConnectionError:
        return Outcome("errored", 0, "connection_refused", 0, time.monotonic() - start)


def _error_code(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return "not_json"


async def stream_load(
    base_url: str,
    num_streams: int,
    max_tokens: int = 48,
    deadline_s: float = 60.0,
    started: asyncio.Event | None = None,
    priority: str | None = None,
) -> list[Outcome]:
    """`num_streams` concurrent streams; `started` is set once every one has sent."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [
            asyncio.create_task(
                one_stream(session, base_url, max_tokens, deadline_s, priority=priority)
            )
            for _ in range(num_streams)
        ]
        if started is not None:
            await asyncio.sleep(0)
            started.set()
        return list(await asyncio.gather(*tasks))


@dataclass
class ServeProcess:
    """`radixmesh serve` as a subprocess, its output followed line by line."""

    process: subprocess.Popen
    port: int
    log_dir: Path
    output: list[str] = field(default_factory=list)
    endpoints: dict = field(default_factory=dict)
    """What serve wrote to --endpoints-json (addresses of every service)."""
    pids: dict[str, int] = field(default_factory=dict)
    """Service name -> pid of its newest process (from the `started` lines)."""
    _changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, tmp: Path, *extra: str, timeout_s: float = 240.0) -> ServeProcess:
        port = free_port()
        argv = [
            *(sys.executable, "-m", "mesh.cli", "serve", "--port", str(port)),
            *("--device", "cpu", "--log-dir", str(tmp / "logs")),
            *("--endpoints-json", str(tmp / "endpoints.json"), *extra),
        ]
        env = child_env()
        process = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        serve = cls(process, port, tmp / "logs")
        threading.Thread(target=serve._read, daemon=True).start()
        if not serve.wait_output_sync(READY_LINE, timeout_s):
            serve.process.kill()
            raise RuntimeError(f"serve did not become ready:\n{serve.text[-6000:]}")
        serve.endpoints = json.loads((tmp / "endpoints.json").read_text())
        return serve

    def address(self, name: str) -> str:
        """The gRPC address of service `name`."""
        return next(s["address"] for s in self.endpoints["services"] if s["name"] == name)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.output.append(line)
                if line.startswith("radixmesh: started "):
                    name, pid = line.split()[2], line.rsplit("pid ", 1)[1].rstrip(")\n")
                    self.pids[name] = int(pid)
                self._changed.notify_all()
        with self._changed:
            self.output.append("")  # the end
            self._changed.notify_all()

    @property
    def text(self) -> str:
        return "".join(self.output)

    def wait_output_sync(self, needle: str, timeout_s: float, after: int = 0) -> bool:
        """Block until a line (from line number `after` on) contains needle, or serve ended."""
        with self._changed:
            return self._changed.wait_for(
                lambda: any(needle in line for line in self.output[after:])
                or self.process.poll() is not None,
                timeout_s,
            ) and any(needle in line for line in self.output[after:])

    async def wait_output(self, needle: str, timeout_s: float, after: int = 0) -> bool:
        return await asyncio.to_thread(self.wait_output_sync, needle, timeout_s, after)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> int:
        """Send `sig` to service `name`'s newest process; the output line count before it."""
        mark = len(self.output)
        os.kill(self.pids[name], sig)
        return mark

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 90.0) -> int:
        """Signal serve itself and wait for it; its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
