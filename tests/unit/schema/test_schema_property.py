"""Property: any schema of the enforced subset plans with nothing unenforced, and every text the
compiled grammar admits validates against it. Schemas are drawn by hypothesis."""

from __future__ import annotations

import re

import jsonschema
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from radixmesh.schema import SchemaCheck, check_output, plan_json_schema
from radixmesh.schema.formats import FORMAT_PATTERNS
from tests.fixtures.grammar_sampler import GrammarSampler

SAMPLER = GrammarSampler()
UNSATISFIABLE = re.compile(
    r"^no (listed )?(value|branch) satisf|cannot be combined exactly|^a format beside a pattern$"
)
"""What random allOf branches may make a plan report: they contradict each other, or give one
string two regular expressions (two patterns, a format and a pattern), or a pattern and
lengths it does not imply, that no one grammar expresses exactly."""
NAMES = st.sampled_from(["id", "name", "x", "y", "tags", "kind", "a b", 'q"t', "é"])
PATTERNS = st.sampled_from(
    [r"^[a-z]{1,5}$", r"^\d{2}-\d{2}$", r"^\\[a-c]+$", r'^"[0-9]"$', r"^(x|yz)*$", r"^v(\.[0-9]+)?$"]
)


def _ordered(low: int, high: int) -> tuple[int, int]:
    return (low, high) if low <= high else (high, low)


strings = st.one_of(
    st.just({"type": "string"}),
    st.tuples(st.integers(0, 4), st.integers(0, 8)).map(
        lambda t: {"type": "string", "minLength": min(t), "maxLength": max(t)}
    ),
    PATTERNS.map(lambda p: {"type": "string", "pattern": p}),
    st.sampled_from(sorted(FORMAT_PATTERNS)).map(lambda f: {"type": "string", "format": f}),
    st.lists(st.text(max_size=4), min_size=1, max_size=4, unique=True).map(lambda v: {"enum": v}),
)
numbers = st.one_of(
    st.just({"type": "integer"}),
    st.just({"type": "number"}),
    st.tuples(st.integers(-50, 50), st.integers(-50, 50)).map(
        lambda t: {"type": "integer", "minimum": _ordered(*t)[0], "maximum": _ordered(*t)[1]}
    ),
    st.tuples(st.integers(-50, 48), st.integers(2, 30)).map(
        lambda t: {"type": "integer", "exclusiveMinimum": t[0], "exclusiveMaximum": t[0] + t[1]}
    ),
    st.tuples(st.integers(1, 9), st.integers(0, 60)).map(
        lambda t: {"type": "integer", "multipleOf": t[0], "minimum": 0, "maximum": t[1] + t[0]}
    ),
    st.tuples(st.floats(-10, 10), st.floats(0.5, 10)).map(
        lambda t: {"type": "number", "minimum": round(t[0], 2), "maximum": round(t[0] + t[1], 2)}
    ),
)
leaves = st.one_of(strings, numbers, st.just({"type": "boolean"}), st.just({"type": "null"}))


def _containers(children):
    objects = st.dictionaries(NAMES, children, max_size=3).flatmap(
        lambda props: st.sets(st.sampled_from(sorted(props)) if props else st.nothing()).map(
            lambda req: {"type": "object", "properties": props, "required": sorted(req)}
        )
        if props
        else st.just({"type": "object", "properties": {}})
    )
    arrays = st.tuples(children, st.integers(0, 2), st.integers(0, 2)).map(
        lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[1] + t[2]}
    )
    any_of = st.lists(children, min_size=2, max_size=3).map(lambda bs: {"anyOf": bs})
    all_of = st.tuples(st.dictionaries(NAMES, children, max_size=2), st.dictionaries(NAMES, children, max_size=2)).map(
        lambda t: {"type": "object", "allOf": [{"properties": t[0]}, {"properties": t[1]}]}
    )
    nullable = children.map(lambda c: {"anyOf": [c, {"type": "null"}]})
    return st.one_of(objects, arrays, any_of, all_of, nullable)


schemas = st.recursive(leaves, _containers, max_leaves=6)


FORMAT_AND_PATTERN = {
    "anyOf": [
        {
            "type": "object",
            "allOf": [
                {"properties": {"é": {"type": "string", "format": "date"}}},
                {"properties": {"id": {"type": "string"}, "é": {"type": "string", "pattern": "^[a-z]{1,5}$"}}},
            ],
        },
        {"type": "null"},
    ]
}
"""An allOf that gives one string a format and a pattern: reported, not enforced."""

LENGTHS_AND_PATTERN = {
    "anyOf": [
        {
            "type": "object",
            "allOf": [
                {"properties": {"id": {"type": "string", "minLength": 0, "maxLength": 0}}},
                {"properties": {"id": {"type": "string", "pattern": "^[a-z]{1,5}$"}}},
            ],
        },
        {"type": "null"},
    ]
}
"""An allOf that gives one string lengths its pattern contradicts: reported as unsatisfiable."""

FORMAT_AND_ENUM = {
    "type": "object",
    "allOf": [
        {"properties": {"id": {"type": "string", "format": "date"}}},
        {"properties": {"id": {"enum": [""]}}},
    ],
}
"""An allOf that lists only a value its format refuses: reported, never emitted."""


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, seed=st.integers(0, 2**16))
@example(schema=FORMAT_AND_PATTERN, seed=0)
@example(schema=LENGTHS_AND_PATTERN, seed=0)
@example(schema=FORMAT_AND_ENUM, seed=0)
def test_every_text_the_grammar_admits_validates(schema, seed):
    jsonschema.validators.validator_for(schema).check_schema(schema)
    plan = plan_json_schema(schema)
    # allOf branches drawn at random can contradict each other: only that is reported
    assert all(UNSATISFIABLE.search(u.reason) for u in plan.unenforced), plan.unenforced
    assume(not plan.unenforced)
    grammar = SAMPLER.compile_json_schema(plan.grammar_text)
    for draw in range(4):
        text = SAMPLER.sample(grammar, seed + draw, max_chars=300)
        if text is None:
            continue  # did not finish within max_chars: a length cut, never a failure
        result = check_output(schema, text, "stop")
        assert result.check is SchemaCheck.VALID, (text, result.error)
