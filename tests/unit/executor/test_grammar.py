"""GrammarService: compiling constraints, the cache, the worker pool, time limits, errors."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import xgrammar as xgr
from transformers import AutoTokenizer

from mesh.tiny_model import write_tiny_model
from radixmesh.errors import InvalidArgument, ResourceExhausted, Unavailable
from radixmesh.sampling import Constraint, ConstraintKind
from radixmesh.schema import plan_json_schema
from services.executor.core.grammar import GrammarConfig, GrammarService
from services.executor.core.grammar.compiler import choices_ebnf, compiler_reason

QUICK = Constraint(ConstraintKind.REGEX, r"[0-9]{3}")
WAIT_S = 30.0
"""Longest a test waits for a worker thread; only reached when something is broken."""


def object_schema(num_props: int, tag: str) -> Constraint:
    names = [f"{tag}_{i}" for i in range(num_props)]
    schema = {
        "type": "object",
        "properties": {name: {"type": "string", "pattern": "[a-z]{2,9}"} for name in names},
        "required": names,
    }
    return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema))


HELD = object_schema(3, "held")
"""The slow grammar of these tests: its compile waits in its worker thread for `held.release()`."""
HELD_GRAMMAR_SCHEMA = plan_json_schema(json.loads(HELD.value)).grammar_text
"""What the compiler is given for HELD (the schema as the grammar enforces it)."""


class HeldCompile:
    """Holds every compile of HELD inside xgrammar's compile call until released, so "still
    compiling" is a fact the test controls rather than a guess about the machine's speed."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.released = threading.Event()

    def release(self) -> None:
        self.released.set()

    def wait_started(self) -> None:
        assert self.started.wait(WAIT_S), "the held compile never started"

    async def started_in_worker(self) -> None:
        assert await asyncio.to_thread(self.started.wait, WAIT_S), "the held compile never started"


@pytest.fixture
def held(make_service, monkeypatch):
    """Set up after make_service, so it releases the compile before the services close."""
    hold = HeldCompile()
    compile_json_schema = xgr.GrammarCompiler.compile_json_schema

    def holding(compiler, schema, *args, **kwargs):
        if schema == HELD_GRAMMAR_SCHEMA:
            hold.started.set()
            assert hold.released.wait(WAIT_S), "the held compile was never released"
        return compile_json_schema(compiler, schema, *args, **kwargs)

    monkeypatch.setattr(xgr.GrammarCompiler, "compile_json_schema", holding)
    yield hold
    hold.release()


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), arch="llama", seed=0)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def make_service(tokenizer):
    services = []

    def make(**config) -> GrammarService:
        service = GrammarService.from_tokenizer(
            tokenizer, len(tokenizer), config=GrammarConfig(**config)
        )
        services.append(service)
        return service

    yield make
    for service in services:
        service.close(wait=True)


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        (
            Constraint(ConstraintKind.JSON_SCHEMA, "{not json"),
            "constraint.json_schema: not valid JSON",
        ),
        (
            Constraint(ConstraintKind.JSON_SCHEMA, "[1, 2]"),
            "constraint.json_schema: must be a JSON object",
        ),
        (
            Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "foo"}'),
            'constraint.json_schema: Unsupported type "foo"',
        ),
        (Constraint(ConstraintKind.REGEX, "(ab"), "constraint.regex: Regex parsing error"),
        (Constraint(ConstraintKind.EBNF, "root ::= "), "constraint.ebnf: EBNF parser error"),
        (Constraint(ConstraintKind.EBNF, 'start ::= "a"'), "constraint.ebnf:"),
    ],
)
def test_invalid_constraint_is_invalid_argument_naming_the_field(make_service, constraint, message):
    service = make_service()
    with pytest.raises(InvalidArgument) as error:
        service.compile_sync(constraint)
    assert str(error.value).startswith(message)
    assert "/project/" not in str(error.value) and ".cc:" not in str(error.value)
    assert service.metrics.num_compile_errors == 1


async def test_async_compile_reports_invalid_grammar(make_service):
    service = make_service()
    with pytest.raises(InvalidArgument, match=r"^constraint\.regex: "):
        await service.compile(Constraint(ConstraintKind.REGEX, "a{2,1}"))


def test_failure_is_cached_and_raised_again_without_recompiling(make_service):
    service = make_service()
    bad = Constraint(ConstraintKind.REGEX, "(ab")
    for _ in range(3):
        with pytest.raises(InvalidArgument, match="parenthesis"):
            service.compile_sync(bad)
    assert service.metrics.num_compiles == 1
    assert service.metrics.num_cache_hits == 2


def test_cache_returns_the_same_compile_and_evicts_least_recently_used(make_service):
    service = make_service(cache_size=2)
    a, b, c = (Constraint(ConstraintKind.REGEX, rx) for rx in ("a+", "b+", "c+"))
    first_a = service.compile_sync(a)
    service.compile_sync(b)
    assert service.compile_sync(a) is first_a  # a is now the most recent
    service.compile_sync(c)  # evicts b
    assert service.num_cached == 2
    assert service.compile_sync(a) is first_a
    misses = service.metrics.num_cache_misses
    service.compile_sync(b)
    assert service.metrics.num_cache_misses == misses + 1
    assert service.metrics.num_cache_hits == 2


async def test_concurrent_requests_for_one_grammar_share_one_compile(make_service, held):
    service = make_service(compile_timeout_s=60)
    # the five lookups run (in creation order) before the wait on the worker thread returns
    tasks = [asyncio.create_task(service.compile(HELD)) for _ in range(5)]
    await held.started_in_worker()
    assert (service.metrics.num_cache_misses, service.metrics.num_shared_compiles) == (1, 4)
    held.release()
    results = await asyncio.gather(*tasks)
    assert all(r is results[0] for r in results)
    assert service.metrics.num_compiles == 1
    assert service.metrics.num_shared_compiles == 4
    assert service.compile_sync(HELD) is results[0]


async def test_slow_compile_does_not_delay_a_concurrent_quick_compile(make_service, held):
    service = make_service(compile_timeout_s=60, max_workers=2)
    slow = asyncio.create_task(service.compile(HELD))
    await held.started_in_worker()  # the slow compile has its worker
    quick = await service.compile(QUICK)
    assert not slow.done(), "the slow compile ended before it was released"
    assert quick.constraint == QUICK and service.metrics.num_compiles == 1
    held.release()
    assert (await slow).constraint == HELD
    assert service.metrics.num_compiles == 2


def test_compile_over_the_time_limit_is_invalid_argument_and_cached(make_service, held):
    service = make_service(compile_timeout_s=0.2)
    assert service.poll(HELD) is None
    held.wait_started()  # so the wait below is all compile time
    with pytest.raises(InvalidArgument, match=r"^constraint\.json_schema: grammar too complex"):
        service.compile_sync(HELD)
    assert service.metrics.num_timeouts == 1
    held.release()
    service.close(wait=True)  # the compile runs to its end in its thread
    with pytest.raises(InvalidArgument, match=r"compile took \d+\.\d+ s, limit 0\.2 s"):
        service.compile_sync(HELD)
    assert service.metrics.num_compile_errors == 1
    assert service.metrics.num_compiles == 1


async def test_async_compile_over_the_time_limit(make_service, held):
    service = make_service(compile_timeout_s=0.2)
    assert service.poll(HELD) is None
    await held.started_in_worker()
    with pytest.raises(InvalidArgument, match="grammar too complex"):
        await service.compile(HELD)
    assert service.metrics.num_timeouts == 1


def test_waiting_for_a_busy_pool_past_the_limit_is_resource_exhausted(make_service, held):
    service = make_service(compile_timeout_s=0.1, max_workers=1)
    assert service.poll(HELD) is None  # occupies the only worker
    held.wait_started()
    with pytest.raises(ResourceExhausted, match=r"waited 0\.1 s for a worker"):
        service.compile_sync(QUICK)
    assert service.metrics.num_timeouts == 1


def test_too_many_compiles_in_flight_is_resource_exhausted(make_service, held):
    service = make_service(compile_timeout_s=60, max_workers=1, max_pending=1)
    assert service.poll(HELD) is None
    with pytest.raises(ResourceExhausted, match="compiles in flight"):
        service.poll(QUICK)
    held.release()
    assert service.compile_sync(HELD).constraint == HELD
    assert service.poll(QUICK) is None  # room again once the first compile ended


def test_poll_starts_a_compile_without_blocking_then_returns_it(make_service, held):
    service = make_service(compile_timeout_s=60)
    assert service.poll(HELD) is None
    assert service.poll(HELD) is None  # still compiling: poll does not wait for it
    held.release()
    compiled = service.compile_sync(HELD)
    assert service.poll(HELD) is compiled
    assert service.metrics.num_compiles == 1


def test_choices_grammar_escapes_literals():
    choices = ['say "hi"', "back\\slash", "tab\tline\nbreak", "naïve ✓"]
    ebnf = choices_ebnf(choices)
    assert ebnf.startswith("root ::= ")
    assert json.loads("[" + ebnf.removeprefix("root ::= ").replace(" | ", ", ") + "]") == choices


def test_compiler_reason_drops_the_log_prefix():
    error = RuntimeError(
        "[18:30:48] /project/cpp/x.cc:94: Check failed: (a) is false: bad   thing\n"
    )
    assert compiler_reason(error) == "bad thing"
    assert len(compiler_reason(RuntimeError("x" * 1000), max_chars=50)) == 50


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("compile_timeout_s", 0.0),
        ("compile_timeout_s", float("nan")),
        ("cache_size", 0),
        ("max_workers", 0),
        ("max_pending", 0),
        ("compile_threads", 0),
        ("max_error_chars", 10),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(InvalidArgument, match=rf"^grammar\.{field} "):
        GrammarConfig(**{field: value})


def test_vocab_size_smaller_than_the_tokenizer_is_refused(tokenizer):
    with pytest.raises(InvalidArgument, match=r"^grammar\.vocab_size"):
        GrammarService.from_tokenizer(tokenizer, len(tokenizer) - 1)


def test_from_model_dir_takes_the_models_vocab_size(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    service = GrammarService.from_model_dir(tiny_model_dir)
    try:
        assert service.vocab_size == config["vocab_size"]
        assert service.allocate_bitmask(3).shape == (3, (config["vocab_size"] + 31) // 32)
    finally:
        service.close()


def test_closed_service_keeps_its_cache_and_refuses_new_compiles(make_service, held):
    service = make_service(compile_timeout_s=60, max_workers=1)
    cached = service.compile_sync(Constraint(ConstraintKind.REGEX, "a+"))
    assert service.poll(HELD) is None  # running: finishes in its thread
    held.wait_started()
    assert service.poll(QUICK) is None  # queued: dropped by close
    service.close()
    assert service.compile_sync(Constraint(ConstraintKind.REGEX, "a+")) is cached
    with pytest.raises(Unavailable, match="closed"):
        service.compile_sync(QUICK)
    with pytest.raises(Unavailable, match="closed"):
        service.poll(Constraint(ConstraintKind.REGEX, "b+"))
    held.release()
    service.close(wait=True)
    assert service.compile_sync(HELD).constraint == HELD  # the running compile was kept
    assert service.metrics.num_compiles == 2  # a+ and HELD; QUICK never ran
