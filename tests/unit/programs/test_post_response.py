"""post_response plugins on plain requests: a non-streamed output is rewritten whole, a
streamed one goes through the plugins' text streams (held back like stop strings) or, for
a plugin that cannot stream, comes whole with the last chunk; token ids and logprobs are
withheld. Checked on the chain itself, then through both APIs over the tiny model."""

from __future__ import annotations

import random
import re

import pytest

from gateway.core.generate import ChoiceEvent
from gateway.core.openai_responses import PositionLogprobs, TokenLogprob, Usage
from gateway.core.output import ChoiceDelta
from gateway.programs.core.plugins import PluginChain, RegexRedaction
from radixmesh.errors import InvalidArgument

PHONE = r"\d{3}-\d{4}"
TEXT = "call 555-1234 or 555-9876 now; 12-34 is not one, 5551234 neither; end 999-0000"


def redacted(text: str) -> str:
    return re.sub(PHONE, "[redacted]", text)


def random_pieces(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, len(text) - 1)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@pytest.mark.parametrize("holdback", [8, 9, 20])
def test_a_streamed_redaction_equals_the_whole_text_redacted_however_it_is_cut(holdback):
    plugin = RegexRedaction([PHONE], max_match_chars=holdback)
    rng = random.Random(holdback)
    for _ in range(200):
        stream = plugin.post_response_stream()
        sent = []
        for piece in random_pieces(TEXT, rng):
            out = stream.push(piece)
            sent.append(out)
            assert not re.search(PHONE, "".join(sent))  # never a number, even in part
        sent.append(stream.flush())
        assert "".join(sent) == redacted(TEXT)


def test_redaction_applies_inside_json_values_and_refuses_bad_patterns():
    plugin = RegexRedaction([PHONE])
    assert plugin.post_response({"a": ["x 555-1234"], "n": 3}) == {"a": ["x [redacted]"], "n": 3}
    with pytest.raises(InvalidArgument, match=r"RegexRedaction.patterns: .*"):
        RegexRedaction(["(unclosed"])
    with pytest.raises(InvalidArgument, match="max_match_chars: must be >= 1, got 0"):
        RegexRedaction([PHONE], max_match_chars=0)


class WholeOnly:
    """A post_response plugin without a text stream."""

    def post_response(self, value):
        return value.upper() if isinstance(value, str) else value


def events_for(pieces: list[str]) -> list[ChoiceEvent]:
    logprob = PositionLogprobs(TokenLogprob("x", -0.5, b"x", 7), ())
    events = [
        ChoiceEvent(ChoiceDelta(0, text=p, token_ids=[7], logprobs=[logprob])) for p in pieces
    ]
    events[0].delta.prompt_logprobs = [logprob]
    last = events[-1]
    last.delta.finish_reason, last.usage = "length", Usage(5, len(pieces), 0)
    return events


async def rewritten(chain: PluginChain, pieces: list[str], streamed: bool) -> list[ChoiceEvent]:
    async def source():
        for event in events_for(pieces):
            yield event

    return [e async for e in chain.apply_to_events(source(), streamed)]


async def test_without_response_plugins_the_events_pass_unchanged():
    class PreOnly:
        def pre_request(self, text):
            return text

    async def source():
        yield ChoiceEvent(ChoiceDelta(0, text="555-1234", token_ids=[1]))

    events = source()
    assert PluginChain((PreOnly(),)).apply_to_events(events, True) is events


async def test_not_streamed_the_whole_text_comes_rewritten_with_the_last_event():
    chain = PluginChain((RegexRedaction([PHONE]),))
    out = await rewritten(chain, random_pieces(TEXT, random.Random(1)), streamed=False)
    assert len(out) == 1
    (last,) = out
    assert last.delta.text == redacted(TEXT) and last.delta.finish_reason == "length"
    assert last.delta.token_ids == [] and last.delta.logprobs is None
    assert last.delta.prompt_logprobs is not None and last.usage is not None


async def test_streamed_through_text_streams_the_chunks_never_carry_a_match():
    chain = PluginChain((RegexRedaction([PHONE], max_match_chars=10),))
    pieces = random_pieces(TEXT, random.Random(2))
    out = await rewritten(chain, pieces, streamed=True)
    assert len(out) > 1  # text flows before the end
    assert "".join(e.delta.text for e in out) == redacted(TEXT)
    assert all(e.delta.token_ids == [] and e.delta.logprobs is None for e in out)
    assert out[0].delta.prompt_logprobs is not None
    assert [e.delta.finish_reason for e in out].count("length") == 1 and out[-1].usage is not None


async def test_streamed_with_a_plugin_that_cannot_stream_the_text_waits_for_the_end():
    chain = PluginChain((RegexRedaction([PHONE], max_match_chars=10), WholeOnly()))
    out = await rewritten(chain, random_pieces(TEXT, random.Random(3)), streamed=True)
    assert len(out) == 1
    assert out[0].delta.text == redacted(TEXT).upper()
