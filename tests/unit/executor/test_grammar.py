"""GrammarService: compiling constraints, the cache, the worker pool, time limits, errors."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from transformers import AutoTokenizer

from mesh.tiny_model import write_tiny_model
from radixmesh.errors import InvalidArgument, ResourceExhausted, Unavailable
from radixmesh.sampling import Constraint, ConstraintKind
from services.executor.core.grammar import GrammarConfig, GrammarService
from services.executor.core.grammar_compile import choices_ebnf, compiler_reason

QUICK = Constraint(ConstraintKind.REGEX, r"[0-9]{3}")


SLOWER = 1000
"""Properties of a schema compiling for about a second (over 5x the limits tests set)."""


def slow_schema(num_props: int = 300, tag: str = "key") -> Constraint:
    """A schema whose compile takes a good fraction of a second on the tiny vocabulary."""
    names = [f"{tag}_{i}" for i in range(num_props)]
    schema = {
        "type": "object",
        "properties": {name: {"type": "string", "pattern": "[a-z]{2,9}"} for name in names},
        "required": names,
    }
    return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema))


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


async def test_concurrent_requests_for_one_grammar_share_one_compile(make_service):
    service = make_service(compile_timeout_s=60)
    constraint = slow_schema()
    results = await asyncio.gather(*(service.compile(constraint) for _ in range(5)))
    assert all(r is results[0] for r in results)
    assert service.metrics.num_compiles == 1
    assert service.metrics.num_shared_compiles == 4
    assert service.compile_sync(constraint) is results[0]


async def test_slow_compile_does_not_delay_a_concurrent_quick_compile(make_service):
    service = make_service(compile_timeout_s=60, max_workers=2)
    start = time.monotonic()
    done_at: dict[str, float] = {}

    async def timed(name: str, constraint: Constraint):
        await service.compile(constraint)
        done_at[name] = time.monotonic() - start

    slow = asyncio.create_task(timed("slow", slow_schema(SLOWER)))
    await asyncio.sleep(0)  # let the slow compile take its worker first
    await timed("quick", QUICK)
    assert "slow" not in done_at, "the quick compile waited for the slow one"
    await slow
    slow_seconds = service.compile_sync(slow_schema(SLOWER)).compile_seconds
    assert done_at["quick"] < 0.25 * slow_seconds < done_at["slow"]


def test_compile_over_the_time_limit_is_invalid_argument_and_cached(make_service):
    service = make_service(compile_timeout_s=0.2)
    constraint = slow_schema(SLOWER)
    with pytest.raises(InvalidArgument, match=r"^constraint\.json_schema: grammar too complex"):
        service.compile_sync(constraint)
    assert service.metrics.num_timeouts == 1
    service.close(wait=True)  # the compile runs to its end in its thread
    with pytest.raises(InvalidArgument, match=r"compile took \d+\.\d+ s, limit 0\.2 s"):
        service.compile_sync(constraint)
    assert service.metrics.num_compile_errors == 1
    assert service.metrics.num_compiles == 1


async def test_async_compile_over_the_time_limit(make_service):
    service = make_service(compile_timeout_s=0.2)
    with pytest.raises(InvalidArgument, match="grammar too complex"):
        await service.compile(slow_schema(SLOWER))
    assert service.metrics.num_timeouts == 1


def test_waiting_for_a_busy_pool_past_the_limit_is_resource_exhausted(make_service):
    service = make_service(compile_timeout_s=0.1, max_workers=1)
    assert service.poll(slow_schema(SLOWER)) is None  # occupies the only worker
    with pytest.raises(ResourceExhausted, match=r"waited 0\.1 s for a worker"):
        service.compile_sync(QUICK)


def test_too_many_compiles_in_flight_is_resource_exhausted(make_service):
    service = make_service(compile_timeout_s=60, max_workers=1, max_pending=1)
    assert service.poll(slow_schema()) is None
    with pytest.raises(ResourceExhausted, match="compiles in flight"):
        service.poll(QUICK)


def test_poll_starts_a_compile_without_blocking_then_returns_it(make_service):
    service = make_service(compile_timeout_s=60)
    constraint = slow_schema()
    assert service.poll(constraint) is None
    compiled = service.compile_sync(constraint)
    assert service.poll(constraint) is compiled
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


def test_closed_service_keeps_its_cache_and_refuses_new_compiles(make_service):
    service = make_service(compile_timeout_s=60, max_workers=1)
    cached = service.compile_sync(Constraint(ConstraintKind.REGEX, "a+"))
    assert service.poll(slow_schema()) is None  # running: finishes in its thread
    assert service.poll(QUICK) is None  # queued: dropped by close
    service.close()
    assert service.compile_sync(Constraint(ConstraintKind.REGEX, "a+")) is cached
    with pytest.raises(Unavailable, match="closed"):
        service.compile_sync(QUICK)
    with pytest.raises(Unavailable, match="closed"):
        service.poll(Constraint(ConstraintKind.REGEX, "b+"))
