from __future__ import annotations

import pytest

from gateway.core.output import ChoiceStream
from radixmesh.errors import InvalidArgument
from radixmesh.step import TokenLogprobs


def ids_of(tokenizer, text):
    return tokenizer._hf.encode(text, add_special_tokens=False)


def feed(stream, ids, size=1, finish_reason="length"):
    deltas = []
    for i in range(0, len(ids), size):
        last = i + size >= len(ids)
        deltas.append(
            stream.on_update(ids[i : i + size], finish_reason=finish_reason if last else "")
        )
    return deltas


def test_stop_string_ends_the_choice_and_asks_for_an_upstream_abort(tokenizer):
    ids = ids_of(tokenizer, "hello 😀 world END more words")
    stream = ChoiceStream(0, tokenizer, stop=["END"])
    deltas = feed(stream, ids)
    text = "".join(d.text for d in deltas)
    assert text == "hello 😀 world "
    final = [d for d in deltas if d.finish_reason]
    assert len(final) == 1 and final[0].matched_stop == "END" and final[0].abort_upstream
    assert stream.finish_reason == "stop"
    # Tokens after the stop add nothing; the count stops at the stop's token.
    assert all(d.text == "" and d.token_ids == [] for d in deltas[deltas.index(final[0]) + 1 :])
    assert stream.num_tokens == sum(len(d.token_ids) for d in deltas)


def test_length_finish_releases_held_text(tokenizer):
    ids = ids_of(tokenizer, "hello world")
    stream = ChoiceStream(0, tokenizer, stop=["world!"])
    deltas = feed(stream, ids, size=3)
    assert "".join(d.text for d in deltas) == "hello world"
    assert deltas[-1].finish_reason == "length" and deltas[-1].matched_stop is None
    assert not deltas[-1].abort_upstream
    usage = stream.usage(num_prompt_tokens=7, num_cached_tokens=4)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (7, len(ids), 4)


def test_stop_token_is_reported_by_its_text(tokenizer):
    eos = tokenizer.eos_token_ids[0]
    stream = ChoiceStream(0, tokenizer)
    delta = stream.on_update(
        [*ids_of(tokenizer, "ok"), eos], finish_reason="stop", matched_stop_token_id=eos
    )
    assert (delta.text, delta.finish_reason, delta.matched_stop) == ("ok", "stop", "<|eos|>")
    assert not delta.abort_upstream


def test_stop_string_in_the_last_update_needs_no_abort(tokenizer):
    stream = ChoiceStream(0, tokenizer, stop=["fox"])
    delta = stream.on_update(ids_of(tokenizer, "the quick fox jumps"), finish_reason="length")
    assert (delta.text, delta.finish_reason, delta.matched_stop) == ("the quick ", "stop", "fox")
    assert not delta.abort_upstream


def test_logprobs_carry_token_text_and_raw_bytes(tokenizer):
    ids = ids_of(tokenizer, "😀")
    entries = [TokenLogprobs(token_id=t, logprob=-0.5, top=[(t, -0.5), (0, -3.0)]) for t in ids]
    stream = ChoiceStream(0, tokenizer, logprobs=True)
    delta = stream.on_update(ids, entries, finish_reason="stop")
    assert delta.text == "😀"
    assert b"".join(p.sampled.token_bytes for p in delta.logprobs) == "😀".encode()
    assert all(p.sampled.token == "\ufffd" for p in delta.logprobs)  # partial characters
    assert [t.logprob for t in delta.logprobs[0].top] == [-0.5, -3.0]
    assert delta.logprobs[0].top[1].token == "<|bos|>"


def test_unknown_finish_reason_is_rejected(tokenizer):
    with pytest.raises(InvalidArgument, match="finish_reason"):
        ChoiceStream(0, tokenizer).on_update([1], finish_reason="tired")


def _num_tokens_through(tokenizer, ids, text):
    """The fewest leading tokens whose text holds `text`."""
    return next(k for k in range(len(ids) + 1) if text in tokenizer.decode(ids[:k]))


@pytest.mark.parametrize("size", [1, 3, 100])
def test_min_tokens_holds_back_stop_strings(tokenizer, size):
    ids = ids_of(tokenizer, "ab xx cd xx ef")
    first_stop_end = _num_tokens_through(tokenizer, ids, "ab xx")
    stream = ChoiceStream(0, tokenizer, stop=["xx"], min_tokens=first_stop_end)
    deltas = feed(stream, ids, size=size)
    assert "".join(d.text for d in deltas) == "ab xx cd "
    [final] = [d for d in deltas if d.finish_reason]
    assert (final.finish_reason, final.matched_stop) == ("stop", "xx")


def test_without_min_tokens_the_first_stop_string_ends_the_choice(tokenizer):
    stream = ChoiceStream(0, tokenizer, stop=["xx"])
    deltas = feed(stream, ids_of(tokenizer, "ab xx cd xx ef"))
    assert "".join(d.text for d in deltas) == "ab "


def test_min_tokens_reached_by_the_finish_releases_the_text(tokenizer):
    ids = ids_of(tokenizer, "ab xx cd")
    stream = ChoiceStream(0, tokenizer, stop=["xx"], min_tokens=len(ids))
    deltas = feed(stream, ids, size=2)
    assert "".join(d.text for d in deltas) == "ab xx cd"
    assert deltas[-1].finish_reason == "length" and deltas[-1].matched_stop is None
