"""A tiny random-weight Llama saved once per session, and engines over it."""

from __future__ import annotations

from pathlib import Path

import pytest

from mesh.engine import Engine, EngineConfig
from services.scheduler.core import SchedulerConfig
from tests.fixtures.tiny_llama import write_tiny_llama


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    write_tiny_llama(path)
    return path


@pytest.fixture
async def make_engine(tiny_llama):
    """make_engine(scheduler=..., overlap_prepare=..., **executor fields) -> a started Engine, stopped after the test."""
    engines: list[Engine] = []

    async def make(
        scheduler: SchedulerConfig | None = None,
        overlap_prepare: bool | None = None,
        **executor_fields,
    ) -> Engine:
        fields = {"device": "cpu", "page_size": 4, "num_pages": 256, "max_num_seqs": 64}
        fields.update(executor_fields)
        config = EngineConfig.for_model(
            str(tiny_llama), scheduler=scheduler, overlap_prepare=overlap_prepare, **fields
        )
        engine = Engine(config)
        await engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.stop()
