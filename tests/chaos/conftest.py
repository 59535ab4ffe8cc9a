"""One `radixmesh serve` (tiny model, CPU, two executors, Redis) for the whole chaos suite.

The suite kills its parts one after the other under load; each test leaves the mesh
whole again (every service serving, no lease held) for the next. Redis is a real
redis-server (tests/fixtures/redis.py finds the binary) on a port of its own, so a test
can kill it and start it again on the same port.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from mesh.faults import ServeProcess
from services.common.config import free_port
from tests.fixtures.redis import redis_binary


class Redis:
    """A redis-server that can be killed and started again on its port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1"]
        self.process = subprocess.Popen(
            [*args, "--save", "", "--appendonly", "no"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.process.stdout is not None
        deadline = time.monotonic() + 10
        for line in self.process.stdout:
            if "Ready to accept connections" in line or time.monotonic() > deadline:
                break
        self.process.stdout.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture(scope="session")
def redis():
    server = Redis()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def mesh(tmp_path_factory, redis):
    serve = ServeProcess.start(
        tmp_path_factory.mktemp("chaos"),
        *("--executors", "2", "--num-pages", "256", "--grace", "20"),
        *("--max-restarts", "3", "--restart-window-s", "600", "--max-queue-wait-s", "3"),
        *("--redis-url", redis.url),
    )
    yield serve
    serve.stop()
