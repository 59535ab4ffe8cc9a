from __future__ import annotations

import pytest

from gateway.core.openai import parse_chat_request, parse_completion_request
from gateway.core.prepare import prepare_request, split_choices
from radixmesh.errors import InvalidArgument


def test_chat_request_is_templated_and_max_tokens_resolved(tokenizer):
    request = parse_chat_request({"messages": [{"role": "user", "content": "hello world"}], "n": 1})
    prepared = prepare_request(request, tokenizer, "r1", deadline_unix_ms=123)
    expected = tokenizer.encode_messages(request.input.messages)
    assert list(prepared.prompt_token_ids) == expected
    assert prepared.sampling.max_tokens == tokenizer.max_model_len - len(expected)
    assert (prepared.req_id, prepared.deadline_unix_ms) == ("r1", 123)


def test_completion_token_ids_are_checked(tokenizer):
    request = parse_completion_request({"prompt": [1, 2, tokenizer.vocab_size]})
    with pytest.raises(InvalidArgument, match=r"^prompt\[2\]"):
        prepare_request(request, tokenizer, "r1")


def test_prompt_plus_max_tokens_beyond_context_names_max_tokens(tokenizer):
    request = parse_completion_request({"prompt": "hello world", "max_tokens": 64})
    with pytest.raises(InvalidArgument, match=r"^max_tokens:"):
        prepare_request(request, tokenizer, "r1")


def test_choices_share_the_prompt_and_take_distinct_seeds(tokenizer):
    request = parse_completion_request({"prompt": "hello", "n": 3, "seed": 2**64 - 2})
    choices = split_choices(prepare_request(request, tokenizer, "r1"))
    assert [c.req_id for c in choices] == ["r1/0", "r1/1", "r1/2"]
    assert [c.sampling.seed for c in choices] == [2**64 - 2, 2**64 - 1, 0]
    assert all(
        c.sampling.n == 1 and c.prompt_token_ids == choices[0].prompt_token_ids for c in choices
    )
    unseeded = split_choices(
        prepare_request(parse_completion_request({"prompt": "hi", "n": 2}), tokenizer, "r2")
    )
    assert [c.sampling.seed for c in unseeded] == [None, None]
