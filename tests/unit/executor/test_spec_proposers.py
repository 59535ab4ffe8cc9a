"""Draft proposers, the adaptive draft length and the speculative config."""

from __future__ import annotations

import random

import pytest

from radixmesh.errors import InvalidArgument
from services.executor.core.spec import (
    Draft,
    DraftLength,
    PromptLookup,
    SpeculativeConfig,
    SuffixIndex,
    SuffixProposer,
    accepted_length,
    make_proposer,
)
from services.executor.core.spec.drafting import expand_rows, verify_draft
from services.executor.core.spec.proposers import MAX_WAITING_SEQS, NO_DRAFT


def test_prompt_lookup_continues_the_latest_occurrence_of_the_longest_suffix() -> None:
    lookup = PromptLookup(min_match_len=2, max_match_len=4)
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    draft = lookup.propose(tokens, 3)
    # suffix [2, 3] occurs at 1 and 6; [5, 2, 3] nowhere: the latest 2-gram match wins
    assert (draft.token_ids, draft.match_len) == ([7, 8, 5], 2)
    assert lookup.propose([1, 2, 3, 4, 1, 2, 3], 8).token_ids == [4, 1, 2, 3]
    assert lookup.propose([1, 2, 3, 4], 4).token_ids == []  # nothing recurs
    assert lookup.propose([5, 5], 4).token_ids == []  # shorter than a match can be
    assert lookup.propose([1, 2, 1, 2], 0).token_ids == []


def test_suffix_index_continues_like_an_earlier_sequence_and_forgets_the_oldest() -> None:
    index = SuffixIndex(min_match_len=2, max_match_len=3, max_tokens=12)
    index.add([10, 11, 12, 13, 14, 15])
    assert index.lookup([99, 11, 12], 3).token_ids == [13, 14, 15]
    assert index.lookup([99, 10, 11, 12], 2) == Draft([13, 14], 3)  # the longest match
    index.add([20, 21, 22, 23, 24, 25, 26, 27])  # 14 tokens > 12: the first one leaves
    assert index.num_tokens == 8
    assert index.lookup([11, 12], 3).token_ids == []
    assert index.lookup([22, 23], 2).token_ids == [24, 25]


def test_the_suffix_index_keeps_outputs_with_the_prompt_tail_before_them() -> None:
    index = SuffixIndex(min_match_len=2, max_match_len=3, max_tokens=100)
    prompt, output = [10, 11, 12, 13, 14, 15], [20, 21, 22, 23]
    index.add(prompt + output, num_prompt_tokens=len(prompt))
    assert index.num_tokens == 3 + len(output)  # the prompt's last max_match_len and the output
    assert index.lookup([13, 14, 15], 2).token_ids == [20, 21]  # reaches the output's start
    assert index.lookup([10, 11], 2).token_ids == []  # the prompt's head is not kept
    assert index.lookup([21, 22], 1).token_ids == [23]


def test_ended_sequences_are_indexed_a_bounded_share_a_step() -> None:
    """observe only queues; take_in (after each step) indexes the oldest waiting outputs up
    to its token budget, at least one; past MAX_WAITING_SEQS the oldest waiting is left out."""
    index = SuffixIndex(min_match_len=2, max_match_len=3, max_tokens=10**6)
    outputs = [[100 + 10 * i + j for j in range(6)] for i in range(MAX_WAITING_SEQS + 2)]
    for output in outputs:
        index.defer(output)
    assert index.num_waiting == MAX_WAITING_SEQS and index.num_tokens == 0
    assert index.lookup([100, 101], 2) == NO_DRAFT  # not taken in yet
    index.take_in(max_tokens=12)  # two outputs of 6
    assert index.num_waiting == MAX_WAITING_SEQS - 2 and index.num_tokens == 12
    assert index.lookup([120, 121], 2).token_ids == [122, 123]  # the first kept, in
    assert index.lookup([100, 101], 2) == NO_DRAFT  # the two oldest were left out
    index.take_in(max_tokens=0)  # at least one a step
    assert index.num_waiting == MAX_WAITING_SEQS - 3
    while index.num_waiting:
        index.take_in()
    last = outputs[-1]
    assert index.lookup(last[:2], 2).token_ids == last[2:4]


def test_suffix_proposer_prefers_the_longer_match() -> None:
    proposer = make_proposer(SpeculativeConfig(method="suffix", min_match_len=2, max_match_len=4))
    assert isinstance(proposer, SuffixProposer)
    proposer.observe([1, 2, 3, 4, 5, 6, 7])
    proposer.take_in()  # the executor does after each step
    own = [3, 4, 8, 8, 2, 3, 4]  # own context matches [3, 4] (2), the index [2, 3, 4] (3)
    assert proposer.propose(own, 2).token_ids == [5, 6]
    assert proposer.propose([9, 3, 4, 8, 3, 4], 2).token_ids == [8, 3]  # own: [3, 4] -> 8
    assert make_proposer(SpeculativeConfig()) is None
    assert isinstance(make_proposer(SpeculativeConfig(method="ngram")), PromptLookup)


def test_draft_length_follows_acceptance_and_match_length() -> None:
    length = DraftLength(max_draft_tokens=4)
    assert length.limit(match_len=5) == 4 and length.limit(match_len=1) == 2
    for _ in range(10):
        length.update(4, 0)
    assert length.limit(5) == 1  # rejected drafts shrink it to one token
    for _ in range(10):
        length.update(1, 1)
    assert length.limit(5) == 4


def test_verification_accepts_the_prefix_the_model_would_sample() -> None:
    assert accepted_length([5, 6, 7], [5, 6, 9, 1], 3) == 2
    assert verify_draft([5, 6, 7], [5, 6, 9, 1], 3) == [5, 6, 9]
    assert verify_draft([5, 6, 7], [5, 6, 7, 1], 3) == [5, 6, 7, 1]  # with the bonus token
    assert verify_draft([5, 6, 7], [5, 6, 7, 1], 1) == [5, 6]  # the grammar cut after one
    assert verify_draft([5], [4, 2], 1) == [4]
    rows, lens = expand_rows(["a", "b"], [3, 7], [[1, 2], []])
    assert rows == ["a", None, None, "b"] and lens == [3, 4, 5, 7]


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"method": "eagle"}, "method"),
        ({"max_draft_tokens": 0}, "max_draft_tokens"),
        ({"min_match_len": 0}, "min_match_len"),
        ({"min_match_len": 4, "max_match_len": 3}, "max_match_len"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_suffix_tokens": 0}, "max_suffix_tokens"),
    ],
)
def test_bad_config_names_the_field(fields: dict, name: str) -> None:
    with pytest.raises(InvalidArgument, match=f"speculative.{name}"):
        SpeculativeConfig(**fields)


@pytest.mark.parametrize("seed", range(6))
def test_a_sequences_ngram_index_proposes_what_the_scan_does_as_it_grows(seed: int) -> None:
    """Grown a few tokens at a time (as a sequence is between steps, drafts accepted or
    not), the index's proposal equals the scan's after every growth; a small vocabulary
    so matches of every length occur."""
    rng = random.Random(seed)
    lookup = PromptLookup(min_match_len=2, max_match_len=5)
    tokens = [rng.randrange(6) for _ in range(rng.randint(0, 40))]
    index = lookup.index_for()
    found = 0
    proposed_at = 0
    while len(tokens) < 400:
        k = rng.randint(1, 6)
        scanned = lookup.propose(tokens, k)
        assert lookup.propose(tokens, k, index) == scanned
        found += scanned.match_len > 0
        proposed_at = len(tokens)
        tokens += [rng.randrange(6) for _ in range(rng.randint(1, 5))]
    assert found > 50
    assert index.num_indexed == proposed_at  # indexed up to the tokens it was last given
    shorter = tokens[:30]  # a shorter sequence starts the index again
    assert lookup.propose(shorter, 4, index) == lookup.propose(shorter, 4)


@pytest.mark.parametrize("seed", range(4))
def test_the_packed_index_ignores_matches_off_token_boundaries(seed: int) -> None:
    """Token ids whose bytes repeat shifted (256 is 1 moved a byte up, 65,537 spans both
    halves) make byte matches that start inside a token; the index's proposals still equal
    the scan's, which compares whole tokens."""
    rng = random.Random(200 + seed)
    vocab = [0, 1, 256, 257, 65_536, 65_537, 16_777_216, 16_777_217]
    lookup = PromptLookup(min_match_len=2, max_match_len=5)
    tokens = [rng.choice(vocab) for _ in range(8)]
    index = lookup.index_for()
    while len(tokens) < 300:
        assert lookup.propose(tokens, 4, index) == lookup.propose(tokens, 4)
        tokens.append(rng.choice(vocab))
    # [1, 0] packed (01 00 00 00 00 00 00 00) starts one byte into [256, 0, 0]
    unaligned = [256, 0, 0, 5, 1, 0]
    assert lookup.propose(unaligned, 2) == NO_DRAFT
    assert lookup.propose(unaligned, 2, lookup.index_for()) == NO_DRAFT
    assert lookup.propose([*unaligned, 7, 1, 0], 2, lookup.index_for()).token_ids == [7, 1]


@pytest.mark.parametrize("seed", range(4))
def test_an_index_grown_in_large_steps_proposes_what_the_scan_does(seed: int) -> None:
    """A long prompt registered at once, then growths of one token to a hundred (a probe
    after declined steps catches up on all of them), give the scan's proposal."""
    rng = random.Random(100 + seed)
    lookup = PromptLookup(min_match_len=2, max_match_len=5)
    tokens = [rng.randrange(8) for _ in range(rng.randint(300, 600))]
    index = lookup.index_for()
    for _ in range(12):
        k = rng.randint(1, 6)
        assert lookup.propose(tokens, k, index) == lookup.propose(tokens, k)
        grow = rng.choice([1, 3, 32, rng.randint(33, 120)])
        tokens += [rng.randrange(8) for _ in range(grow)]


@pytest.mark.parametrize("seed", range(3))
def test_the_suffix_index_continues_the_latest_occurrence_among_recent_sequences(
    seed: int,
) -> None:
    rng = random.Random(seed)
    index = SuffixIndex(min_match_len=2, max_match_len=4, max_tokens=10**6)
    seqs = [[rng.randrange(6) for _ in range(rng.randint(40, 400))] for _ in range(5)]
    for seq in seqs:
        index.add(seq)
    found = 0
    for _ in range(200):
        query = [rng.randrange(6) for _ in range(rng.randint(1, 8))]
        expected = Draft([], 0)
        for n in range(min(4, len(query)), 1, -1):  # longest first, then the latest
            hits = [
                (i, end)
                for i, seq in enumerate(seqs)
                for end in range(n, len(seq))
                if seq[end - n : end] == query[-n:]
            ]
            if hits:
                i, end = max(hits)
                expected = Draft(seqs[i][end : end + 3], n)
                break
        assert index.lookup(query, 3) == expected
        found += expected.match_len > 0
    assert found > 100
