"""The schema corpus (tests/data/schema_corpus.jsonl) through the tiny model at temperature 1.

Every schema is either refused before any token, the refusal naming a keyword and
its path, or compiled and sampled with several seeds in one engine run: every
output that ends with "stop" validates against the caller's schema. The model
is random, so this explores what the grammar admits rather than what a model
would like to write.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from mesh.engine import Engine, EngineConfig
from mesh.tiny_model import write_tiny_model
from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from radixmesh.schema import SchemaCheck, check_enforceable, check_output, plan_json_schema
from services.executor.core.grammar import GrammarConfig, GrammarService

CORPUS = Path(__file__).resolve().parents[2] / "data" / "schema_corpus.jsonl"
SEEDS = (1, 2)
MAX_TOKENS = 40
REFUSAL = re.compile(r'^constraint\.json_schema(\.[^:]+)?: keyword "([^"]+)" cannot be enforced')


def corpus() -> list[dict]:
    return [json.loads(line) for line in CORPUS.read_text().splitlines()]


def test_the_corpus_holds_200_schemas_of_every_kind():
    entries = corpus()
    assert len(entries) >= 200
    assert {e["kind"] for e in entries} == {"tool", "payload", "config", "kubernetes", "adversarial"}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny-corpus"), arch="llama", seed=0)


@pytest.fixture
async def engine(tiny_model_dir):
    grammar = GrammarService.from_model_dir(
        tiny_model_dir, config=GrammarConfig(compile_timeout_s=120, max_pending=1024)
    )
    config = EngineConfig.for_model(
        str(tiny_model_dir), device="cpu", page_size=4, num_pages=2048, max_num_seqs=64
    )
    engine = Engine(config, grammar=grammar)
    await engine.start()
    yield engine
    await engine.stop()
    grammar.close(wait=True)


async def test_every_stop_output_validates_and_every_refusal_names_a_keyword(
    engine, tiny_model_dir
):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    accepted, refused = [], []
    for entry in corpus():
        try:
            check_enforceable(plan_json_schema(entry["schema"]), "constraint.json_schema")
        except InvalidArgument as exc:
            assert REFUSAL.match(str(exc)), (entry["name"], str(exc))
            refused.append(entry["name"])
            continue
        accepted.append(entry)
    assert len(accepted) >= 150 and refused  # the adversarial ones include refusals

    async def one(entry: dict, seed: int) -> tuple[str, str, str]:
        constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(entry["schema"]))
        sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=seed)
        result = await engine.complete([1, 6 + seed], sampling, constraint=constraint)
        text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
        return entry["name"], text, result.finish_reason

    outputs = await asyncio.gather(*(one(e, s) for e in accepted for s in SEEDS))
    schemas = {e["name"]: e["schema"] for e in accepted}
    invalid = []
    for name, text, finish in outputs:
        result = check_output(schemas[name], text, finish)
        if result.check is SchemaCheck.INVALID:
            invalid.append((name, text, result.error))
    assert invalid == []
    # short outputs end by length often; enough finish to make the check mean something
    assert sum(finish == "stop" for _, _, finish in outputs) >= 60


DEFECTS = {
    "escaped backslash pattern": {"type": "string", "pattern": r"^\\d+/\\d+$"},
    "quote pattern": {"type": "string", "pattern": r'^a"[0-9]{1,3}$'},
    "unbounded number": {"type": "number"},
    "number array": {"type": "array", "items": {"type": "number"}, "maxItems": 2},
    "exclusive integer bounds": {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 4},
    "date": {"type": "string", "format": "date"},
    "date-time": {"type": "string", "format": "date-time"},
    "uuid": {"type": "string", "format": "uuid"},
    "ipv4": {"type": "string", "format": "ipv4"},
}


async def test_the_escape_number_bound_and_format_defects_hold_over_many_seeds(
    engine, tiny_model_dir
):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    async def one(name: str, seed: int) -> tuple[str, str, str]:
        constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(DEFECTS[name]))
        sampling = SamplingParams(max_tokens=48, temperature=1.0, seed=seed)
        result = await engine.complete([1, 7 + seed % 50], sampling, constraint=constraint)
        return name, tokenizer.decode(result.token_ids, skip_special_tokens=True), result.finish_reason

    outputs = await asyncio.gather(*(one(name, seed) for name in DEFECTS for seed in range(16)))
    results = [(n, t, check_output(DEFECTS[n], t, f)) for n, t, f in outputs]
    assert [(n, t, r.error) for n, t, r in results if r.check is SchemaCheck.INVALID] == []
    finished = {n for n, _, r in results if r.check is SchemaCheck.VALID}
    assert finished == set(DEFECTS)  # each defect's schema produced finished, valid outputs
    backslash = [t for n, t, r in results if n == "escaped backslash pattern" and r.error == ""]
    assert all(t.startswith('"\\\\d') for t in backslash)  # the JSON escape of a backslash
