"""Constrained requests in the engine, with a real GrammarService on the tiny model's tokenizer.

The scheduler compiles a constraint on its executor before queueing the
request; a slow compile (a compile function that waits on an event the test
sets) must not hold up the unconstrained requests beside it, and the step
that first carries the constraint must find it cached.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading

import pytest
from transformers import AutoTokenizer

from mesh.engine import Engine, EngineConfig
from mesh.tiny_model import write_tiny_model
from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from services.executor.core.grammar import GrammarConfig, GrammarService
from services.executor.core.grammar import service as grammar_service

COLORS = ("red", "green", "blue")
COLOR_SCHEMA = Constraint(
    ConstraintKind.JSON_SCHEMA,
    json.dumps(
        {
            "type": "object",
            "properties": {"color": {"enum": list(COLORS)}},
            "required": ["color"],
        }
    ),
)
FIRST_PLAIN_TOKEN = 6  # the tiny tokenizer's special tokens come first


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny-tok"), arch="llama", seed=0)


@pytest.fixture
async def engine_with_grammar(tiny_model_dir):
    grammar = GrammarService.from_model_dir(
        tiny_model_dir, config=GrammarConfig(compile_timeout_s=60)
    )
    config = EngineConfig.for_model(
        str(tiny_model_dir), device="cpu", page_size=4, num_pages=128, max_num_seqs=16
    )
    engine = Engine(config, grammar=grammar)
    await engine.start()
    yield engine
    await engine.stop()
    grammar.close(wait=True)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


def prompt(n: int, offset: int = 0) -> list[int]:
    return [FIRST_PLAIN_TOKEN + (7 * i + offset) % 200 for i in range(n)]


async def test_an_invalid_schema_ends_the_request_with_the_compilers_reason(engine_with_grammar):
    bad = Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "foo"}')
    stream = await engine_with_grammar.generate(prompt(5), greedy(8), constraint=bad)
    with pytest.raises(
        InvalidArgument, match=re.escape('constraint.json_schema: Unsupported type "foo"')
    ):
        await stream.collect()
    assert engine_with_grammar.scheduler.stats.num_finished == {("error", "INVALID_ARGUMENT"): 1}


async def test_constrained_greedy_output_follows_its_schema_and_compiles_before_the_step(
    engine_with_grammar, tiny_model_dir
):
    result = await engine_with_grammar.complete(prompt(6), greedy(40), constraint=COLOR_SCHEMA)
    text = AutoTokenizer.from_pretrained(tiny_model_dir).decode(
        result.token_ids, skip_special_tokens=True
    )
    assert result.finish_reason == "stop"
    assert json.loads(text)["color"] in COLORS
    metrics = engine_with_grammar.grammar.metrics
    # one compile, run by the preparation; the executor's matcher found it in the cache
    assert (metrics.num_compiles, metrics.num_cache_misses, metrics.num_shared_compiles) == (
        1,
        1,
        0,
    )
    assert metrics.num_cache_hits >= 1 and metrics.num_constrained_requests == 1


async def test_a_slow_compile_does_not_delay_unconstrained_requests(
    engine_with_grammar, monkeypatch
):
    release = threading.Event()
    real_compile = grammar_service.compile_constraint

    def slow_compile(compiler, constraint, **kwargs):
        if constraint == COLOR_SCHEMA:
            assert release.wait(timeout=30), "the test never released the compile"
        return real_compile(compiler, constraint, **kwargs)

    monkeypatch.setattr(grammar_service, "compile_constraint", slow_compile)
    engine = engine_with_grammar
    constrained = await engine.generate(prompt(6), greedy(40), constraint=COLOR_SCHEMA)
    others = [await engine.generate(prompt(5 + i, i), greedy(4)) for i in range(3)]
    try:
        async with asyncio.timeout(20):  # a loop waiting on the compile would stall here
            results = [await s.collect() for s in others]
        assert [len(r.token_ids) for r in results] == [4, 4, 4]
        assert engine.scheduler.executor_loads()[0].num_preparing == 1  # still compiling
        assert engine.executors[0].num_seqs == 0  # nothing of it reached the executor
    finally:
        release.set()
    result = await constrained.collect()
    assert result.finish_reason == "stop" and result.token_ids
    metrics = engine.grammar.metrics
    assert (metrics.num_cache_misses, metrics.num_shared_compiles) == (1, 0)
