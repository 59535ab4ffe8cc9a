"""What the planner refuses, what it rewrites, and that what the grammar then writes validates.

Each rewrite is checked the same way: the planned schema compiled by xgrammar for a
one-character vocabulary, texts drawn at random from it, each validated against the
original schema (radixmesh.schema.check_output).
"""

from __future__ import annotations

import json
import re

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.schema import SchemaCheck, check_enforceable, check_output, plan_json_schema
from radixmesh.schema.pattern import UnsupportedPattern, json_string_pattern
from tests.fixtures.grammar_sampler import GrammarSampler

NUM_DRAWS = 40


@pytest.fixture(scope="module")
def sampler() -> GrammarSampler:
    return GrammarSampler()


def draws(sampler: GrammarSampler, schema, n: int = NUM_DRAWS) -> list[str]:
    grammar = sampler.compile_json_schema(plan_json_schema(schema).grammar_text)
    texts = [sampler.sample(grammar, seed, max_chars=200) for seed in range(n)]
    return [t for t in texts if t is not None]


def assert_all_valid(sampler, schema, min_finished: int = NUM_DRAWS // 2) -> list:
    texts = draws(sampler, schema)
    assert len(texts) >= min_finished
    bad = [(t, check_output(schema, t, "stop").error) for t in texts]
    assert [b for b in bad if b[1]] == []
    return [json.loads(t) for t in texts]


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "properties.a.not"),
        ({"if": {"type": "string"}, "then": {"minLength": 2}}, "if"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf"),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
        ({"type": "array", "contains": {"const": 1}}, "contains"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired"),
        ({"type": "string", "format": "uri"}, "format"),
        ({"type": "string", "pattern": "a(?=b)"}, "pattern"),
        ({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}, "pattern"),
        ({"type": "integer", "multipleOf": 7}, "multipleOf"),
        ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
        ({"properties": {"x": {"$ref": "https://example.com/s.json"}}}, "properties.x.$ref"),
        ({"allOf": [{"type": "string", "pattern": "a"}, {"pattern": "b"}]}, "allOf"),
    ],
)
def test_a_strict_schema_with_an_unenforceable_keyword_is_refused_naming_its_path(schema, where):
    plan = plan_json_schema(schema)
    with pytest.raises(InvalidArgument) as caught:
        check_enforceable(plan, "response_format.json_schema.schema")
    keyword = where.rsplit(".", 1)[-1]
    assert str(caught.value).startswith(
        f'response_format.json_schema.schema.{where}: keyword "{keyword}" cannot be enforced ('
    )
    assert where in plan.unenforced_names()


def test_annotations_and_unknown_keywords_are_not_refused():
    schema = {"title": "t", "description": "d", "examples": [1], "x-vendor": 1, "type": "integer"}
    assert plan_json_schema(schema).unenforced == ()


def test_all_of_of_objects_folds_into_one_object(sampler):
    schema = {
        "type": "object",
        "allOf": [
            {"properties": {"a": {"type": "integer", "minimum": 3}}, "required": ["a"]},
            {"properties": {"a": {"maximum": 5}, "b": {"type": "string", "format": "date"}}},
        ],
    }
    plan = plan_json_schema(schema)
    assert plan.unenforced == ()
    values = assert_all_valid(sampler, schema)
    assert {v["a"] for v in values} <= {3, 4, 5}


def test_fractional_integer_bounds_become_the_whole_numbers_they_admit(sampler):
    """The grammar library refuses an integer bound that is not whole (here from an allOf of
    an integer and a number in [0, 0.5]); the plan writes the whole numbers it admits."""
    schema = {
        "type": "object",
        "allOf": [
            {"properties": {"id": {"type": "integer"}}, "required": ["id"]},
            {"properties": {"id": {"type": "number", "minimum": -2.5, "maximum": 0.5}}},
        ],
    }
    assert plan_json_schema(schema).unenforced == ()
    values = assert_all_valid(sampler, schema)
    assert {v["id"] for v in values} <= {-2, -1, 0}
    odd = {"type": "integer", "exclusiveMinimum": 1.5, "exclusiveMaximum": 4}
    assert {v for v in assert_all_valid(sampler, odd)} <= {2, 3}
    empty = plan_json_schema({"type": "integer", "minimum": 0.2, "maximum": 0.8})
    assert [(u.keyword, u.reason) for u in empty.unenforced] == [
        ("maximum", "no value satisfies minimum and maximum as an integer")
    ]


def test_a_ref_inside_all_of_on_an_array_holds_its_items(sampler):
    schema = {
        "type": "array",
        "allOf": [{"$ref": "#/$defs/small"}],
        "$defs": {"small": {"items": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 4}}},
    }
    values = assert_all_valid(sampler, schema)
    assert all(isinstance(v, list) for v in values)


def test_siblings_of_any_of_hold_in_every_branch(sampler):
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 3}},
        "anyOf": [{"required": ["a"]}, {"required": ["b"]}],
    }
    values = assert_all_valid(sampler, schema)
    assert all("a" in v or "b" in v for v in values)


def test_one_of_with_a_discriminator_is_enforced_and_overlapping_branches_are_not(sampler):
    tagged = {
        "oneOf": [
            {"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]},
            {
                "type": "object",
                "properties": {"kind": {"const": "b"}, "n": {"type": "integer"}},
                "required": ["kind", "n"],
            },
        ]
    }
    assert plan_json_schema(tagged).unenforced == ()
    assert {v["kind"] for v in assert_all_valid(sampler, tagged)} == {"a", "b"}


def test_enum_values_that_break_the_siblings_are_dropped(sampler):
    schema = {"type": "string", "enum": ["a", 1, "b", None]}
    assert set(assert_all_valid(sampler, schema)) == {"a", "b"}


def test_enum_values_that_break_a_format_are_dropped(sampler):
    """Formats are checked on the listed values as on outputs: "" is not a date."""
    schema = {"type": "string", "format": "date", "enum": ["", "2020-01-02", "2020-13-01"]}
    assert set(assert_all_valid(sampler, schema)) == {"2020-01-02"}


def test_required_names_missing_from_properties_are_written(sampler):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}
    assert all("b" in v for v in assert_all_valid(sampler, schema))


def test_a_recursive_ref_is_kept_and_enforced(sampler):
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/node",
    }
    assert_all_valid(sampler, schema)


@pytest.mark.parametrize(
    "pattern",
    [
        r"^\\d+/\\d+$",  # a literal backslash, then digits (JSON: "^\\\\d+/\\\\d+$")
        r'^say "[a-z]+"$',
        r"^x\\.$",
        r"^[^/]+$",
        r"^(\.[0-9]+)?Z$",  # xgrammar alone admits "5Z" here
        r"^a\nb$",
        r"^\d{3}-[A-Z]{2,4}$",
        r"^(ab|c\\)+$",
    ],
)
def test_patterns_yield_json_string_escapes_and_match(sampler, pattern):
    schema = {"type": "string", "pattern": pattern}
    # a branch needing an escape inside an alternation is a dead end (never invalid)
    values = assert_all_valid(sampler, schema, min_finished=1)
    assert all(re.search(pattern, v) for v in values)


def test_a_pattern_that_needs_a_backslash_gets_a_json_escape(sampler):
    schema = {"type": "string", "pattern": r"^\\d+/\\d+$"}
    texts = draws(sampler, schema)
    assert texts and all(t.startswith('"\\\\d') for t in texts)  # JSON text \\d, decoded \d


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": r"^[a-z]{1,5}$", "maxLength": 8},
        {"type": "string", "pattern": r"^\d{3}-[A-Z]{2,4}$", "minLength": 6, "maxLength": 8},
        {"type": "string", "format": "date", "minLength": 10, "maxLength": 10},
        {"type": "string", "format": "uuid", "maxLength": 36},
    ],
)
def test_lengths_a_pattern_implies_are_enforced_by_the_pattern(sampler, schema):
    """An anchored pattern whose every match has a length within minLength/maxLength (a
    common pair: a model's field with a pattern and a max length) holds both exactly."""
    plan = plan_json_schema(schema)
    assert plan.unenforced == ()
    assert "maxLength" not in plan.grammar_text and "pattern" in plan.grammar_text
    assert_all_valid(sampler, schema)


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "string", "pattern": r"^[a-z]{1,5}$", "maxLength": 0}, "^no value satisfies"),
        ({"type": "string", "pattern": r"^[a-z]{1,5}$", "minLength": 6}, "^no value satisfies"),
        ({"type": "string", "pattern": r"[a-z]{3}", "maxLength": 2}, "^no value satisfies"),
        ({"type": "string", "pattern": r"^[a-z]{1,5}$", "maxLength": 3}, "does not imply"),
        ({"type": "string", "pattern": r"^[a-z]+$", "maxLength": 3}, "does not imply"),
        ({"type": "string", "pattern": r"[a-z]{1,5}", "maxLength": 8}, "does not imply"),
    ],
)
def test_lengths_a_pattern_does_not_imply_are_reported_with_why(sampler, schema, reason):
    """Past what the pattern implies, the grammar holds the lengths and the pattern is
    reported: unsatisfiable where no string has both, else inexpressible (the grammar
    takes a pattern or lengths, not their intersection; an unanchored pattern matches
    inside longer strings)."""
    (unenforced,) = plan_json_schema(schema).unenforced
    assert unenforced.keyword == "pattern" and re.search(reason, unenforced.reason)
    assert all(
        schema.get("minLength", 0) <= len(v) <= schema.get("maxLength", len(v))
        for v in (json.loads(t) for t in draws(sampler, schema))
    )


@pytest.mark.parametrize("pattern", [r"a(?=b)", r"(a)\1", r"\bword", r"(?i)abc"])
def test_patterns_the_grammar_cannot_hold_raise(pattern):
    with pytest.raises(UnsupportedPattern):
        json_string_pattern(pattern)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "number"},
        {"type": "integer"},
        {"type": "integer", "minimum": 0},
        {"type": "object", "properties": {"x": {}}, "required": ["x"]},
        {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
    ],
)
def test_numbers_are_finite_with_bounded_digit_runs(sampler, schema):
    texts = draws(sampler, schema)
    assert texts
    for text in texts:
        assert check_output(schema, text, "stop").check is SchemaCheck.VALID
        assert all(len(run) <= 40 for run in re.findall(r"[0-9]+", text))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": -3, "maximum": 7},
        {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 7},
        {"type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 30},
        {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    ],
)
def test_integer_and_number_bounds_hold(sampler, schema):
    assert_all_valid(sampler, schema)


@pytest.mark.parametrize("fmt", ["date", "time", "date-time", "uuid", "ipv4", "ipv6", "email", "hostname"])
def test_enforced_formats_validate(sampler, fmt):
    assert_all_valid(sampler, {"type": "string", "format": fmt})


def test_check_output_separates_truncated_invalid_and_non_finite():
    schema = {"type": "object", "properties": {"n": {"type": "number"}}}
    assert check_output(schema, '{"n": 1', "length").check is SchemaCheck.TRUNCATED
    assert check_output(schema, '{"n": 1e999}', "stop").check is SchemaCheck.INVALID
    assert check_output(schema, '{"n": "x"}', "stop").error.startswith("$.n: ")
    assert check_output({"type": "string", "format": "date"}, '"2023-02-30"', "stop").error
