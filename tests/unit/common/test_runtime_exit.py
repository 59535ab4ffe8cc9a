"""A stopped service's process exits within its grace, whatever it left blocked."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from services.common.config import free_port
from services.common.health import wait_for_serving
from services.common.process_exit import EXIT_SECONDS

SCRIPT = Path(__file__).with_name("stuck_service.py")
REPO = Path(__file__).resolve().parents[3]
GRACE_SECONDS = 5.0


async def stop_and_time(left: str) -> tuple[float, int, list[dict]]:
    """Start a service leaving `left` blocked, SIGTERM it once SERVING: (seconds to its
    exit, exit code, log lines)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), str(port), str(GRACE_SECONDS), left,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    try:
        await wait_for_serving(f"127.0.0.1:{port}", timeout=60)
        signalled_at = loop.time()
        proc.send_signal(signal.SIGTERM)
        # A bound only, well past the grace: the assertion below is on the time taken.
        _, stderr = await asyncio.wait_for(proc.communicate(), timeout=GRACE_SECONDS + 30)
        stopped_after = loop.time() - signalled_at
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    lines = [json.loads(line) for line in stderr.decode().splitlines() if line.startswith("{")]
    assert proc.returncode is not None
    return stopped_after, proc.returncode, lines


async def test_a_blocked_to_thread_call_holds_the_runner_only_until_the_exit_deadline():
    stopped_after, code, lines = await stop_and_time("to_thread")
    assert stopped_after < GRACE_SECONDS
    assert code == 0
    assert [line["event"] for line in lines][-2:] == ["shutdown_finished", "exit_forced"]
    forced = lines[-1]
    assert forced["after_seconds"] == EXIT_SECONDS
    assert any(frame.startswith("runners.py") and frame.endswith(" in close")
               for frame in forced["main_thread"]), forced  # fmt: skip
    assert any(thread.startswith("asyncio_0 (") and " in wait" in thread
               for thread in forced["threads"]), forced  # fmt: skip


@pytest.mark.parametrize(("left", "holder"), [("pool", "stuck-pool_0"), ("thread", "stuck-thread")])
async def test_threads_left_running_are_named_and_not_waited_for(left, holder):
    stopped_after, code, lines = await stop_and_time(left)
    assert stopped_after < EXIT_SECONDS  # no join, no deadline needed
    assert code == 0
    assert [line["event"] for line in lines][-2:] == ["shutdown_finished", "threads_left"]
    assert any(thread.startswith(f"{holder} (") for thread in lines[-1]["threads"]), lines[-1]


async def test_a_process_with_nothing_left_exits_at_once():
    stopped_after, code, lines = await stop_and_time("nothing")
    assert code == 0
    assert stopped_after < EXIT_SECONDS
    assert [line["event"] for line in lines][-1] == "shutdown_finished"
