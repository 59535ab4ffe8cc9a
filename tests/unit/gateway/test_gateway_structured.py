"""JSON-schema requests at the gateway: strict refusals name the keyword and its path, best
effort reports it, and every finished output is checked against the caller's schema."""

from __future__ import annotations

import json

import pytest

from gateway.convert import event_to_responses
from gateway.core.generate import collect, generate
from gateway.core.openai import parse_chat_request
from gateway.core.openai_responses import error_response
from gateway.core.prepare import PreparedRequest, prepare_request
from gateway.core.structured import STRUCTURED_OUTPUTS, schema_fields
from radixmesh.errors import InvalidArgument
from radixmesh.schema import SchemaCheck
from radixmesh.updates import RequestUpdate
from radixmesh.v1 import inference_pb2

NOT_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer", "not": {"const": 3}}},
    "required": ["a"],
}
POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer", "minimum": 0}, "y": {"type": "integer"}},
    "required": ["x", "y"],
}


def chat_body(schema, strict=True, **fields):
    spec = {"name": "s", "schema": schema}
    if strict is not None:
        spec["strict"] = strict
    return {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 30,
        "response_format": {"type": "json_schema", "json_schema": spec},
        **fields,
    }


class ScriptedUpstream:
    """Answers every choice with the same text (one update of all its tokens)."""

    def __init__(self, tokenizer, text, finish):
        self.ids = tokenizer._hf.encode(text, add_special_tokens=False)
        self.finish = finish

    async def generate(self, req_id, token_ids, sampling, **options):
        yield RequestUpdate(req_id, token_ids=list(self.ids), finish_reason=self.finish)

    async def abort(self, req_id):
        pass


def count(result: str) -> float:
    return STRUCTURED_OUTPUTS.labels(result=result)._value.get()


def test_a_strict_schema_with_an_unenforceable_keyword_is_refused_naming_it(tokenizer):
    request = parse_chat_request(chat_body(NOT_SCHEMA))
    with pytest.raises(InvalidArgument) as caught:
        prepare_request(request, tokenizer, "r1")
    assert str(caught.value) == (
        'constraint.json_schema.properties.a.not: keyword "not" cannot be enforced (negation)'
    )
    status, body = error_response(caught.value)
    assert status == 400
    assert body["error"]["param"] == "response_format.json_schema.schema.properties.a.not"
    assert body["error"]["message"].startswith(
        'response_format.json_schema.schema.properties.a.not: keyword "not"'
    )


@pytest.mark.parametrize("strict", [False, None])
def test_without_strict_the_schema_compiles_and_its_unenforced_keywords_are_kept(
    tokenizer, strict
):
    prepared = prepare_request(parse_chat_request(chat_body(NOT_SCHEMA, strict)), tokenizer, "r1")
    assert prepared.constraint.best_effort
    assert prepared.schema.unenforced == ("properties.a.not",)
    assert json.loads(prepared.constraint.value) == NOT_SCHEMA  # the caller's schema travels


def test_strict_must_be_a_boolean():
    with pytest.raises(InvalidArgument, match=r"response_format\.json_schema\.strict"):
        parse_chat_request(chat_body(POINT, strict="yes"))


@pytest.mark.parametrize(
    ("text", "finish", "check"),
    [
        ('{"x": 1, "y": -2}', "stop", SchemaCheck.VALID),
        ('{"x": -1, "y": 2}', "stop", SchemaCheck.INVALID),
        ('{"x": 1, "y": 1e999}', "stop", SchemaCheck.INVALID),
        ('{"x": 1, "y"', "length", SchemaCheck.TRUNCATED),
    ],
)
async def test_each_finished_output_is_checked_counted_and_reported(tokenizer, text, finish, check):
    prepared = prepare_request(parse_chat_request(chat_body(POINT)), tokenizer, "r1")
    before = count(check.value)
    events = generate(prepared, tokenizer, ScriptedUpstream(tokenizer, text, finish))
    [merged] = await collect(events, 1)
    assert merged.delta.text == text
    assert merged.schema.check is check
    assert count(check.value) == before + 1
    assert bool(merged.schema.error) == (check is SchemaCheck.INVALID)
    fields = schema_fields(merged.schema)
    assert fields["schema_check"] == check.value
    [*_, complete] = event_to_responses("r1", merged)
    assert complete.complete.schema_check == {
        SchemaCheck.VALID: inference_pb2.SCHEMA_CHECK_VALID,
        SchemaCheck.INVALID: inference_pb2.SCHEMA_CHECK_INVALID,
        SchemaCheck.TRUNCATED: inference_pb2.SCHEMA_CHECK_TRUNCATED,
    }[check]


async def test_a_best_effort_output_lists_the_unenforced_keywords(tokenizer):
    prepared = prepare_request(parse_chat_request(chat_body(NOT_SCHEMA, False)), tokenizer, "r1")
    events = generate(prepared, tokenizer, ScriptedUpstream(tokenizer, '{"a": 3}', "stop"))
    [merged] = await collect(events, 1)
    assert merged.schema.check is SchemaCheck.INVALID  # 3 is what "not" forbids
    assert schema_fields(merged.schema)["unenforced_keywords"] == ["properties.a.not"]
    [*_, complete] = event_to_responses("r1", merged)
    assert list(complete.complete.unenforced_keywords) == ["properties.a.not"]


async def test_requests_without_a_json_schema_carry_no_check(tokenizer):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    prepared: PreparedRequest = prepare_request(parse_chat_request(body), tokenizer, "r1")
    assert prepared.schema is None
    events = generate(prepared, tokenizer, ScriptedUpstream(tokenizer, "hi", "stop"))
    [merged] = await collect(events, 1)
    assert merged.schema is None and schema_fields(merged.schema) == {}
    [*_, complete] = event_to_responses("r1", merged)
    assert complete.complete.schema_check == inference_pb2.SCHEMA_CHECK_UNSPECIFIED
