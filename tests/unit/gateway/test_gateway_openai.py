from __future__ import annotations

import json

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.core import openai_responses as resp
from gateway.core.openai import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    ParamError,
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
    parse_stream_options,
)
from gateway.core.request import ChatMessage
from radixmesh.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable
from radixmesh.sampling import ConstraintKind, Priority


def chat(**fields):
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}


def completion(**fields):
    return {"model": "tiny", "prompt": "once upon", **fields}


def test_chat_request_maps_every_sampling_field():
    req = parse_chat_request(
        chat(
            max_completion_tokens=32,
            temperature=0.5,
            top_p=0.9,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
            stop="END",
            seed=7,
            logprobs=True,
            top_logprobs=3,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            user="u1",
            top_k=40,
            min_p=0.05,
            priority="batch",
            repetition_penalty=1.1,
            ignore_eos=True,
            min_tokens=2,
            stop_token_ids=[5],
        )
    )
    s = req.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.n, s.seed) == (32, 0.5, 0.9, 2, 7)
    assert (s.stop, s.stop_token_ids, s.logprobs, s.top_logprobs) == (("END",), (5,), True, 3)
    assert (s.presence_penalty, s.frequency_penalty, s.top_k, s.min_p) == (0.5, -0.5, 40, 0.05)
    assert (s.repetition_penalty, s.ignore_eos, s.min_tokens) == (1.1, True, 2)
    assert req.chat and req.stream and req.include_usage and req.user == "u1"
    assert req.priority is Priority.BATCH and req.constraint is None
    assert req.input.messages == (ChatMessage("user", "hi"),)


def test_chat_defaults_and_content_parts():
    req = parse_chat_request(
        {
            "messages": [
                {"role": "developer", "content": "be terse"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": None},
            ]
        }
    )
    assert req.model == "" and req.sampling.max_tokens is None and not req.stream
    assert req.priority is Priority.INTERACTIVE
    assert [m.role for m in req.input.messages] == ["system", "user", "assistant"]
    assert req.input.messages[1].content == "ab"


def test_completion_request_prompt_forms_and_logprobs():
    req = parse_completion_request(completion(logprobs=2, stop=["a", "b"]))
    assert req.input.prompt == "once upon" and not req.chat
    assert req.sampling.max_tokens == DEFAULT_COMPLETION_MAX_TOKENS
    assert (
        req.sampling.logprobs and req.sampling.top_logprobs == 2 and req.sampling.stop == ("a", "b")
    )
    assert parse_completion_request(completion(prompt=[1, 2, 3])).input.token_ids == (1, 2, 3)
    assert parse_completion_request(completion(prompt=["x"])).input.prompt == "x"
    assert parse_completion_request(completion(prompt=[[4, 5]])).input.token_ids == (4, 5)
    assert not parse_completion_request(completion(logprobs=None)).sampling.logprobs


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"response_format": {"type": "json_object"}}, (ConstraintKind.JSON_OBJECT, "", ())),
        ({"response_format": {"type": "text"}}, None),
        ({"regex": "[a-z]+"}, (ConstraintKind.REGEX, "[a-z]+", ())),
        ({"ebnf": 'root ::= "yes"'}, (ConstraintKind.EBNF, 'root ::= "yes"', ())),
        ({"choices": ["yes", "no"]}, (ConstraintKind.CHOICES, "", ("yes", "no"))),
    ],
)
def test_constraints(body, expected):
    constraint = parse_chat_request(chat(**body)).constraint
    got = None if constraint is None else (constraint.kind, constraint.value, constraint.choices)
    assert got == expected


def test_json_schema_constraint_carries_the_schema_text():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    body = chat(
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    )
    constraint = parse_chat_request(body).constraint
    assert constraint.kind is ConstraintKind.JSON_SCHEMA
    assert json.loads(constraint.value) == schema


def test_an_oversized_schema_is_refused_before_it_is_checked(monkeypatch):
    """The size is checked first: the JSON Schema check's work grows with the schema too."""
    import gateway.core.openai as openai_core

    def checked(schema):
        raise AssertionError("the schema was checked")

    monkeypatch.setattr(openai_core, "_check_schema", checked)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(12_000)}}
    body = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    with pytest.raises(ParamError, match=r"must be at most 262144 characters as JSON, got \d+") as raised:
        parse_chat_request(body)
    assert raised.value.param == "response_format.json_schema.schema"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(temperature="hot"), "temperature"),
        (chat(temperature=2.5), "temperature"),
        (chat(temperature=True), "temperature"),
        (chat(top_p=0), "top_p"),
        (chat(n=0), "n"),
        (chat(n=17), "n"),
        (chat(n=1.5), "n"),
        (chat(max_tokens=0), "max_tokens"),
        (chat(max_completion_tokens=-1), "max_completion_tokens"),
        (chat(max_completion_tokens=4, min_tokens=5), "min_tokens"),
        (chat(stream="yes"), "stream"),
        (chat(stop=["ok", 3]), "stop"),
        (chat(stop=""), "stop"),
        (chat(top_logprobs=2), "top_logprobs"),
        (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
        (chat(logprobs=3), "logprobs"),
        (chat(presence_penalty=3), "presence_penalty"),
        (chat(repetition_penalty=0), "repetition_penalty"),
        (chat(top_k=-2), "top_k"),
        (chat(min_p=1.5), "min_p"),
        (chat(priority="urgent"), "priority"),
        (chat(stream_options={"include_usage": True}), "stream_options"),
        (chat(response_format={"type": "xml"}), "response_format.type"),
        (
            chat(response_format={"type": "json_schema", "json_schema": {}}),
            "response_format.json_schema.schema",
        ),
        (
            chat(response_format={"type": "json_schema", "json_schema": {"schema": {"type": 5}}}),
            "response_format.json_schema.schema",
        ),
        (chat(regex="a+", choices=["a"]), "choices"),
        (chat(choices=[]), "choices"),
        (chat(tools=[{"type": "function"}]), "tools"),
        (chat(logit_bias={"1": 5}), "logit_bias"),
        (chat(frobnicate=1), "frobnicate"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0].type",
        ),
        (completion(prompt=""), "prompt"),
        (completion(prompt=["a", "b"]), "prompt"),
        (completion(prompt=[1, -2]), "prompt"),
        (completion(prompt=None), "prompt"),
        (completion(logprobs=True), "logprobs"),
        (completion(logprobs=21), "logprobs"),
        (completion(best_of=3), "best_of"),
        (completion(suffix="x"), "suffix"),
        (completion(messages=[]), "messages"),
    ],
)
def test_bad_fields_are_named_in_an_openai_error_body(body, param):
    parse = (
        parse_chat_request
        if "messages" in body and "prompt" not in body
        else parse_completion_request
    )
    with pytest.raises(ParamError) as info:
        parse(body)
    assert info.value.param == param
    status, error = resp.error_response(info.value)
    assert status == 400
    assert error["error"]["param"] == param
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["code"] == "invalid_argument"
    assert error["error"]["message"].startswith(f"{param}: ")


@pytest.mark.parametrize("n", [0, 17])
def test_n_out_of_range_names_the_range_it_must_be_in(n):
    with pytest.raises(ParamError, match=r"^n: must be in \[1, 16\], got"):
        parse_chat_request(chat(n=n))


def test_json_body_errors():
    assert parse_json_body(b'{"a": 1}') == {"a": 1}
    for raw in (b"{nope", b"[1, 2]", b'{"a": "\xff"}'):
        with pytest.raises(ParamError):
            parse_json_body(raw)


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (NotFound("model: x"), 404),
        (ResourceExhausted("queue full"), 429),
        (Unavailable("down"), 503),
    ],
)
def test_status_mapping(exc, status):
    got, body = resp.error_response(exc)
    assert got == status and body["error"]["message"] == str(exc)


def test_unexpected_errors_hide_details():
    status, body = resp.error_response(RuntimeError("secret path /x"))
    assert status == 500 and "secret" not in json.dumps(body)


# --- responses, validated against the openai package's own models ---------------------------

ENTRIES = [
    resp.PositionLogprobs(
        resp.TokenLogprob("hel", -0.1, b"hel"),
        (resp.TokenLogprob("hel", -0.1, b"hel"), resp.TokenLogprob("he", -2.5, b"he")),
    ),
    resp.PositionLogprobs(resp.TokenLogprob("\ufffd", float("-inf"), b"\xf0"), ()),
]


def test_chat_completion_shape():
    usage = resp.Usage(prompt_tokens=10, completion_tokens=2, cached_tokens=8)
    choices = [resp.ChoiceOutput(0, "hel", "stop", ENTRIES, matched_stop="\n")]
    obj = resp.chat_completion("chatcmpl-1", "tiny", 123, choices, usage)
    parsed = ChatCompletion.model_validate(obj)
    assert parsed.choices[0].message.content == "hel"
    assert parsed.choices[0].finish_reason == "stop"
    assert parsed.usage.total_tokens == 12
    assert parsed.usage.prompt_tokens_details.cached_tokens == 8
    content = parsed.choices[0].logprobs.content
    assert [c.token for c in content] == ["hel", "\ufffd"]
    assert content[1].logprob == resp.MIN_LOGPROB and content[1].bytes == [0xF0]
    assert [t.logprob for t in content[0].top_logprobs] == [-0.1, -2.5]
    json.dumps(obj, allow_nan=False)  # no inf/nan leaks into the JSON


def test_text_completion_shape():
    usage = resp.Usage(prompt_tokens=3, completion_tokens=2)
    obj = resp.text_completion(
        "cmpl-1", "tiny", 1, [resp.ChoiceOutput(0, "hel\ufffd", "length", ENTRIES)], usage
    )
    parsed = Completion.model_validate(obj)
    logprobs = parsed.choices[0].logprobs
    assert logprobs.tokens == ["hel", "\ufffd"]
    assert logprobs.text_offset == [0, 3]
    assert logprobs.top_logprobs[0] == {"hel": -0.1, "he": -2.5}
    assert parsed.choices[0].finish_reason == "length"


def test_sse_stream_of_chunks_ends_with_done():
    created = resp.now_s()
    rid = resp.new_response_id(chat=True)
    events = [
        resp.chat_completion_chunk(rid, "tiny", created, 0, role="assistant", content=""),
        resp.chat_completion_chunk(rid, "tiny", created, 0, content="日本"),
        resp.chat_completion_chunk(
            rid, "tiny", created, 0, finish_reason="stop", logprobs=ENTRIES[:1]
        ),
        resp.usage_chunk(rid, "tiny", created, True, resp.Usage(4, 2, 0)),
    ]
    stream = b"".join(resp.sse(e) for e in events) + resp.SSE_DONE
    frames = stream.decode().split("\n\n")
    assert frames[-1] == "" and frames[-2] == "data: [DONE]"
    chunks = [
        ChatCompletionChunk.model_validate_json(f.removeprefix("data: ")) for f in frames[:-2]
    ]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "日本"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[2].choices[0].finish_reason == "stop"
    assert chunks[3].choices == [] and chunks[3].usage.completion_tokens == 2
    assert all(c.id == rid for c in chunks)


def test_model_list_shape():
    from openai.types import Model

    obj = resp.model_list([("tiny", 2048), ("big", 128)], created=5)
    assert obj["object"] == "list"
    models = [Model.model_validate(m) for m in obj["data"]]
    assert [(m.id, m.max_model_len) for m in models] == [("tiny", 2048), ("big", 128)]


# --- numbers past what Python or a float holds ----------------------------------------------


def test_an_integer_past_pythons_digit_limit_is_a_400_naming_the_problem():
    raw = b'{"model": "tiny", "seed": ' + b"9" * 5000 + b"}"
    with pytest.raises(ParamError) as info:
        parse_json_body(raw)
    status, body = resp.error_response(info.value)
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] is None
    assert "an integer of more than 4300 digits" in body["error"]["message"]


FLOAT_FIELDS = [
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
]


@pytest.mark.parametrize("sign", [1, -1], ids=["positive", "negative"])
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_a_number_field_holding_an_integer_past_the_float_range_is_a_400(field, sign):
    with pytest.raises(ParamError) as info:
        parse_chat_request(chat(**{field: sign * 10**400}))
    status, body = resp.error_response(info.value)
    assert status == 400 and body["error"]["param"] == field
    assert body["error"]["message"].startswith(f"{field}: is too large for a number")


@pytest.mark.parametrize("field", ["n", "top_k", "max_tokens", "min_tokens", "temperature"])
def test_range_errors_quote_a_huge_value_shortly(field):
    with pytest.raises(ParamError) as info:
        parse_chat_request(chat(**{field: -(10**300)}))
    assert info.value.param == field and len(str(info.value)) < 100


# --- wrong-typed but falsy values, and stream_options -----------------------------------------


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        (chat(logit_bias=False), "logit_bias", "expected an object"),
        (chat(logit_bias=""), "logit_bias", "expected an object"),
        (chat(logit_bias=[]), "logit_bias", "expected an object"),
        (completion(logit_bias=0), "logit_bias", "expected an object"),
        (chat(tools=False), "tools", "expected an array"),
        (chat(tools={}), "tools", "expected an array"),
        (chat(tools=""), "tools", "expected an array"),
        (chat(tool_choice=0), "tool_choice", 'expected "none", "auto" or an object'),
        (chat(tool_choice="required"), "tool_choice", "tool calling is not supported"),
        (
            chat(stream=True, stream_options={"include_usage": True, "bogus": 1}),
            "stream_options.bogus",
            "unrecognized request argument",
        ),
        (
            chat(stream=True, stream_options={"include_usage": 1}),
            "stream_options.include_usage",
            "expected a boolean",
        ),
        (chat(stream=True, stream_options=[]), "stream_options", "expected an object"),
        (
            completion(stream=True, stream_options={"include_usage": False, "continuous_usage_stats": True}),
            "stream_options.continuous_usage_stats",
            "needs stream_options.include_usage, set false here",
        ),
        (
            completion(stream=True, stream_options={"continuous_usage_stats": "yes"}),
            "stream_options.continuous_usage_stats",
            "expected a boolean",
        ),
    ],
)
def test_wrong_typed_falsy_values_and_unknown_stream_options_are_400s(body, param, says):
    parse = parse_chat_request if "messages" in body else parse_completion_request
    with pytest.raises(ParamError) as info:
        parse(body)
    status, error = resp.error_response(info.value)
    assert status == 400 and error["error"]["param"] == param
    assert error["error"]["message"].startswith(f"{param}: ")
    assert says in error["error"]["message"]


def test_empty_logit_bias_and_tools_and_known_stream_options_are_accepted():
    req = parse_chat_request(
        chat(
            logit_bias={},
            tools=[],
            tool_choice="none",
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        )
    )
    assert req.include_usage
    options = parse_stream_options(
        {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    )
    assert options.include_usage and options.continuous_usage_stats
    assert not parse_stream_options({"stream": True}).continuous_usage_stats
    implied = parse_stream_options({"stream": True, "stream_options": {"continuous_usage_stats": True}})
    assert implied.include_usage and implied.continuous_usage_stats  # as vLLM, where it defaults on


# --- which leading names of a core's message become the error's param ------------------------


@pytest.mark.parametrize(
    ("message", "param", "rewritten"),
    [
        (
            'constraint.json_schema.properties.my-field.not: keyword "not" cannot be enforced',
            "response_format.json_schema.schema.properties.my-field.not",
            'response_format.json_schema.schema.properties.my-field.not: keyword "not" cannot'
            " be enforced",
        ),
        (
            "constraint.json_schema.$ref: cannot be enforced (remote reference)",
            "response_format.json_schema.schema.$ref",
            "response_format.json_schema.schema.$ref: cannot be enforced (remote reference)",
        ),
        (
            "constraint.json_schema.properties.a b.items[0]: no",
            "response_format.json_schema.schema.properties.a b.items[0]",
            "response_format.json_schema.schema.properties.a b.items[0]: no",
        ),
        ("constraint.regex: does not compile", "regex", "regex: does not compile"),
        ("messages[0].role: unknown role", "messages[0].role", "messages[0].role: unknown role"),
        ("max_tokens: 40 plus the prompt", "max_tokens", "max_tokens: 40 plus the prompt"),
        ("prompt[3]: 9 is not a token id", "prompt[3]", "prompt[3]: 9 is not a token id"),
        ("response_format: no grammar", "response_format", "response_format: no grammar"),
        ("constraint.json_schemas: x", None, "constraint.json_schemas: x"),
        ("input: one of prompt or messages", None, "input: one of prompt or messages"),
        ("request body is not valid JSON: x", None, "request body is not valid JSON: x"),
        ("sampling.top_k must be below 2^31", None, "sampling.top_k must be below 2^31"),
        ("finish_reason: must be one of", None, "finish_reason: must be one of"),
    ],
)
def test_only_request_fields_become_the_param(message, param, rewritten):
    status, body = resp.error_response(InvalidArgument(message))
    assert status == 400
    assert body["error"]["param"] == param
    assert body["error"]["message"] == rewritten


@pytest.mark.parametrize("word", ["overloaded", "preempted", "queue full", "unavailable", "stop"])
def test_a_status_word_before_a_colon_is_no_param(word):
    message = f"{word}: the scheduler admits no more interactive requests now"
    status, body = resp.error_response(ResourceExhausted(message))
    assert status == 429 and body["error"]["param"] is None
    assert body["error"]["message"] == message
