"""Running `radixmesh serve` as a subprocess for the e2e tests: start, wait ready, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from mesh.commands.serve import READY_LINE
from radixmesh.v1 import inference_pb2 as pb
from services.common.config import free_port

REPO = Path(__file__).resolve().parents[2]
API_KEY = "sk-e2e"
START_TIMEOUT_S = 240


@dataclass
class Serve:
    process: subprocess.Popen
    port: int
    endpoints: dict
    output: list[str]

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def child_pids(self) -> dict[str, int]:
        return {s["name"]: s["pid"] for s in self.endpoints["services"]}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "X"


BIND_RETRIES = 3
"""Starts tried when a port picked free was taken before the mesh bound it (another
process of the suite can be handed the same port between the pick and the bind)."""


def start_serve(tmp: Path, *extra: str, timeout_s: float = START_TIMEOUT_S) -> Serve:
    """`radixmesh serve` as a subprocess; returns once it is ready (fails with its output).
    A start that failed only because a port was taken is tried again on new ports."""
    for attempt in range(BIND_RETRIES):
        where = tmp / f"retry{attempt}" if attempt else tmp
        serve, output = _start_serve(where, extra, timeout_s)
        if serve is not None:
            return serve
        if "Address already in use" not in output:
            break
    pytest.fail(f"radixmesh serve did not become ready:\n{output[-6000:]}")


def _start_serve(tmp: Path, extra: tuple[str, ...], timeout_s: float) -> tuple[Serve | None, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    endpoints_path = tmp / "endpoints.json"
    argv = [
        *(sys.executable, "-m", "mesh.cli", "serve", "--port", str(port)),
        *("--device", "cpu", "--num-pages", "256", "--log-dir", str(tmp / "logs")),
        *("--endpoints-json", str(endpoints_path), *extra),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    output: list[str] = []
    if not wait_ready(process, output, timeout_s):
        process.send_signal(signal.SIGINT)
        process.wait(60)
        return None, "".join(output)
    return Serve(process, port, json.loads(endpoints_path.read_text()), output), ""


def wait_ready(process: subprocess.Popen, output: list[str], timeout_s: float) -> bool:
    """Whether `process` printed the ready line within `timeout_s` and still runs; its
    output lines are appended to `output` as they come. Ready means the ready line was
    read, never that the output ended: a process that exits closes its output before its
    exit status can be read."""
    ready, settled = threading.Event(), threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            if line.startswith(READY_LINE):
                ready.set()
                settled.set()
        settled.set()  # the output ended: it exited, ready or not

    threading.Thread(target=read, daemon=True).start()
    return settled.wait(timeout_s) and ready.is_set() and process.poll() is None


def stop_serve(serve: Serve) -> None:
    """Ctrl-C: serve exits 0 and leaves none of its children running."""
    serve.process.send_signal(signal.SIGINT)
    code = serve.process.wait(60)
    left = {name: pid for name, pid in serve.child_pids.items() if alive(pid)}
    assert code == 0, "".join(serve.output)[-4000:]
    assert not left, f"children still running after Ctrl-C: {left}"


AUTH = (("authorization", f"Bearer {API_KEY}"),)
"""gRPC metadata of the main key."""


@dataclass
class Generated:
    """One Generate stream read to its end: the chunks joined, and the closing Complete."""

    text: str
    token_ids: list[int]
    complete: pb.Complete


async def generate(stub, request: pb.GenerateRequest) -> Generated:
    """Reads a Generate stream with the main key; a stream without a Complete fails the test."""
    text, token_ids, complete = "", [], None
    async for response in stub.Generate(request, metadata=AUTH):
        if response.HasField("chunk"):
            text += response.chunk.text
            token_ids += response.chunk.token_ids
        else:
            complete = response.complete
    assert complete is not None, "the stream ended without a Complete"
    return Generated(text, token_ids, complete)
