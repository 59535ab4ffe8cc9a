from __future__ import annotations

import random

import pytest

from gateway.core.detokenizer import NUM_CONTEXT_TOKENS, IncrementalDetokenizer

TEXTS = [
    "hello world 😀 and 🎉🎉 done",
    "日本語のテキスト, 中文字符 and ქართული",
    "the quick brown fox 👩‍👩‍👧 jumps",
]


def _stream(tokenizer, prompt_ids, output_ids, chunking):
    detok = IncrementalDetokenizer(tokenizer.decode, prompt_ids)
    pieces, i = [], 0
    for size in chunking:
        pieces.append(detok.push(output_ids[i : i + size]))
        i += size
    pieces.append(detok.flush())
    return pieces


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_equals_full_decode(tokenizer, text):
    prompt_ids = tokenizer.encode_prompt("hello")
    output_ids = tokenizer._hf.encode(text, add_special_tokens=False)
    pieces = _stream(tokenizer, prompt_ids, output_ids, [1] * len(output_ids))
    assert "".join(pieces) == tokenizer.decode(output_ids) == text
    # Every emitted piece is complete text: no replacement characters from split bytes.
    assert all("\ufffd" not in p for p in pieces)


def test_split_multibyte_character_is_held_until_complete(tokenizer):
    ids = tokenizer._hf.encode("a😀", add_special_tokens=False)
    emoji_ids = ids[1:]
    assert len(emoji_ids) == 4  # one byte-level token per UTF-8 byte
    detok = IncrementalDetokenizer(tokenizer.decode)
    assert detok.push(ids[:1]) == "a"
    assert [detok.push([t]) for t in emoji_ids] == ["", "", "", "😀"]
    assert detok.num_pending_tokens == 0


def test_random_chunkings_equal_full_decode(tokenizer):
    rng = random.Random(0)
    text = " ".join(TEXTS)
    output_ids = tokenizer._hf.encode(text, add_special_tokens=False)
    for _ in range(20):
        chunking, left = [], len(output_ids)
        while left:
            size = min(left, rng.randint(0, 4))
            chunking.append(size)
            left -= size
        assert "".join(_stream(tokenizer, [], output_ids, chunking)) == text


def test_flush_returns_broken_tail_as_replacement(tokenizer):
    ids = tokenizer._hf.encode("ok😀", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer.decode)
    assert detok.push(ids[:-4]) == "ok"
    assert detok.push(ids[-4:-1]) == ""
    assert detok.flush() == tokenizer.decode(ids[-4:-1])
    assert "\ufffd" in tokenizer.decode(ids[-4:-1])


def test_special_tokens_are_skipped(tokenizer):
    eos = tokenizer.eos_token_ids[0]
    ids = tokenizer._hf.encode("hello", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer.decode)
    assert detok.push(ids) + detok.push([eos]) + detok.flush() == "hello"


def test_decode_window_stays_small(tokenizer):
    """Each step decodes a bounded window, not the whole output so far."""
    output_ids = tokenizer._hf.encode(" ".join(TEXTS) * 10, add_special_tokens=False)
    window_sizes = []

    def decode(ids):
        window_sizes.append(len(ids))
        return tokenizer.decode(ids)

    detok = IncrementalDetokenizer(decode, tokenizer.encode_prompt("hello"))
    text = "".join(detok.push([t]) for t in output_ids) + detok.flush()
    assert text == tokenizer.decode(output_ids)
    assert len(output_ids) > 300
    # Context plus the longest run of tokens inside one character (4 UTF-8 bytes).
    assert max(window_sizes) <= NUM_CONTEXT_TOKENS + 4


class ByteTokenizer:
    """A byte-level vocabulary: each token id stands for a fixed string of bytes."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def decode(self, ids) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


# "é" is C3 A9, "€" is E2 82 AC, "😀" is F0 9F 98 80.
BYTES = ByteTokenizer([b"ab", b"\xc3", b"\xa9", b"\xa9cd", b"\xe2\x82", b"\xac!", b"\xf0\x9f", b"\x98", b"\x80", b"x"])  # fmt: skip


@pytest.mark.parametrize(
    ("prompt_ids", "output_ids"),
    [
        ([0, 1], [2, 9]),  # é split: C3 | A9
        ([0, 1], [3]),  # C3 | A9 "cd" in one token
        ([0, 4], [5, 9]),  # € split: E2 82 | AC "!"
        ([0, 6], [7, 8, 9]),  # 😀 split: F0 9F | 98, 80
        ([0, 6, 7], [8]),  # F0 9F 98 | 80
    ],
)
def test_a_character_split_at_the_prompt_boundary_streams_as_the_output_decoded_alone(
    prompt_ids, output_ids
):
    pieces = _stream(BYTES, prompt_ids, output_ids, [1] * len(output_ids))
    text = "".join(pieces)
    assert text == BYTES.decode(output_ids)  # no byte of the output dropped or repeated
    assert text.startswith("\ufffd")  # the output's leading continuation bytes, alone


def test_the_prompt_context_still_reaches_back_past_a_split_character():
    """Only the trailing tokens that leave a character open are dropped from the context."""
    seen = []

    def decode(ids):
        seen.append(list(ids))
        return BYTES.decode(ids)

    detok = IncrementalDetokenizer(decode, [9, 0, 9, 1])
    assert detok.push([9]) == "x"
    assert seen[-1] == [9, 0, 9, 9]  # context "xabx", then the output's "x"


def test_random_byte_tokens_stream_as_their_decode_whatever_the_prompt():
    rng = random.Random(7)
    for _ in range(300):
        prompt_ids = [rng.randrange(len(BYTES.pieces)) for _ in range(rng.randint(0, 8))]
        output_ids = [rng.randrange(len(BYTES.pieces)) for _ in range(rng.randint(1, 12))]
        chunking, left = [], len(output_ids)
        while left:
            size = min(left, rng.randint(1, 3))
            chunking.append(size)
            left -= size
        text = "".join(_stream(BYTES, prompt_ids, output_ids, chunking))
        assert text == BYTES.decode(output_ids), (prompt_ids, output_ids, chunking)
