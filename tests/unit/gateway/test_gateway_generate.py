from __future__ import annotations

import asyncio

import pytest

from gateway.core.generate import collect, generate, total_usage
from gateway.core.openai import parse_completion_request
from gateway.core.prepare import PreparedRequest, prepare_request
from radixmesh.errors import ResourceExhausted
from radixmesh.updates import RequestUpdate


class FakeUpstream:
    """Plays a scripted list of updates per choice; an asyncio.Event in a script is awaited."""

    def __init__(self, scripts):
        self.scripts = scripts  # choice index -> list of RequestUpdate | asyncio.Event
        self.submitted = []
        self.aborted = []

    async def generate(self, req_id, token_ids, sampling, **options):
        request = PreparedRequest(req_id, prompt_token_ids=tuple(token_ids), sampling=sampling, **options)
        self.submitted.append(request)
        index = int(request.req_id.rsplit("/", 1)[1]) if "/" in request.req_id else 0
        for item in self.scripts[index]:
            if isinstance(item, asyncio.Event):
                await item.wait()
            else:
                yield item

    async def abort(self, req_id):
        self.aborted.append(req_id)


def updates_for(tokenizer, text, size=2, finish="length", first=None):
    ids = tokenizer._hf.encode(text, add_special_tokens=False)
    chunks = [ids[i : i + size] for i in range(0, len(ids), size)]
    out = [RequestUpdate("req", token_ids=c) for c in chunks]
    out[-1].finish_reason = finish
    out[0].num_prompt_tokens, out[0].num_cached_tokens = first or (None, None)
    return out


def prepared(tokenizer, **fields):
    request = parse_completion_request({"prompt": "hello", "max_tokens": 20, **fields})
    return prepare_request(request, tokenizer, "req")


async def test_two_choices_merge_with_usage(tokenizer):
    upstream = FakeUpstream(
        {
            0: updates_for(tokenizer, "hello 😀 world", first=(9, 4)),
            1: updates_for(tokenizer, "日本語", size=1, finish="stop", first=(9, 4)),
        }
    )
    events = [e async for e in generate(prepared(tokenizer, n=2), tokenizer, upstream)]
    texts = {i: "".join(e.delta.text for e in events if e.delta.index == i) for i in (0, 1)}
    assert texts == {0: "hello 😀 world", 1: "日本語"}
    finals = {e.delta.index: e for e in events if e.delta.finish_reason}
    assert finals[0].delta.finish_reason == "length" and finals[1].delta.finish_reason == "stop"
    assert finals[0].usage.prompt_tokens == 9 and finals[0].usage.cached_tokens == 4
    usage = total_usage(list(finals.values()))
    n0 = len(tokenizer._hf.encode("hello 😀 world", add_special_tokens=False))
    n1 = len(tokenizer._hf.encode("日本語", add_special_tokens=False))
    assert (usage.prompt_tokens, usage.completion_tokens) == (9, n0 + n1)
    assert [r.req_id for r in upstream.submitted] == ["req/0", "req/1"]
    assert upstream.aborted == []


async def test_stop_string_aborts_that_choice_upstream(tokenizer):
    upstream = FakeUpstream({0: updates_for(tokenizer, "the quick brown fox jumps over", size=1)})
    events = [e async for e in generate(prepared(tokenizer, stop=["fox"]), tokenizer, upstream)]
    assert "".join(e.delta.text for e in events) == "the quick brown "
    assert events[-1].delta.matched_stop == "fox"
    assert upstream.aborted == ["req"]


async def test_upstream_error_is_raised_and_other_choices_aborted(tokenizer):
    never = asyncio.Event()
    running = [*updates_for(tokenizer, "the lazy dog", finish=""), never]
    upstream = FakeUpstream(
        {0: running, 1: [RequestUpdate("req/1", error=ResourceExhausted("queue full"))]}
    )
    with pytest.raises(ResourceExhausted, match="queue full"):
        await collect(generate(prepared(tokenizer, n=2), tokenizer, upstream), 2)
    assert upstream.aborted == ["req/0"]  # the failed one is over already


async def test_client_going_away_aborts_running_choices(tokenizer):
    never = asyncio.Event()
    upstream = FakeUpstream({0: [RequestUpdate("req", token_ids=tokenizer._hf.encode("hi")), never]})
    events = generate(prepared(tokenizer), tokenizer, upstream)
    first = await anext(events)
    assert first.delta.text == "hi"
    await events.aclose()
    assert upstream.aborted == ["req"]


async def test_upstream_ending_without_finish_reports_abort(tokenizer):
    updates = updates_for(tokenizer, "hello world")
    updates[-1].finish_reason = ""
    upstream = FakeUpstream({0: updates})
    merged = await collect(generate(prepared(tokenizer), tokenizer, upstream), 1)
    assert merged[0].delta.text == "hello world" and merged[0].delta.finish_reason == "abort"
