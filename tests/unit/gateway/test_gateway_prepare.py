from __future__ import annotations

import pytest

from gateway.core.openai import parse_chat_request, parse_completion_request
from gateway.core.prepare import prepare_request, split_choices
from gateway.core.tokenizer import Tokenizer
from radixmesh.errors import InvalidArgument


def test_chat_request_is_templated_and_runs_to_the_context_end_without_max_tokens(tokenizer):
    """No max_tokens: none is sent, so the scheduler decodes to the end of the context its
    executors serve (which may be below what this gateway was last told)."""
    request = parse_chat_request({"messages": [{"role": "user", "content": "hello world"}], "n": 1})
    prepared = prepare_request(request, tokenizer, "r1", deadline_unix_ms=123)
    expected = tokenizer.encode_messages(request.input.messages)
    assert list(prepared.prompt_token_ids) == expected
    assert prepared.sampling.max_tokens is None
    assert (prepared.req_id, prepared.deadline_unix_ms) == ("r1", 123)


def test_max_tokens_is_checked_against_the_context_the_executors_serve(model_folder):
    """An executor whose KV pool is smaller than the model's context serves less of it; once
    the scheduler says so, a max_tokens that fits the model's own context but not theirs is
    refused naming max_tokens, and the prompt's room is theirs."""
    tokenizer = Tokenizer.from_folder(model_folder, max_model_len=64)
    fits_model = parse_completion_request({"prompt": "hello world", "max_tokens": 40})
    assert prepare_request(fits_model, tokenizer, "r1").sampling.max_tokens == 40
    tokenizer.serve_within(32)
    assert tokenizer.max_model_len == 32
    with pytest.raises(InvalidArgument, match=r"^max_tokens: 40 plus .* context of 32 tokens"):
        prepare_request(fits_model, tokenizer, "r2")
    long_prompt = parse_completion_request({"prompt": [1] * 32, "max_tokens": 1})
    with pytest.raises(InvalidArgument, match=r"^prompt: 32 tokens leave no room"):
        prepare_request(long_prompt, tokenizer, "r3")
    tokenizer.serve_within(4096)  # never past the model's own context
    assert tokenizer.max_model_len == 64
    assert prepare_request(fits_model, tokenizer, "r4").sampling.max_tokens == 40


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
