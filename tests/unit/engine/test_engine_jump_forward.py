"""Jump-forward through the in-process engine (scheduler, cache and executor cores, a real
GrammarService on the tiny model's tokenizer): on by default with speculation off, the
outputs equal jump-forward off, each request's usage counts its forced tokens, the
scheduler's positions follow the verified runs and every page comes back."""

from __future__ import annotations

import asyncio
import json

import pytest

from mesh.engine import Engine, EngineConfig
from mesh.tiny_model import write_tiny_model
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from services.executor.core.grammar import GrammarConfig, GrammarService
from services.executor.core.spec import SpeculativeConfig

SCHEMA = Constraint(
    ConstraintKind.JSON_SCHEMA,
    json.dumps(
        {
            "type": "object",
            "properties": {
                "label": {"enum": ["important", "ignored", "unknown"]},
                "count": {"type": "integer", "minimum": 0, "maximum": 99},
                "note": {"type": "string", "maxLength": 6},
            },
            "required": ["label", "count", "note"],
        }
    ),
)
REGEX = Constraint(ConstraintKind.REGEX, r"(north|south)western-[0-9]{3}")


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny-jump-engine"), arch="llama", seed=0)


@pytest.fixture
async def make_engine(tiny_model_dir):
    grammar = GrammarService.from_model_dir(
        tiny_model_dir, config=GrammarConfig(compile_timeout_s=60)
    )
    engines: list[Engine] = []

    async def make(overlap_prepare: bool | None = None, **executor_fields) -> Engine:
        fields = {"device": "cpu", "page_size": 4, "num_pages": 256, "max_num_seqs": 16}
        fields.update(executor_fields)
        config = EngineConfig.for_model(
            str(tiny_model_dir), overlap_prepare=overlap_prepare, **fields
        )
        engine = Engine(config, grammar=grammar)
        await engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.stop()
    grammar.close(wait=True)


def work() -> list[tuple[list[int], SamplingParams, Constraint | None]]:
    out: list[tuple[list[int], SamplingParams, Constraint | None]] = []
    for i in range(9):
        prompt = [6 + (11 * j + 5 * i) % 300 for j in range(5 + i)]
        sampling = (
            SamplingParams(temperature=0.0, max_tokens=48)
            if i % 2
            else SamplingParams(temperature=0.9, seed=i, max_tokens=48)
        )
        constraint = (SCHEMA, REGEX, None)[i % 3]
        out.append((prompt, sampling, constraint))
    return out


async def run_all(engine: Engine, requests):
    streams = [await engine.generate(p, s, constraint=c) for p, s, c in requests]
    return await asyncio.gather(*(s.collect() for s in streams))


@pytest.mark.parametrize("overlap_prepare", [False, True], ids=["between-steps", "overlapped"])
async def test_outputs_equal_jump_forward_off_and_every_page_comes_back(
    make_engine, overlap_prepare
):
    requests = work()
    off = await make_engine(overlap_prepare, speculative=SpeculativeConfig(jump_forward=False))
    assert off.executors[0].info.max_forced_tokens == 0
    expected = await run_all(off, requests)
    await off.stop()
    engine = await make_engine(overlap_prepare, speculative=SpeculativeConfig(jump_forward=True))
    assert engine.executors[0].info.max_forced_tokens > 0
    (start,) = engine.cache_stats()
    results = await run_all(engine, requests)
    assert [r.token_ids for r in results] == [r.token_ids for r in expected]
    assert [r.finish_reason for r in results] == [r.finish_reason for r in expected]
    forced = [r.speculation.num_forced_tokens if r.speculation else 0 for r in results]
    for (_, _, constraint), count in zip(requests, forced, strict=True):
        assert (count > 0) == (constraint is not None)  # only constrained requests jump
    total = engine.executors[0].spec_stats.snapshot()
    assert total.num_forced_tokens == sum(forced)
    (end,) = engine.cache_stats()
    assert end.num_leases == 0
    assert end.num_free_pages + end.num_cached_pages == start.num_free_pages
