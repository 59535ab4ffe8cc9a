"""Fixtures for the gateway's unit tests (factories live in tests/fixtures/gateway_fakes.py)."""

from __future__ import annotations

import pytest

from gateway.core.tokenizer import Tokenizer
from radixmesh.v1 import scheduler_pb2_grpc
from services.common.config import free_port
from tests.fixtures.gateway_fakes import FakeScheduler, make_model_folder
from tests.fixtures.runtime import running_runtime


@pytest.fixture(scope="session")
def make_model():
    """The model-folder factory, for tests that need a variant."""
    return make_model_folder


@pytest.fixture(scope="session")
def model_folder(tmp_path_factory):
    return make_model_folder(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tokenizer(model_folder) -> Tokenizer:
    return Tokenizer.from_folder(model_folder)


@pytest.fixture(scope="session")
def redis_url():
    """A real redis-server on a free port, for the session; ready when it says so."""
    import shutil
    import subprocess

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (apt-get install -y redis-server)")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for line in proc.stdout:  # blocks on the server's own log, no polling
            if "Ready to accept connections" in line:
                break
        else:
            pytest.fail(f"redis-server exited with {proc.wait()}")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


@pytest.fixture
async def fake_scheduler(tokenizer):
    """(FakeScheduler, address): a fake radixmesh.v1.Scheduler on a loopback port, SERVING."""
    scheduler = FakeScheduler(tokenizer)

    def register(server):
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler, server)

    async with running_runtime(register, ["radixmesh.v1.Scheduler"]) as runtime:
        yield scheduler, runtime.address
