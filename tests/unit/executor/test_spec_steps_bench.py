"""bench/spec_steps.py's bound: the steps prompt lookup takes drafting at every match."""

from __future__ import annotations

import importlib

import pytest

A = list(range(10, 20))
PROMPT = A + A  # its last tokens recur: the continuation is the text again


def copy(num_tokens: int, edited: int | None = None) -> list[int]:
    """The prompt's text continued, with the token at offset `edited` of each period
    written as 99 (a token the prompt never has)."""
    return [99 if i % 10 == edited else A[i % 10] for i in range(num_tokens)]


@pytest.mark.parametrize(
    ("k", "edited", "expected"),
    [
        (4, None, (4, 4)),  # 5 tokens a step
        # 10..14 | 15 16, then 99 | 18 (no 2-gram ends in 99) | 19 ("99 18": none) |
        # 10..13 after "18 19" (a 2-token match drafts 4), then 14 | 15 16 99 18, then 19
        (4, 7, (6, 4)),
        # 10..16, then 99 | 18 | 19 | 10..13 (twice the 2-token match), then 14 | 15 16 99 18 19
        (8, 7, (5, 3)),
    ],
)
def test_lookup_steps_count_a_draft_at_every_match(k, edited, expected) -> None:
    bench = importlib.import_module("bench.spec_steps")
    assert bench.lookup_steps(PROMPT, copy(20, edited), k) == expected


def test_an_output_that_never_recurs_takes_a_step_a_token() -> None:
    bench = importlib.import_module("bench.spec_steps")
    assert bench.lookup_steps(PROMPT, list(range(100, 120)), 8) == (20, 1)  # one wrong guess
