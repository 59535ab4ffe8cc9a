"""The streamed chunk writer: a plain text delta's bytes come from a per-choice template,
and they must be the bytes the general path (the chunk's JSON object) writes."""

from __future__ import annotations

import json

import pytest

from gateway.core import openai_responses as resp
from gateway.core.generate import ChoiceEvent
from gateway.core.openai import parse_chat_request, parse_completion_request
from gateway.core.openai_responses import PositionLogprobs, TokenLogprob, Usage
from gateway.core.output import ChoiceDelta
from gateway.core.prepare import prepare_request
from gateway.core.structured import SchemaOutcome
from gateway.openai_http import _Reply
from radixmesh.schema import SchemaCheck

TEXTS = ["", "hello", ' "quoted" \\ back', "line\nbreak\ttab", "日本語 😀", "\x00\x1f", "</script>"]


def _reply(tokenizer, chat: bool, model: str = "tiny", **body) -> _Reply:
    if chat:
        body = {"messages": [{"role": "user", "content": "hi"}], **body}
        request = parse_chat_request({"model": model, **body})
    else:
        request = parse_completion_request({"model": model, "prompt": "hi", **body})
    prepared = prepare_request(request, tokenizer, "req-1")
    return _Reply(request, prepared, model, resp.new_response_id(chat), tokenizer)


def _events(n: int) -> list[ChoiceEvent]:
    lp = PositionLogprobs(TokenLogprob("a", -0.25, b"a", 7), (TokenLogprob("a", -0.25, b"a", 7),))
    events = []
    for index in range(n):
        for text in TEXTS:
            events.append(ChoiceEvent(ChoiceDelta(index, text=text, token_ids=[5])))
        events.append(ChoiceEvent(ChoiceDelta(index, text="x", logprobs=[lp])))
        schema = SchemaOutcome(SchemaCheck.VALID)
        events.append(ChoiceEvent(ChoiceDelta(index, text="{}"), schema=schema))
        finish = ChoiceDelta(index, text="end", finish_reason="stop", matched_stop="</s>")
        events.append(ChoiceEvent(finish, Usage(3, 4, 0)))
        events.append(ChoiceEvent(ChoiceDelta(index, finish_reason="length"), Usage(3, 4, 0)))
    return events


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completion"])
@pytest.mark.parametrize("model", ["tiny", 'odd "model" \x00text\x00', "\x00text\x00"])
def test_every_chunk_is_the_bytes_of_its_json_object(tokenizer, chat, model):
    reply = _reply(tokenizer, chat, model=model, n=2, stream=True)
    general = _reply(tokenizer, chat, model=model, n=2, stream=True)
    general.response_id, general.created = reply.response_id, reply.created
    offsets, general_offsets = reply.new_offsets(), general.new_offsets()
    for event in _events(2):
        got = reply.chunk_sse(event, offsets)
        assert got == resp.sse(general._chunk(event, general_offsets))
        assert got.startswith(b"data: ") and got.endswith(b"\n\n")
        json.loads(got[len(b"data: ") :])  # one JSON object
    positions = [0, 0] if chat else [1, 1]  # each choice's one token with logprobs: "a"
    assert [o.position for o in offsets] == [o.position for o in general_offsets] == positions


def test_plain_chunks_use_one_template_per_choice(tokenizer):
    reply = _reply(tokenizer, True, n=2, stream=True)
    for event in _events(2):
        reply.chunk_sse(event, reply.new_offsets())
    assert sorted(reply._templates) == [0, 1]
    assert all(t is not None for t in reply._templates.values())
    odd = _reply(tokenizer, True, model="\x00text\x00", stream=True)  # the marker's own text
    event = ChoiceEvent(ChoiceDelta(0, text="a"))
    assert odd.chunk_sse(event, odd.new_offsets()) == resp.sse(odd._chunk(event, odd.new_offsets()))
    assert odd._templates == {0: None}  # the marker's JSON twice: no template
