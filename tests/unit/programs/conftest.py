"""The tiny model (with its tokenizer) and an in-process engine with grammars, once per module."""

from __future__ import annotations

import pytest

from gateway.core.tokenizer import Tokenizer
from mesh.engine import Engine, EngineConfig
from mesh.tiny_model import write_tiny_model
from services.executor.core.grammar import GrammarConfig, GrammarService
from tests.fixtures.programs import EngineBackend, runtime_deps


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny-programs"), arch="llama", seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir) -> Tokenizer:
    return Tokenizer.from_folder(tiny_model_dir)


@pytest.fixture
async def engine(tiny_model_dir):
    grammar = GrammarService.from_model_dir(tiny_model_dir, config=GrammarConfig(compile_timeout_s=60))
    config = EngineConfig.for_model(
        str(tiny_model_dir), device="cpu", page_size=4, num_pages=256, max_num_seqs=32
    )
    engine = Engine(config, grammar=grammar)
    await engine.start()
    yield engine
    await engine.stop()
    grammar.close(wait=True)


@pytest.fixture
def backend(engine) -> EngineBackend:
    return EngineBackend(engine)


@pytest.fixture
def deps(backend, tiny_model_dir):
    return runtime_deps(backend, tiny_model_dir)
