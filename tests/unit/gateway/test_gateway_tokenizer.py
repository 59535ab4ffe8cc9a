from __future__ import annotations

import re

import pytest

from gateway.core.request import ChatMessage
from gateway.core.tokenizer import Tokenizer, decode_utf8, read_max_model_len
from radixmesh.errors import FailedPrecondition, InvalidArgument


def test_context_length_comes_from_config(tokenizer, model_folder):
    assert tokenizer.max_model_len == read_max_model_len(model_folder) == 64
    assert tokenizer.eos_token_ids == (tokenizer._hf.convert_tokens_to_ids("<|eos|>"),)


def test_chat_template_renders_with_generation_prompt(tokenizer):
    messages = [ChatMessage("system", "be brief"), ChatMessage("user", "hello world")]
    text = tokenizer.render_chat(messages)
    assert text == "<|bos|><|system|>be brief<|eos|><|user|>hello world<|eos|><|assistant|>"
    ids = tokenizer.encode_messages(messages)
    # The template writes BOS itself: exactly one BOS, and the ids decode back to the text.
    bos = tokenizer._hf.bos_token_id
    assert ids.count(bos) == 1 and ids[0] == bos
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_prompt_round_trips_through_decode(tokenizer):
    prompt = "the lazy dog says 日本 😀"
    ids = tokenizer.encode_prompt(prompt)
    assert tokenizer.decode(ids) == prompt
    assert tokenizer.encode_prompt(prompt.encode()) == ids


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ([], "messages"),
        ([ChatMessage("user", "hi"), ChatMessage("wizard", "hi")], "messages[1].role"),
    ],
)
def test_bad_messages_name_the_field(tokenizer, messages, field):
    with pytest.raises(InvalidArgument, match=r"^" + re.escape(field) + ":"):
        tokenizer.encode_messages(messages)


def test_empty_prompt_is_rejected(tokenizer):
    with pytest.raises(InvalidArgument, match=r"^prompt: must not be empty"):
        tokenizer.encode_prompt("")


def test_invalid_utf8_names_field_and_offset(tokenizer):
    with pytest.raises(InvalidArgument, match=r"^prompt: invalid UTF-8 at byte 3"):
        tokenizer.encode_prompt(b"abc\xff\xfe")
    with pytest.raises(InvalidArgument, match=r"^messages\[0\]\.content: invalid UTF-8 at byte 1"):
        decode_utf8(b"a\xe6\x97", "messages[0].content")


def test_prompt_longer_than_context_is_rejected(tokenizer):
    ids = tokenizer.encode_prompt("the quick brown fox " * 40)
    assert len(ids) >= tokenizer.max_model_len
    with pytest.raises(InvalidArgument, match=r"^prompt: .* context of 64 tokens"):
        tokenizer.check_length(len(ids), None)
    with pytest.raises(InvalidArgument, match=r"^max_tokens: 60 plus the prompt's 10 tokens"):
        tokenizer.check_length(10, 60)
    assert tokenizer.check_length(10, None) == 54
    assert tokenizer.check_length(10, 54) == 54


def test_token_ids_are_checked_against_the_vocabulary(tokenizer):
    tokenizer.validate_token_ids([0, tokenizer.vocab_size - 1])
    with pytest.raises(InvalidArgument, match=r"^token_ids\[1\]: .* is not a token id"):
        tokenizer.validate_token_ids([0, tokenizer.vocab_size])
    with pytest.raises(InvalidArgument, match=r"^token_ids: must not be empty"):
        tokenizer.validate_token_ids([])


def test_token_bytes_are_the_raw_bytes_of_split_characters(tokenizer):
    ids = tokenizer._hf.encode("😀", add_special_tokens=False)
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == "😀".encode()
    assert len(ids) > 1  # the emoji is split across byte tokens


def test_model_without_chat_template_refuses_messages(tmp_path, make_model):
    folder = make_model(tmp_path / "plain", chat_template=None)
    plain = Tokenizer.from_folder(folder)
    with pytest.raises(FailedPrecondition, match=r"^messages: .* has no chat template"):
        plain.encode_messages([ChatMessage("user", "hi")])


def test_missing_config_names_model(tmp_path):
    with pytest.raises(InvalidArgument, match=r"^model: .*config.json does not exist"):
        read_max_model_len(tmp_path)
