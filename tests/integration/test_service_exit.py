"""Every service's process exits within its grace of a SIGTERM, and nothing forces it out.

A small real mesh (cache, executor on the tiny Llama, scheduler, gateway) is started,
then stopped in reverse order; each stop is timed from the signal to the process's exit.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from fixtures.gateway_fakes import make_model_folder
from fixtures.tiny_llama import write_tiny_llama

from services.common.config import free_port
from services.common.health import wait_for_serving

REPO = Path(__file__).resolve().parents[2]
GRACE_SECONDS = 3.0


async def spawn(module: str, *args: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, "--grace-seconds", str(GRACE_SECONDS), *args,
        cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def stop(proc: asyncio.subprocess.Process) -> tuple[float, list[str]]:
    """SIGTERM, then (seconds until it exited, its log's events)."""
    loop = asyncio.get_running_loop()
    signalled_at = loop.time()
    proc.send_signal(signal.SIGTERM)
    # A bound only, far past the grace: the test asserts on the time taken.
    _, stderr = await asyncio.wait_for(proc.communicate(), timeout=GRACE_SECONDS + 60)
    lines = stderr.decode().splitlines()
    return loop.time() - signalled_at, [json.loads(s)["event"] for s in lines if s.startswith("{")]


async def test_each_service_exits_within_its_grace_of_a_sigterm(tmp_path):
    model = tmp_path / "tiny"
    write_tiny_llama(model)
    tokenizer = make_model_folder(tmp_path / "gateway-model")
    ports = {name: free_port() for name in ("cache", "executor", "scheduler", "gateway", "http")}
    addr = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    started: list[tuple[str, asyncio.subprocess.Process]] = []
    try:
        for name, module, args, health in [
            ("cache", "services.cache.main", ["--port", str(ports["cache"])], ""),
            ("executor", "services.executor.main", [
                "--port", str(ports["executor"]), "--model", str(model), "--device", "cpu",
                "--cache-address", addr["cache"], "--page-size", "4", "--num-pages", "64",
                "--max-num-seqs", "4"], "radixmesh.v1.Executor"),
            ("scheduler", "services.scheduler.main", [
                "--port", str(ports["scheduler"]), "--cache-address", addr["cache"],
                "--executor", addr["executor"]], ""),
            ("gateway", "gateway.main", [
                "--port", str(ports["gateway"]), "--http-port", str(ports["http"]),
                "--model", str(tokenizer), "--model-name", model.name,
                "--scheduler-address", addr["scheduler"]], ""),
        ]:  # fmt: skip
            started.append((name, await spawn(module, *args)))
            await wait_for_serving(addr[name], health, timeout=120)
        stops = {}
        for name, proc in reversed(started):
            stopped_after, events = await stop(proc)
            stops[name] = (proc.returncode, events[-1] if events else None, "exit_forced" in events)
            assert stopped_after < GRACE_SECONDS, (name, stopped_after, events[-5:])
        assert stops == {name: (0, "shutdown_finished", False) for name, _ in started}
    finally:
        for _, proc in started:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
